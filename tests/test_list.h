/*
 * Every test, in one place. UNIT_TEST runs against the internal static
 * library (parsers, kernels, schedules); TEST against libnccl.so like a
 * user program. The number is the time limit in seconds: the runner kills
 * the test and all its ranks when it passes.
 */
UNIT_TEST(unit_param, 30)
UNIT_TEST(unit_ifname, 30)
UNIT_TEST(unit_schedule, 60)
UNIT_TEST(unit_dtype_basic, 30)
UNIT_TEST(unit_dtype_half, 30)
UNIT_TEST(unit_dtype_bf16, 30)
UNIT_TEST(unit_dtype_fp8, 30)
UNIT_TEST(unit_reduce_convert, 30)
UNIT_TEST(unit_reduce_all, 30)
UNIT_TEST(unit_reduce_copy, 30)
UNIT_TEST(unit_reduce_alias, 30)

TEST(smoke_allreduce_2, 60)
TEST(coll_shm_1, 300)
TEST(coll_shm_2, 600)
TEST(coll_shm_3, 600)
TEST(coll_shm_4, 600)
TEST(coll_shm_8, 900)
TEST(coll_socket_2, 600)
TEST(coll_socket_3, 600)
TEST(coll_socket_4, 600)
TEST(coll_socket_8, 900)
