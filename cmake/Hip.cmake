# The HIP build (LOOM_WITH_HIP=ON, docs/building.md): the library for AMD
# GPUs. The kernel's one source (src/exec/cuda/kernel.cu) is compiled by
# HIP's clang for LOOM_HIP_ARCHS, and the host code calls HIP's runtime by
# CUDA's names (src/misc/gpurt.h).
#
# Clang is called directly, not through hipcc or CMake's HIP language:
# both add -mllvm -amdgpu-early-inline-all=true and
# -amdgpu-function-calls=false, which inline every reduction of every type
# into the one kernel, and clang 15 had not finished that compile after 15
# minutes and 3.8 GB; without them it takes under a minute per
# architecture (docs/decisions.md, "One kernel source").
#
# Sets LOOM_HAVE_HIP, LOOM_HIP_KERNEL_OBJ (the compiled kernel, an object
# file with the code for every architecture, which loom_hip_link_kernel
# links into a target), the interface target
# loom_hip_runtime (HIP's headers, platform macro and libamdhip64) and
# LOOM_HIP_SUMMARY.

set(LOOM_HIP_ARCHS_DEFAULT "gfx90a;gfx942")
set(LOOM_HIP_ARCHS "${LOOM_HIP_ARCHS_DEFAULT}" CACHE STRING
    "AMD GPU architectures of the HIP build (default: MI200 and MI300)")

find_program(LOOM_HIPCONFIG hipconfig PATHS /opt/rocm/bin)
set(hip_root_hint /opt/rocm)
if(LOOM_HIPCONFIG)
  execute_process(COMMAND ${LOOM_HIPCONFIG} --rocmpath OUTPUT_VARIABLE hip_root_hint OUTPUT_STRIP_TRAILING_WHITESPACE
                  ERROR_QUIET)
endif()
find_path(LOOM_HIP_INCLUDE_DIR hip/hip_runtime_api.h HINTS ${hip_root_hint}/include PATHS /opt/rocm/include)
find_library(LOOM_HIP_LIBRARY amdhip64 HINTS ${hip_root_hint}/lib PATHS /opt/rocm/lib)
# ROCm's own clang where ROCm is installed; else the newest versioned clang
# (Debian's hipcc uses clang 15, while its plain clang++ may be another).
find_program(LOOM_HIP_CLANG NAMES clang++ PATHS ${hip_root_hint}/llvm/bin /opt/rocm/llvm/bin NO_DEFAULT_PATH)
if(NOT LOOM_HIP_CLANG)
  find_program(LOOM_HIP_CLANG NAMES clang++-17 clang++-16 clang++-15 clang++)
endif()
find_path(LOOM_HIP_DEVICE_LIBS ockl.bc
          HINTS ${hip_root_hint}/amdgcn/bitcode ${hip_root_hint}/lib/amdgcn/bitcode
          PATHS /opt/rocm/amdgcn/bitcode /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/amdgcn/bitcode /usr/lib/amdgcn/bitcode)
foreach(what INCLUDE_DIR LIBRARY CLANG DEVICE_LIBS)
  if(NOT LOOM_HIP_${what})
    message(FATAL_ERROR "LOOM_WITH_HIP=ON, but HIP's ${what} was not found (headers hip/hip_runtime_api.h, libamdhip64, "
                        "HIP's clang, the device libraries' ockl.bc). On Debian 12: apt-get install hipcc; with ROCm: "
                        "install it under /opt/rocm or put hipconfig on PATH.")
  endif()
endforeach()
get_filename_component(LOOM_HIP_ROOT ${LOOM_HIP_INCLUDE_DIR} DIRECTORY)
file(STRINGS ${LOOM_HIP_INCLUDE_DIR}/hip/hip_version.h hip_version_lines REGEX "#define HIP_VERSION_(MAJOR|MINOR|PATCH) ")
set(LOOM_HIP_VERSION "")
foreach(part MAJOR MINOR PATCH)
  string(REGEX MATCH "HIP_VERSION_${part} ([0-9]+)" m "${hip_version_lines}")
  list(APPEND LOOM_HIP_VERSION ${CMAKE_MATCH_1})
endforeach()
string(REPLACE ";" "." LOOM_HIP_VERSION "${LOOM_HIP_VERSION}")

set(hip_flags -x hip --rocm-path=${LOOM_HIP_ROOT} --rocm-device-lib-path=${LOOM_HIP_DEVICE_LIBS})

# Each architecture this clang can target; one it cannot is dropped from
# the default list with a note (clang 15, Debian's, predates gfx942) and
# fails the configuration when asked for by name.
set(probe ${CMAKE_BINARY_DIR}/hip/probe.hip)
file(WRITE ${probe} "__attribute__((global)) void probe_kernel(int *p) { *p = 1; }\n")
set(LOOM_HIP_ARCHS_BUILT "")
set(LOOM_HIP_ARCHS_DROPPED "")
foreach(arch ${LOOM_HIP_ARCHS})
  execute_process(COMMAND ${LOOM_HIP_CLANG} ${hip_flags} -nogpuinc --cuda-device-only --offload-arch=${arch} -c ${probe}
                          -o ${CMAKE_BINARY_DIR}/hip/probe.o
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(rc EQUAL 0)
    list(APPEND LOOM_HIP_ARCHS_BUILT ${arch})
  elseif(LOOM_HIP_ARCHS STREQUAL LOOM_HIP_ARCHS_DEFAULT)
    list(APPEND LOOM_HIP_ARCHS_DROPPED ${arch})
  else()
    message(FATAL_ERROR "LOOM_HIP_ARCHS: ${LOOM_HIP_CLANG} cannot compile for ${arch}: ${err}")
  endif()
endforeach()
if(NOT LOOM_HIP_ARCHS_BUILT)
  message(FATAL_ERROR "LOOM_HIP_ARCHS: ${LOOM_HIP_CLANG} compiles for none of ${LOOM_HIP_ARCHS}")
endif()

set(kernel_src ${CMAKE_SOURCE_DIR}/src/exec/cuda/kernel.cu)
set(LOOM_HIP_KERNEL_OBJ ${CMAKE_BINARY_DIR}/hip/kernel.o)
string(REPLACE ";" ", " archs_said "${LOOM_HIP_ARCHS_BUILT}")
set(arch_flags "")
foreach(arch ${LOOM_HIP_ARCHS_BUILT})
  list(APPEND arch_flags --offload-arch=${arch})
endforeach()
add_custom_command(
  OUTPUT ${LOOM_HIP_KERNEL_OBJ}
  COMMAND ${LOOM_HIP_CLANG} ${hip_flags} ${arch_flags} -std=c++17 -O2 -ffp-contract=off -fPIC -fvisibility=hidden
          -D_GNU_SOURCE -DLOOM_HIP=1 -DLOOM_HAVE_CUDA=1 -I${CMAKE_SOURCE_DIR}/src -I${CMAKE_SOURCE_DIR}/include
          -MD -MF ${LOOM_HIP_KERNEL_OBJ}.d -c ${kernel_src} -o ${LOOM_HIP_KERNEL_OBJ}
  DEPENDS ${kernel_src}
  DEPFILE ${LOOM_HIP_KERNEL_OBJ}.d
  COMMENT "Compiling the kernel for ${archs_said} (HIP)"
  VERBATIM)
# One target builds it and the libraries link the object: listed as a
# source of each, Makefiles would give each its own copy of the rule, and
# a parallel build would compile it several times at once.
add_custom_target(loom_hip_kernel DEPENDS ${LOOM_HIP_KERNEL_OBJ})
function(loom_hip_link_kernel target scope)
  add_dependencies(${target} loom_hip_kernel)
  target_link_libraries(${target} ${scope} ${LOOM_HIP_KERNEL_OBJ})
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${LOOM_HIP_KERNEL_OBJ})
endfunction()

add_library(loom_hip_runtime INTERFACE)
target_include_directories(loom_hip_runtime INTERFACE ${LOOM_HIP_INCLUDE_DIR})
target_compile_definitions(loom_hip_runtime INTERFACE LOOM_HIP=1 __HIP_PLATFORM_AMD__=1)
target_link_libraries(loom_hip_runtime INTERFACE ${LOOM_HIP_LIBRARY})

set(LOOM_HAVE_HIP 1)
set(LOOM_HIP_SUMMARY "HIP ${LOOM_HIP_VERSION} (${LOOM_HIP_CLANG}), architectures ${archs_said}")
if(LOOM_HIP_ARCHS_DROPPED)
  string(APPEND LOOM_HIP_SUMMARY "; left out: ${LOOM_HIP_ARCHS_DROPPED} (this clang cannot compile for them)")
endif()
