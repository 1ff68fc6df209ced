# The library's sources, floor by floor from the ground (src/LAYERS has
# the floors; docs/architecture.md what each is for). Listed, not globbed:
# a file added to src/ is built once it is named here.
set(LOOM_SOURCES
  # services
  src/misc/cudamem.c src/misc/debug.c src/misc/errors.c src/misc/param.c src/misc/place.c src/misc/socket.c
  src/misc/utils.c
  # the vocabulary of a call
  src/common/coll.c src/common/dtype.c src/common/path_type.c
  # bootstrap
  src/bootstrap/bootstrap.c src/bootstrap/bootstrap_conn.c src/bootstrap/bootstrap_id.c src/bootstrap/bootstrap_join.c
  src/bootstrap/bootstrap_root.c src/bootstrap/bootstrap_wire.c
  # the communicator's struct and primitives
  src/comm/comm.c src/comm/comm_peers.c src/comm/comm_slots.c
  # transports and the network plugins
  src/transport/transport.c src/transport/p2p.c src/transport/shm.c src/transport/shm_seg.c src/transport/shm_arena.c
  src/transport/net/net.c src/transport/net/net_gdr.c
  src/transport/net/socket/net_socket.c src/transport/net/socket/net_socket_stream.c
  src/transport/net/socket/net_socket_thread.c
  src/transport/net/ib/net_ib.c src/transport/net/ib/net_ib_conn.c src/transport/net/ib/net_ib_hca.c
  src/transport/net/ib/net_ib_verbs.c
  src/transport/net/ext/net_ext.c src/transport/net/ext/net_ext_v8.c src/transport/net/ext/net_ext_v9.c
  src/transport/net/ext/net_ext_v10.c
  # execution (the CUDA executor is added where the build has CUDA)
  src/exec/host_exec.c src/exec/flat.c src/exec/copy.c src/exec/reduce.c src/exec/sched.c src/exec/slot.c
  # topology
  src/topology/discover.c src/topology/graph.c src/topology/nvml.c src/topology/search.c src/topology/topo.c
  src/topology/topo_xml.c src/topology/xml.c
  # algorithms
  src/algorithms/rd.c src/algorithms/ring.c src/algorithms/schedule.c src/algorithms/tree.c src/algorithms/tuner.c
  # the API floor
  src/init.c src/comm_config.c src/collectives.c src/group.c src/shrink.c src/comm_api.c src/comm_life.c
  src/comm_grow.c src/comm_suspend.c src/comm_rma.c src/comm_rma_net.c src/comm_mem.c src/mem_alloc.c src/device_api.c src/async.c src/enqueue.c src/plan.c
  src/call_check.c src/status.c src/status_page.c src/param_api.c)
# The GPU executor's host half, for CUDA and HIP alike; the kernel is
# compiled by nvcc in the CUDA build, by HIP's clang in the HIP build
# (cmake/Hip.cmake).
set(LOOM_GPU_HOST_SOURCES src/exec/cuda/cuda_exec.c src/exec/cuda/cuda_launch.c)
set(LOOM_CUDA_SOURCES ${LOOM_GPU_HOST_SOURCES} src/exec/cuda/kernel.cu)
list(TRANSFORM LOOM_SOURCES PREPEND ${CMAKE_SOURCE_DIR}/)
list(TRANSFORM LOOM_GPU_HOST_SOURCES PREPEND ${CMAKE_SOURCE_DIR}/)
list(TRANSFORM LOOM_CUDA_SOURCES PREPEND ${CMAKE_SOURCE_DIR}/)
