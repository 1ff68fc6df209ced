/*
 * Internals of the verbs test double (see README.md): the objects it hands
 * out, laid out as verbs.h's structs followed by the double's own state,
 * and the shared-memory objects that peer processes read and write.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_VD_INTERNAL_H
#define LOOM_VD_INTERNAL_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "vd_shm.h"

#define VD_EXPORT __attribute__((visibility("default")))

/* Limits the double reports in ibv_query_device and enforces. */
#define VD_MAX_DEVICES 32
#define VD_MAX_PORTS 8
#define VD_MAX_GIDS 16 /* entries the double fills; the table is longer */
#define VD_ETH_GID_TBL_LEN 256
#define VD_IB_GID_TBL_LEN 128
#define VD_IB_PKEY_TBL_LEN 128
#define VD_MR_SLOTS 65536 /* per PD; keys are slot << 8 | generation */
#define VD_MAX_SGE 30
#define VD_MAX_QP_WR 32768
#define VD_MAX_CQE 4194303
#define VD_MAX_INLINE 512
#define VD_MAX_RD_ATOM 16
#define VD_MAX_MSG (1u << 30)
#define VD_NUM_MAX 0xffffffu /* QP, CQ and PD numbers are 24-bit */

enum vd_kind { VD_KIND_DEV = 1, VD_KIND_PD = 2, VD_KIND_CQ = 3, VD_KIND_QP = 4 };

/* ---- shared memory (vd_shm.c) ---- */

/* Creates /dev/shm/loomvd-<kind>-<n> for a free n in [lo, hi], mapped and
 * zeroed but for the header; NULL with errno. */
void *vd_shm_create(enum vd_kind kind, uint32_t lo, uint32_t hi, size_t size, uint32_t *num);
/* Maps a peer's object read-write; NULL with errno (ENOENT: no such). */
void *vd_shm_map(enum vd_kind kind, uint32_t num, size_t *size);
/* Ends this process's own object: marks it gone, unlinks and unmaps it. */
void vd_shm_destroy(enum vd_kind kind, uint32_t num, void *map, size_t size);
/* Whether the object's owner is still the live process that made it. */
int vd_hdr_alive(const struct vd_hdr *h);
int vd_mutex_init_shared(pthread_mutex_t *m);
/* Robust lock: a lock whose holder died is taken over. */
void vd_lock(pthread_mutex_t *m);
void vd_unlock(pthread_mutex_t *m);
double vd_now(void);
/* One line on stderr prefixed "loom-verbs-double: ". */
void vd_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- devices (vd_device.c) ---- */

struct vd_port_spec {
  uint8_t link_layer; /* IBV_LINK_LAYER_* */
  uint8_t active;
};

struct vd_device {
  struct ibv_device dev; /* first: handed out as ibv_device */
  int nports;
  struct vd_port_spec port[VD_MAX_PORTS];
  /* Identity on the fabric, made on first use in a process (again after a
   * fork): uid numbers the LIDs and GUIDs. */
  pid_t id_pid;
  uint32_t uid;
  void *id_map;
};

struct vd_event {
  enum ibv_event_type type;
  void *obj;
};

struct vd_context {
  struct ibv_context ctx; /* first */
  struct vd_device *dev;
  pthread_mutex_t ev_lock;
  struct vd_event ev[64];
  unsigned ev_head, ev_count;
};

struct vd_gid_tab {
  int n;
  union ibv_gid gid[VD_MAX_GIDS];
  uint8_t type[VD_MAX_GIDS]; /* IBV_GID_TYPE_* */
  uint32_t ifindex;
};

int vd_device_identity(struct vd_device *d);
uint64_t vd_port_guid(const struct vd_device *d, int port); /* host order */
uint16_t vd_port_lid(const struct vd_device *d, int port);
/* The port's GID table as of now (reads the netdev's addresses). */
void vd_port_gids(struct vd_device *d, int port, struct vd_gid_tab *t);
int vd_port_valid(const struct vd_context *c, unsigned port);
/* Queues an async event for ibv_get_async_event. */
void vd_event_raise(struct vd_context *c, enum ibv_event_type type, void *obj);
/* LOOM_VERBS_DOUBLE_FAIL: the n-th send WR (0: none) and its status. */
void vd_fail_config(long *nth, int *status);

/* ---- protection domains and memory (vd_mem.c) ---- */

/* What memory an MR stands for. Host memory (ibv_reg_mr, or a dma-buf the
 * double can map, such as a memfd) is reached with process_vm_writev and
 * readv; CUDA device memory (ibv_reg_mr of a device pointer, as with
 * nvidia-peermem, or a dma-buf over device memory at its iova) through
 * the CUDA driver of the process that moves the bytes (vd_cuda.c). */
enum vd_mem_kind { VD_MEM_HOST = 0, VD_MEM_CUDA = 1 };

#define VD_CUDA_IPC_BYTES 64
#define VD_CUDA_BUSID_BYTES 16

struct vd_mem {
  uint32_t kind;       /* enum vd_mem_kind */
  uint64_t cuda_base;  /* CUDA: the allocation's base in the owner process */
  unsigned char ipc[VD_CUDA_IPC_BYTES]; /* CUDA: the allocation's IPC handle */
  char busid[VD_CUDA_BUSID_BYTES];      /* CUDA: the owner's GPU */
};

struct vd_mr_slot {
  _Atomic uint32_t key; /* 0: free */
  _Atomic uint32_t access;
  _Atomic uint64_t iova;
  _Atomic uint64_t length;
  _Atomic uint64_t vaddr;
  struct vd_mem mem; /* written before the key, read between two key checks */
};

struct vd_pd_shm {
  struct vd_hdr hdr;
  uint32_t id;
  uint32_t nslots;
  struct vd_mr_slot slot[VD_MR_SLOTS];
};

struct vd_pd {
  struct ibv_pd pd; /* first */
  struct vd_context *ctx;
  struct vd_pd_shm *shm;
  pthread_mutex_t lock;
  uint32_t hint;
  uint8_t gen[VD_MR_SLOTS];
  int nmr;
  _Atomic int nqp;
};

struct vd_mr {
  struct ibv_mr mr; /* first */
  struct vd_pd *pd;
  uint32_t slot;
  void *map; /* a dma-buf the double mapped, unmapped with the MR */
  size_t map_len;
};

/* Checks [addr, addr+len) of the MR keyed `key` in `t` for `access`
 * (0: any) and gives the owner's address it stands for and, where `mem`
 * is not NULL, what memory that is; 0 or -1. */
int vd_mr_lookup(struct vd_pd_shm *t, uint32_t key, uint64_t addr, uint64_t len,
                 uint32_t access, uint64_t *vaddr, struct vd_mem *mem);

/* ---- CUDA device memory (vd_cuda.c), through libcuda.so.1 loaded with
 * dlopen: a process that never loaded it has no device memory. ---- */

/* 1 if [addr, addr+len) is device memory of this process (m filled), 0 if
 * not, -1 with errno on a CUDA failure. */
int vd_cuda_describe(uint64_t addr, uint64_t len, struct vd_mem *m);
/* The address in this process, and its device, of the owner's device
 * address `addr` in the MR memory `m` of process `owner` (opened through
 * CUDA IPC once per allocation); 0, or a CUDA error code. */
int vd_cuda_resolve(pid_t owner, const struct vd_mem *m, uint64_t addr, uint64_t *local, int *dev);
/* Copies n bytes to or from device memory `dev` reaches, with host memory
 * of this process on the other end, on a stream of its own that waits for
 * no kernel; 0, or a CUDA error code. */
int vd_cuda_copy(int dev, uint64_t dst, uint64_t src, uint64_t n);
/* Whether [addr, addr+len) of this process is all mapped. */
int vd_range_mapped(uint64_t addr, uint64_t len);

/* ---- completion queues (vd_cq.c) ---- */

struct vd_qp;

struct vd_cqe {
  struct ibv_wc wc;
  uint64_t seq;        /* send completions: the WR's number in its QP */
  struct vd_qp *qp;    /* send completions: the poster's QP, valid in writer_pid */
  int32_t writer_pid;
  uint32_t reserved;
};

struct vd_cq_shm {
  struct vd_hdr hdr;
  pthread_mutex_t lock;
  uint32_t id;
  uint32_t cap;
  _Atomic uint32_t count;
  uint32_t head;
  _Atomic uint32_t overrun;
  _Atomic uint32_t event_hint; /* a peer raised an event on one of this CQ's QPs */
  struct vd_cqe ring[];
};

struct vd_cq {
  struct ibv_cq cq; /* first */
  struct vd_context *ctx;
  struct vd_cq_shm *shm;
  size_t shm_len;
  _Atomic int nqp;
  _Atomic int overrun_reported;
};

/* Appends a completion (from any process); 0, or -1 when the CQ overran. */
int vd_cq_push(struct vd_cq_shm *s, const struct vd_cqe *e);
/* Removes the completions of QP `qpn` (a destroyed or reset QP). */
void vd_cq_purge(struct vd_cq_shm *s, uint32_t qpn);

/* ---- queue pairs (vd_qp.c, vd_send.c) ---- */

struct vd_rwqe {
  uint64_t wr_id;
  uint32_t num_sge;
  uint32_t reserved;
  struct ibv_sge sge[];
};

struct vd_qp_shm {
  struct vd_hdr hdr;
  pthread_mutex_t lock; /* everything below */
  uint32_t qpn;
  _Atomic uint32_t state; /* enum ibv_qp_state */
  uint32_t pd_id;
  uint32_t recv_cq_id;
  uint32_t dest_qpn; /* from RTR on */
  uint32_t epsn;     /* next PSN the responder expects */
  uint32_t access;   /* qp_access_flags */
  uint8_t min_rnr_timer;
  uint8_t max_dest_rd_atomic;
  uint8_t link_layer; /* of its port, from INIT on */
  uint8_t port_num;
  uint16_t lid;
  uint16_t port_active;
  uint32_t ngid;
  union ibv_gid gid[VD_MAX_GIDS];
  _Atomic uint32_t async_pending; /* bit per enum ibv_event_type, raised by a peer */
  uint32_t max_recv_wr;
  uint32_t max_recv_sge;
  uint32_t rq_stride;
  uint32_t rq_head;
  uint32_t rq_count;
  unsigned char rq[]; /* max_recv_wr struct vd_rwqe of rq_stride bytes */
};

struct vd_swqe {
  uint64_t wr_id;
  uint64_t remote_addr;
  uint32_t rkey;
  uint32_t imm; /* network order, as given */
  int opcode;
  unsigned flags;
  int num_sge;
  uint32_t inline_len; /* IBV_SEND_INLINE: the data follows the SGEs */
  int inject;          /* LOOM_VERBS_DOUBLE_FAIL: complete with this status */
  int signaled;
  uint64_t length;
  struct ibv_sge sge[];
};

/* The connected peer QP, found from dest_qp_num. */
struct vd_peer {
  uint32_t qpn;
  struct vd_qp_shm *qp;
  size_t qp_len;
  struct vd_pd_shm *pd;
  size_t pd_len;
  struct vd_cq_shm *cq;
  size_t cq_len;
  int pidfd;
  pid_t pid;
};

struct vd_qp {
  struct ibv_qp qp; /* first */
  struct vd_qp *next;
  struct vd_context *ctx;
  struct vd_pd *pd;
  struct vd_cq *scq, *rcq;
  struct vd_qp_shm *shm;
  size_t shm_len;
  pthread_mutex_t sq_lock; /* the send queue, attr and peer */
  struct ibv_qp_cap cap;
  int sq_sig_all;
  struct ibv_qp_attr attr;
  unsigned char *sq;
  size_t sq_stride;
  uint64_t sq_posted, sq_exec; /* WR numbers: posted, executed */
  _Atomic uint64_t sq_retired; /* WRs below this have left the send queue */
  uint32_t next_psn;
  struct vd_peer peer;
  int rnr_tries;
  double rnr_next;
  double retry_deadline; /* the responder is not at RTR yet: give up then */
  _Atomic int pending; /* posted WRs not yet executed */
};

/* All QPs of this process (progress, events). */
extern pthread_mutex_t vd_qps_lock;
extern struct vd_qp *vd_qps;
extern _Atomic int vd_qps_pending;

/* Runs the send queue as far as it goes; sq_lock held. */
void vd_qp_progress(struct vd_qp *q);
/* Tries every QP with pending WRs (called from poll_cq). */
void vd_progress_pending(void);
/* Moves the owner's QP to the error state, flushing its receive queue. */
void vd_qp_to_err(struct vd_qp *q);
/* With s->lock held: state ERR, posted receives flushed into `cq`. */
void vd_qp_shm_to_err(struct vd_qp_shm *s, struct vd_cq_shm *cq);
void vd_peer_drop(struct vd_peer *p);
uint32_t vd_mtu_bytes(enum ibv_mtu m);
/* vendor_err of a completion: mlx5's CQE syndrome for the status. */
uint32_t vd_vendor_err(int status);

int vd_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int vd_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int vd_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int vd_req_notify_cq(struct ibv_cq *cq, int solicited_only);

#endif
