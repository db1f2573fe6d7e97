# Compile options shared by every target, carried by the interface library rf_options.
add_library(rf_options INTERFACE)
target_compile_options(rf_options INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter)
if(ROCMFORGE_WERROR)
  target_compile_options(rf_options INTERFACE -Werror)
endif()
if(ROCMFORGE_NATIVE)
  target_compile_options(rf_options INTERFACE -march=native)
endif()
if(ROCMFORGE_SANITIZE)
  target_compile_options(rf_options INTERFACE -fsanitize=address,undefined -fno-sanitize-recover=undefined
                                              -fno-omit-frame-pointer)
  target_link_options(rf_options INTERFACE -fsanitize=address,undefined)
endif()
if(ROCMFORGE_FUZZ)
  target_compile_options(rf_options INTERFACE -fsanitize=fuzzer-no-link)
endif()
target_compile_definitions(rf_options INTERFACE
  ROCMFORGE_VERSION="${PROJECT_VERSION}"
  ROCMFORGE_BUILD_TYPE="${CMAKE_BUILD_TYPE}")
