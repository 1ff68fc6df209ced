# The HIP build's second name: librccl.so.1, what ROCm builds of PyTorch,
# JAX and others load, made from the same objects as libnccl.so.2 and
# exporting the same names (RCCL's own among them: ncclAllToAll,
# ncclAllToAllv), with RCCL's header installed as <rccl/rccl.h>.
add_library(rccl SHARED $<TARGET_OBJECTS:loom_objs>)
loom_hip_link_kernel(rccl PRIVATE)
set_target_properties(rccl PROPERTIES
  VERSION 1.0
  SOVERSION 1
  LINK_DEPENDS ${CMAKE_SOURCE_DIR}/src/libnccl.map)
target_link_options(rccl PRIVATE -Wl,--version-script=${CMAKE_SOURCE_DIR}/src/libnccl.map -Wl,--no-undefined)
target_link_libraries(rccl PRIVATE ${LOOM_LINK_LIBS})
target_include_directories(rccl PUBLIC
  $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
install(TARGETS rccl LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/rccl/rccl.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/rccl)
