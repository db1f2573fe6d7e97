# Compile options shared by every target, carried by the interface library rf_options.
add_library(rf_options INTERFACE)
# Host-compiler flags only: nvcc and hipcc take their own (see cmake/Gpu.cmake).
set(host "$<COMPILE_LANGUAGE:CXX,C>")
target_compile_options(rf_options INTERFACE "$<${host}:-Wall;-Wextra;-Wpedantic;-Wshadow;-Wno-unused-parameter>")
# GCC 12 reports impossible overlaps in inlined std::string concatenation at -O2 and above (GCC bug 105329).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(rf_options INTERFACE "$<${host}:-Wno-restrict>")
endif()
if(ROCMFORGE_WERROR)
  target_compile_options(rf_options INTERFACE $<${host}:-Werror>)
endif()
if(ROCMFORGE_MARCH)
  target_compile_options(rf_options INTERFACE $<${host}:-march=${ROCMFORGE_MARCH}>)
endif()
if(ROCMFORGE_SANITIZE)
  target_compile_options(rf_options INTERFACE
    "$<${host}:-fsanitize=address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer>")
  target_link_options(rf_options INTERFACE -fsanitize=address,undefined)
endif()
if(ROCMFORGE_FUZZ)
  target_compile_options(rf_options INTERFACE $<${host}:-fsanitize=fuzzer-no-link>)
endif()
target_compile_definitions(rf_options INTERFACE
  ROCMFORGE_VERSION="${PROJECT_VERSION}"
  ROCMFORGE_BUILD_TYPE="${CMAKE_BUILD_TYPE}")
