/* NCCL_IB_HCA's syntax: what each expression selects, and the sentence a
 * malformed one gets. */
#include <string.h>

#include "core.h"
#include "test.h"
#include "transport/net/ib/net_ib.h"

static int sel(const char *spec, const char *dev, int port) {
  struct ib_hca_filter f;
  ASSERT_MSG(ib_hca_parse(spec, &f) == ncclSuccess, "\"%s\": %s", spec, err_thread_last());
  return ib_hca_match(&f, dev, port);
}

static void refused(const char *spec, const char *why) {
  struct ib_hca_filter f;
  ncclResult_t r = ib_hca_parse(spec, &f);
  ASSERT_MSG(r == ncclInvalidArgument, "\"%s\" was accepted", spec);
  const char *msg = err_thread_last();
  ASSERT_MSG(strstr(msg, "NCCL_IB_HCA=") && strstr(msg, spec) && strstr(msg, why), "\"%s\": %s", spec, msg);
}

TEST_IMPL(unit_ib_hca) {
  /* Empty: everything. */
  ASSERT(sel("", "mlx5_0", 1));
  ASSERT(sel("   ", "anything", 7));
  /* Prefixes, with and without ports. */
  ASSERT(sel("mlx5", "mlx5_0", 1));
  ASSERT(sel("mlx5", "mlx5_10", 2));
  ASSERT(!sel("mlx5", "mlx4_0", 1));
  ASSERT(sel("mlx5_0:1,mlx5_1", "mlx5_0", 1));
  ASSERT(!sel("mlx5_0:1,mlx5_1", "mlx5_0", 2));
  ASSERT(sel("mlx5_0:1,mlx5_1", "mlx5_1", 2));
  ASSERT(sel("mlx5_0:1,mlx5_1", "mlx5_10", 1)); /* a prefix of mlx5_10 */
  ASSERT(sel(" mlx5_0 , mlx5_2:2 ", "mlx5_2", 2));
  /* Exact names. */
  ASSERT(sel("=mlx5_1", "mlx5_1", 1));
  ASSERT(!sel("=mlx5_1", "mlx5_10", 1));
  ASSERT(sel("=mlx5_1:2,mlx5_3", "mlx5_3", 1));
  ASSERT(!sel("=mlx5_1:2,mlx5_3", "mlx5_1", 1));
  /* Exclusions. */
  ASSERT(!sel("^mlx5_1", "mlx5_1", 1));
  ASSERT(!sel("^mlx5_1", "mlx5_10", 1));
  ASSERT(sel("^mlx5_1", "mlx5_0", 1));
  ASSERT(!sel("^=mlx5_1,mlx5_4", "mlx5_4", 1));
  ASSERT(sel("^=mlx5_1,mlx5_4", "mlx5_10", 1));
  ASSERT(!sel("^mlx5_0:2", "mlx5_0", 2));
  ASSERT(sel("^mlx5_0:2", "mlx5_0", 1));
  /* 32 items are fine. */
  char many[1024] = "";
  for (int i = 0; i < 32; i++)
    snprintf(many + strlen(many), sizeof many - strlen(many), "%sdev%d", i ? "," : "", i);
  ASSERT(sel(many, "dev31", 1));
  ASSERT(!sel(many, "eth0", 1));

  refused("^", "no device after ^ or =");
  refused("=", "no device after ^ or =");
  refused("^=", "no device after ^ or =");
  refused("mlx5_0,,mlx5_1", "an empty item");
  refused("mlx5_0,", "an empty item");
  refused(",mlx5_0", "an empty item");
  refused("mlx5_0:", "a port that is not a number");
  refused("mlx5_0:x", "a port that is not a number");
  refused("mlx5_0:0", "a port that is not a number");
  refused("mlx5_0:256", "a port that is not a number");
  refused("mlx5_0:1:2", "a port that is not a number");
  refused("mlx5_0:-1", "a port that is not a number");
  refused("mlx5_0:+1", "a port that is not a number");
  refused(":1", "a port without a device name");
  refused("mlx5_0,^mlx5_1", "may only lead the list");
  refused("mlx5 0", "a space");
  refused("mlx5_0,=mlx5_1", "may only lead the list");
  char longname[100];
  memset(longname, 'a', 80);
  longname[80] = '\0';
  refused(longname, "longer than 63");
  strcat(many, ",dev32");
  refused(many, "more than 32 items");
  return 0;
}
