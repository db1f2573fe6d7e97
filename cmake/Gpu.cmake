# Resolves ROCMFORGE_GPU to the backend that will be built. `auto` picks what is installed and falls back to
# off, so a machine without nvcc or hipcc still configures.
#
# One source set, src/backend/gpu/*.cu (kernels) and *.cpp (host code), builds for both vendors:
#   cuda: the .cu files are CUDA, compiled by nvcc for CMAKE_CUDA_ARCHITECTURES (default 80;90); cudart is
#         linked statically, cuBLAS opened at run time by the first prompt GEMM.
#   hip:  the .cu files are compiled by hipcc as HIP (-x hip) for ROCMFORGE_HIP_ARCHITECTURES (default gfx90a
#         and gfx1030, plus gfx1100 and gfx942 where the toolchain knows them), through custom commands:
#         the CMake HIP language of CMake < 3.28 cannot find Debian's ROCm layout. hipBLAS is linked where
#         CMake finds it.
set(ROCMFORGE_GPU_BACKEND off)
find_program(ROCMFORGE_HIPCC hipcc)
if(ROCMFORGE_GPU STREQUAL "auto")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(ROCMFORGE_GPU_BACKEND cuda)
  elseif(ROCMFORGE_HIPCC)
    set(ROCMFORGE_GPU_BACKEND hip)
  endif()
elseif(ROCMFORGE_GPU MATCHES "^(cuda|hip|off)$")
  set(ROCMFORGE_GPU_BACKEND ${ROCMFORGE_GPU})
else()
  message(FATAL_ERROR "ROCMFORGE_GPU must be auto, cuda, hip or off (got '${ROCMFORGE_GPU}')")
endif()
message(STATUS "ROCmForge GPU backend: ${ROCMFORGE_GPU_BACKEND}")
target_compile_definitions(rf_options INTERFACE ROCMFORGE_GPU_BACKEND="${ROCMFORGE_GPU_BACKEND}")
if(ROCMFORGE_GPU_BACKEND STREQUAL "off")
  target_compile_definitions(rf_options INTERFACE ROCMFORGE_HAVE_GPU=0)
else()
  target_compile_definitions(rf_options INTERFACE ROCMFORGE_HAVE_GPU=1)
endif()

if(ROCMFORGE_GPU_BACKEND STREQUAL "cuda")
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # CMake 3.25 does not know nvcc 13's C++20 flag; CUDA sources take the project's C++ standard.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
elseif(ROCMFORGE_GPU_BACKEND STREQUAL "hip")
  if(NOT ROCMFORGE_HIPCC)
    message(FATAL_ERROR "ROCMFORGE_GPU=hip needs hipcc (Debian: apt-get install hipcc libamdhip64-dev)")
  endif()
  find_package(hip REQUIRED CONFIG PATHS /opt/rocm /usr/lib/x86_64-linux-gnu/cmake/hip)
  if(NOT DEFINED ROCMFORGE_HIP_ARCHITECTURES)
    set(ROCMFORGE_HIP_ARCHITECTURES gfx90a gfx1030)
    # Newer targets only where this hipcc can compile for them (ROCm 5.2's clang 15 has gfx1100, not gfx942).
    set(probe ${CMAKE_BINARY_DIR}/hip_arch_probe.cpp)
    file(WRITE ${probe} "__global__ void probe() {}\n")
    foreach(arch gfx1100 gfx942)
      execute_process(COMMAND ${ROCMFORGE_HIPCC} -x hip --offload-arch=${arch} -c ${probe} -o ${probe}.o
                      RESULT_VARIABLE status OUTPUT_QUIET ERROR_QUIET)
      if(status EQUAL 0)
        list(APPEND ROCMFORGE_HIP_ARCHITECTURES ${arch})
      endif()
    endforeach()
    set(ROCMFORGE_HIP_ARCHITECTURES ${ROCMFORGE_HIP_ARCHITECTURES} CACHE STRING "AMD GPU targets")
  endif()
  message(STATUS "ROCmForge HIP targets: ${ROCMFORGE_HIP_ARCHITECTURES}")
endif()

# The GPU backend's library, rf_backend_gpu, from src/backend/gpu; added to the module list like the others.
function(rocmforge_gpu_module)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  set(dir ${CMAKE_SOURCE_DIR}/src/backend/gpu)
  file(GLOB host_sources CONFIGURE_DEPENDS ${dir}/*.cpp)
  file(GLOB kernel_sources CONFIGURE_DEPENDS ${dir}/*.cu)
  if(ROCMFORGE_GPU_BACKEND STREQUAL "cuda")
    add_library(rf_backend_gpu STATIC ${host_sources} ${kernel_sources})
    target_compile_definitions(rf_backend_gpu PUBLIC ROCMFORGE_GPU_CUDA)
    target_compile_options(rf_backend_gpu PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra>)
    # cuBLAS is opened at run time (see products.cpp); only its headers are needed here.
    target_link_libraries(rf_backend_gpu PUBLIC CUDA::cudart_static ${CMAKE_DL_LIBS})
  else()
    # hipcc compiles each kernel file to an object with its header dependencies (depfile, for Ninja and Make).
    # The objects' folder is made at configure time: Ninja makes an output's folder itself, Unix Makefiles do
    # not, and hipcc cannot open its -MF file in a missing one.
    set(object_dir ${CMAKE_CURRENT_BINARY_DIR}/rf_backend_gpu_hip)
    file(MAKE_DIRECTORY ${object_dir})
    set(objects)
    set(arch_flags)
    foreach(arch ${ROCMFORGE_HIP_ARCHITECTURES})
      list(APPEND arch_flags --offload-arch=${arch})
    endforeach()
    set(config_flags -O3)
    if(CMAKE_BUILD_TYPE STREQUAL "Debug")
      set(config_flags -O0 -g)
    endif()
    foreach(source ${kernel_sources})
      get_filename_component(name ${source} NAME)
      set(object ${object_dir}/${name}.o)
      add_custom_command(
        OUTPUT ${object}
        COMMAND ${ROCMFORGE_HIPCC} -x hip -std=c++20 -fPIC ${config_flags} ${arch_flags} -DROCMFORGE_GPU_HIP
                -I${CMAKE_SOURCE_DIR}/src -Wall -Wextra -MD -MF ${object}.d -c ${source} -o ${object}
        DEPENDS ${source}
        DEPFILE ${object}.d
        COMMENT "hipcc ${name}"
        VERBATIM)
      list(APPEND objects ${object})
    endforeach()
    add_library(rf_backend_gpu STATIC ${host_sources} ${objects})
    target_compile_definitions(rf_backend_gpu PUBLIC ROCMFORGE_GPU_HIP)
    target_link_libraries(rf_backend_gpu PUBLIC hip::host)
    # Prompt GEMMs through hipBLAS where this ROCm has it (Debian's ROCm 5.2 has not: products.h says what runs
    # instead). -DCMAKE_DISABLE_FIND_PACKAGE_hipblas=ON leaves it out.
    find_package(hipblas CONFIG QUIET PATHS /opt/rocm)
    if(hipblas_FOUND)
      target_compile_definitions(rf_backend_gpu PUBLIC ROCMFORGE_HIPBLAS)
      target_link_libraries(rf_backend_gpu PUBLIC roc::hipblas)
      message(STATUS "ROCmForge prompt GEMMs: hipBLAS ${hipblas_VERSION}")
    else()
      message(STATUS "ROCmForge prompt GEMMs: matrix-vector passes (no hipBLAS found)")
    endif()
  endif()
  target_include_directories(rf_backend_gpu PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(rf_backend_gpu PUBLIC rf_options ${ARG_DEPS})
  set_property(GLOBAL APPEND PROPERTY ROCMFORGE_MODULES rf_backend_gpu)
endfunction()
