# The CUDA emulation (docs/emulation.md): the kernel's own source and all
# of Loom's host code run on the CPU, against a CUDA runtime of our own.
# Built where the CUDA toolkit is (the kernel needs its fp16/bf16/fp8
# headers); the library it makes is for tests only and is never installed.
option(LOOM_EMU "Build the CPU emulation of the CUDA path (the tests labelled emu)" ON)
set(LOOM_HAVE_EMU 0)
if(LOOM_HAVE_CUDA AND LOOM_EMU)
  set(LOOM_HAVE_EMU 1)
  enable_language(CXX)
  set(EMU_DIR ${CMAKE_SOURCE_DIR}/src/exec/cuda/emu)
  # The runtime: libcudart's API on the CPU, one copy per process, shared by
  # the library and the test programs (they pass streams to each other).
  add_library(loom_cudart_emu SHARED ${EMU_DIR}/emu_runtime.cpp ${EMU_DIR}/emu_graph.cpp ${EMU_DIR}/emu_grid.cpp)
  set_target_properties(loom_cudart_emu PROPERTIES OUTPUT_NAME loom-cudart-emu
                                                   LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/emu)
  target_include_directories(loom_cudart_emu PRIVATE ${CMAKE_SOURCE_DIR}/src PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_features(loom_cudart_emu PRIVATE cxx_std_17)
  target_compile_options(loom_cudart_emu PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_link_libraries(loom_cudart_emu PRIVATE Threads::Threads)
  target_link_options(loom_cudart_emu PRIVATE -Wl,--no-undefined)

  # libnccl.so.2 of the emulated build: the same objects as the real one,
  # but kernel.cu compiled by the host compiler through the kernel shim.
  # -ffp-contract=off keeps every a + b * s two rounded operations, as the
  # GPU's __fadd_rn / __fmul_rn are.
  add_library(nccl_emu SHARED $<FILTER:$<TARGET_OBJECTS:loom_objs>,EXCLUDE,kernel\\.cu\\.o$>
                              ${EMU_DIR}/kernel_emu.cpp)
  set_target_properties(nccl_emu PROPERTIES OUTPUT_NAME nccl VERSION ${LOOM_NCCL_VERSION} SOVERSION 2
                                            LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/emu
                                            LINK_DEPENDS ${CMAKE_SOURCE_DIR}/src/libnccl.map)
  target_compile_features(nccl_emu PRIVATE cxx_std_17)
  target_compile_options(nccl_emu PRIVATE -ffp-contract=off -fvisibility=hidden)
  target_compile_definitions(nccl_emu PRIVATE LOOM_CUDA_EMU=1 LOOM_HAVE_CUDA=1 _GNU_SOURCE)
  target_include_directories(nccl_emu PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/include
                                              ${CUDAToolkit_INCLUDE_DIRS})
  target_link_options(nccl_emu PRIVATE -Wl,--version-script=${CMAKE_SOURCE_DIR}/src/libnccl.map -Wl,--no-undefined)
  set(EMU_LINK_LIBS ${LOOM_LINK_LIBS})
  list(REMOVE_ITEM EMU_LINK_LIBS CUDA::cudart_static)
  target_link_libraries(nccl_emu PRIVATE ${EMU_LINK_LIBS} loom_cudart_emu)
  target_include_directories(nccl_emu PUBLIC $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>)
endif()
