# Sanitizer builds: -DLOOM_SANITIZE=address (AddressSanitizer with
# UndefinedBehaviorSanitizer) or -DLOOM_SANITIZE=thread (ThreadSanitizer).
# Included from the top-level CMakeLists.txt before any target is made, so
# the flags reach everything the build makes: the library, the tools, the
# perf/ benchmarks, the tests and the test plugins and doubles they load.
# The flags go to C and C++ only: nvcc never sees them, and the real CUDA
# path is not checked (the sanitizers do not cover device code and the CUDA
# runtime is not built for them). ASan builds turn CUDA off. TSan builds
# keep it where LOOM_WITH_CUDA allows, for the CUDA emulation
# (src/exec/cuda/emu/, docs/emulation.md): there the kernel's own source,
# its grid runner and its runtime are host C++ built with these flags, so
# the kernel's fibers, the stream threads, the proxy thread and the peers
# of one process are all instrumented (the grid runner announces its
# fibers to TSan). .ci/sanitize configures, builds and runs one variant on
# the tests tests/sanitize.txt names for it.
set(LOOM_SANITIZE "" CACHE STRING "Sanitizer build: address (ASan+UBSan), thread (TSan) or empty for none")
set_property(CACHE LOOM_SANITIZE PROPERTY STRINGS "" address thread)

if(LOOM_SANITIZE STREQUAL "")
  return()
elseif(LOOM_SANITIZE STREQUAL "address")
  set(LOOM_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
elseif(LOOM_SANITIZE STREQUAL "thread")
  set(LOOM_SANITIZE_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
  # The reduction loops' target_clones resolvers (src/exec/reduce.c) run
  # while the loader relocates libnccl.so, before the TSan runtime is up;
  # instrumented, they crash every program at start. TSan builds use the
  # plain loops.
  add_compile_definitions(LOOM_NO_TARGET_CLONES=1)
else()
  message(FATAL_ERROR "LOOM_SANITIZE=${LOOM_SANITIZE}: use address, thread or leave it empty")
endif()
if(LOOM_FUZZ)
  message(FATAL_ERROR "LOOM_SANITIZE and LOOM_FUZZ go in separate builds (tests/fuzz builds its own sanitized copy)")
endif()

# A normal variable wins over option(LOOM_WITH_CUDA ...) (policy CMP0077).
if(LOOM_SANITIZE STREQUAL "address")
  if(LOOM_WITH_CUDA)
    message(STATUS "LOOM_SANITIZE=${LOOM_SANITIZE}: building without CUDA")
  endif()
  set(LOOM_WITH_CUDA OFF)
endif()

# C and C++ only (the emulation's kernel_emu.cpp, emu_grid.cpp and
# emu_runtime.cpp are C++): nvcc rejects -fsanitize, and a CUDA device
# link step would be nvcc's, so the link flags go to the host link only
# (HOST_LINK splits its argument at commas: they are spelled $<COMMA>).
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${LOOM_SANITIZE_FLAGS}>")
string(REPLACE "," "$<COMMA>" LOOM_SANITIZE_LINK_FLAGS "${LOOM_SANITIZE_FLAGS}")
add_link_options("$<HOST_LINK:${LOOM_SANITIZE_LINK_FLAGS}>")

# hwloc's PCI plugin (hwloc_pci.so) loads libpciaccess, whose global state
# (pci_sys) hwloc never frees; both are dlclose'd with the last topology,
# and LeakSanitizer then reports that state as leaked from an unknown
# module, which no suppression can name. Linking libpciaccess into every
# binary keeps it resident, so the state stays reachable: no report.
if(LOOM_SANITIZE STREQUAL "address")
  find_library(LOOM_PCIACCESS_LIBRARY NAMES libpciaccess.so.0 pciaccess)
  if(LOOM_PCIACCESS_LIBRARY)
    add_link_options(LINKER:--push-state,--no-as-needed ${LOOM_PCIACCESS_LIBRARY} LINKER:--pop-state)
  endif()
endif()

# The runtime options every test run gets (ctest reads this file when it
# loads the build's tests); a variable already in the environment wins.
#  - verify_asan_link_order=0: tests preload libraries (tests/mpi_liar.c)
#    ahead of the ASan runtime; the runtime still comes before libnccl.
#  - halt_on_error/exitcode: a report fails the rank that saw it and so
#    the test (ranks leave with _exit, after which TSan would otherwise
#    only change the status).
set(LOOM_SANITIZE_ENV "${CMAKE_BINARY_DIR}/sanitize_env.cmake")
file(WRITE ${LOOM_SANITIZE_ENV}
  "# Made by cmake/Sanitize.cmake: the sanitizer runtimes' options for ctest.\n"
  "if(NOT DEFINED ENV{ASAN_OPTIONS})\n"
  "  set(ENV{ASAN_OPTIONS} \"verify_asan_link_order=0:detect_leaks=1:abort_on_error=0:exitcode=86\")\n"
  "endif()\n"
  "if(NOT DEFINED ENV{UBSAN_OPTIONS})\n"
  "  set(ENV{UBSAN_OPTIONS} \"print_stacktrace=1:halt_on_error=1:exitcode=87\")\n"
  "endif()\n"
  "if(NOT DEFINED ENV{TSAN_OPTIONS})\n"
  "  set(ENV{TSAN_OPTIONS} \"halt_on_error=1:exitcode=88:second_deadlock_stack=1:suppressions=${CMAKE_SOURCE_DIR}/tests/tsan.supp\")\n"
  "endif()\n")
set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY TEST_INCLUDE_FILES ${LOOM_SANITIZE_ENV})
message(STATUS "LOOM_SANITIZE=${LOOM_SANITIZE}: ${LOOM_SANITIZE_FLAGS}")
