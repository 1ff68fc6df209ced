/*
 * The tests' side of the verbs test double (tests/verbs_double/): its
 * entry points found by dlopen and dlsym, as the IB plugin finds
 * libibverbs, and the pieces the tests are made of (two forked ranks
 * joined by a socketpair, a node with a registered buffer, RC links
 * between nodes, posting and polling). test_verbs_double*.c use it.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TESTS_VD_CLIENT_H
#define LOOM_TESTS_VD_CLIENT_H

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

struct vd_syms {
  void *h;
  struct ibv_device **(*get_device_list)(int *);
  void (*free_device_list)(struct ibv_device **);
  const char *(*get_device_name)(struct ibv_device *);
  __be64 (*get_device_guid)(struct ibv_device *);
  struct ibv_context *(*open_device)(struct ibv_device *);
  int (*close_device)(struct ibv_context *);
  int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
  int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
  int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
  int (*query_gid_ex)(struct ibv_context *, uint32_t, uint32_t, struct ibv_gid_entry *, uint32_t,
                      size_t);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *);
  int (*dealloc_pd)(struct ibv_pd *);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
  struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned);
  struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
  int (*dereg_mr)(struct ibv_mr *);
  struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
  int (*destroy_cq)(struct ibv_cq *);
  struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
  int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
  int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
  int (*destroy_qp)(struct ibv_qp *);
  const char *(*wc_status_str)(enum ibv_wc_status);
  int (*get_async_event)(struct ibv_context *, struct ibv_async_event *);
  void (*ack_async_event)(struct ibv_async_event *);
};

/* The double's entry points (vd_load fills them). */
extern struct vd_syms vd_syms;
#define V vd_syms

#define VCHECK(cond, ...)                                                                     \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: [pid %d] check failed: %s: ", __FILE__, __LINE__, (int)getpid(), \
              #cond);                                                                         \
      fprintf(stderr, __VA_ARGS__);                                                           \
      fprintf(stderr, "\n");                                                                  \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

/* Polls one completion and checks its status and wr_id. */
#define VEXPECT(cq, id, st)                                                                   \
  do {                                                                                        \
    struct ibv_wc wc_;                                                                        \
    VCHECK(vd_poll1(cq, &wc_) == 0, "no completion for wr %llu", (unsigned long long)(id));   \
    VCHECK(wc_.wr_id == (id) && (int)wc_.status == (int)(st), "wr_id %llu status %s (%d), expected %llu %s", \
           (unsigned long long)wc_.wr_id, V.wc_status_str(wc_.status), wc_.status,            \
           (unsigned long long)(id), V.wc_status_str(st));                                    \
  } while (0)

#define VD_ACCESS_ALL (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

struct vd_node {
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  struct ibv_cq *cq;
  struct ibv_mr *mr;
  unsigned char *buf;
  size_t len;
  struct ibv_port_attr pa;
  struct ibv_mr *mr2; /* a second buffer of the test's (vd_node_mr2), or NULL */
};

/* What a side tells its peer. */
struct vd_end {
  uint32_t qpn, rkey, psn, lid;
  uint64_t addr, len;
  union ibv_gid gid;
  int32_t pid;
};

struct vd_conf {
  int gid_index;
  int rnr_retry, min_rnr_timer, timeout, retry_cnt, sl, tc, hop_limit;
  enum ibv_mtu mtu;
  int max_rd_atomic, max_dest_rd_atomic;
  uint32_t sq_psn;
  int access;
  /* Wrong addresses, to see what hardware would do with them. */
  int flip_dgid, bump_dlid, bump_psn, bump_qpn;
};

/* The usual settings: RoCE v2 GID 3, hardware's common retry values. */
extern const struct vd_conf vd_conf0;

struct vd_link {
  struct ibv_qp *qp;
  struct vd_end self, peer;
};

typedef int (*vd_rank_fn)(int rank, int sock, void *arg);

int vd_load(void);
void vd_env(const char *devices, const char *netdev, const char *fail);
int vd_sync(int sock);
int vd_exchange(int sock, const void *mine, void *theirs, size_t len);
int vd_start2(vd_rank_fn fn, void *arg, pid_t pids[2]);
int vd_wait(pid_t pid);
int vd_run2(vd_rank_fn fn, void *arg);
int vd_leftovers(pid_t pid);
int vd_node_open(struct vd_node *n, const char *dev, size_t len);
int vd_node_mr2(struct vd_node *n, int sock, void *buf, size_t len, int access, uint64_t theirs[2]);
int vd_node_close(struct vd_node *n);
struct ibv_qp *vd_qp_new(struct vd_node *n);
int vd_qp_init(struct ibv_qp *qp, int access);
int vd_qp_rtr(struct vd_node *n, struct ibv_qp *qp, const struct vd_conf *c, const struct vd_end *peer);
int vd_qp_rts(struct ibv_qp *qp, const struct vd_conf *c);
int vd_link_begin(struct vd_node *n, int sock, const struct vd_conf *c, struct vd_link *l);
int vd_link_finish(struct vd_node *n, const struct vd_conf *c, struct vd_link *l);
int vd_link_up(struct vd_node *n, int sock, const struct vd_conf *c, struct vd_link *l);
__attribute__((sentinel)) int vd_start(struct vd_node *n, const char *dev, size_t len, int sock, const struct vd_conf *c, ...);
__attribute__((sentinel)) int vd_finish(int sock, struct vd_node *n, ...);
int vd_post(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op, struct ibv_sge *sg, int nsge, uint64_t raddr, uint32_t rkey, uint32_t imm, unsigned flags);
int vd_post_recv1(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sg, int nsge);
int vd_poll1(struct ibv_cq *cq, struct ibv_wc *wc);
struct ibv_qp_attr vd_query(struct ibv_qp *qp);
int vd_check_gid(struct ibv_context *ctx, int port, int index, const uint8_t *raw, int type);
int vd_expected_ipv4(struct in_addr *a);

#endif
