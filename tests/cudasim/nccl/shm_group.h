/* tests/cudasim/nccl/shm_group.h — the simulated NCCL's core: N processes
 * meeting in a POSIX shared-memory segment, and the four collectives run
 * between them in the calling thread (blocking, with a deadline and an abort
 * flag on every wait). No CUDA runtime here: test_shm_group.cc forks ranks
 * and checks this core alone; nccl.cc puts it behind NCCL's API and inside
 * streams. The layout, the id's life and the arithmetic are described in
 * tests/cudasim/include/nccl.h. */
#ifndef FSDP_CUDASIM_SHM_GROUP_H
#define FSDP_CUDASIM_SHM_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include <atomic>
#include <string>

#include "nccl.h"

enum sim_kind { SIM_ALL_REDUCE = 0, SIM_BROADCAST, SIM_REDUCE_SCATTER, SIM_ALL_GATHER, SIM_SEND,
                SIM_RECV };

/* One collective as every rank must issue it, or one half of a point-to-point
 * transfer (SIM_SEND, SIM_RECV: root is the peer). count: NCCL's count
 * argument (recvcount for reduce-scatter, sendcount for all-gather). */
struct sim_desc {
  int32_t kind, dtype, op, root; /* op: ncclRedOp_t or -1; root (the peer of a send/recv) or -1 */
  uint64_t count;
  uint64_t seq;                  /* 1-based number on its communicator, for messages */
};

struct sim_segment; /* the shared memory, opaque */

/* This process's view of one group. */
struct sim_group {
  sim_segment *seg = nullptr;
  size_t map_bytes = 0;
  int rank = 0, nranks = 1;
  uint64_t step = 0;                        /* barriers passed */
  double timeout_s = 120.0;                 /* per wait */
  const std::atomic<int> *abort = nullptr;  /* this process aborted the communicator */
};

/* Element size of a type the simulator moves, 0 for one it does not model. */
size_t sim_type_size(int dtype);
/* "ncclAllReduce(count 12, ncclBfloat16, ncclSum)" */
std::string sim_desc_text(const sim_desc &d);
/* ncclFloat32 -> "ncclFloat32" etc.; "datatype <n>" for others. */
const char *sim_type_name(int dtype);
const char *sim_op_name(int op);

/* Joins (creating, when first) the segment `name` as rank of nranks (>= 2),
 * waiting up to g->timeout_s for every rank, then unlinks the name. g->abort
 * and g->timeout_s are set by the caller first. On failure *err says why and
 * nothing stays mapped or named. */
ncclResult_t sim_group_join(sim_group *g, const char *name, int nranks, int rank,
                            std::string *err);
/* Unmaps. */
void sim_group_leave(sim_group *g);
/* Tells the peers this rank aborted and wakes every waiter (any thread, any
 * time while the group is mapped). */
void sim_group_abort(sim_group *g);
/* Runs d between the group's ranks: compares every rank's d first
 * (ncclInvalidUsage with each rank's call when they differ), then moves the
 * data. A failed wait is ncclRemoteError naming the rank(s). */
ncclResult_t sim_group_run(sim_group *g, const sim_desc &d, const void *send, void *recv,
                           std::string *err);
/* One ncclSend or ncclRecv of a group: d (SIM_SEND or SIM_RECV, root the
 * peer) on buf. */
struct sim_p2p {
  sim_desc d;
  void *buf;
};
/* Runs the point-to-point halves of one group together: each send pairs with
 * the peer's receive from this rank, the k-th send from a to b with the k-th
 * receive on b from a, across groups as well (NCCL's matching), and all of
 * them progress at once (a ring of sends and receives cannot deadlock). Data
 * move through the sender's staging area, one slice per destination. A send
 * waits for its receive (and the reverse) until g->abort, an abort by any
 * rank, the peer's exit, or the deadline (reset at every step forward):
 * ncclRemoteError naming the peer. A receive of another size than its send is
 * ncclInvalidUsage naming both. seq numbers the group in messages. */
ncclResult_t sim_group_p2p(sim_group *g, const sim_p2p *ops, size_t n, uint64_t seq,
                           std::string *err);
/* Blocks like a rank that never arrives: until g->abort or the deadline. */
ncclResult_t sim_group_stall(sim_group *g, const sim_desc &d, std::string *err);

/* out[i] = the reduction of src[0][i], ..., src[n-1][i] in that order (the
 * rules in nccl.h); out may be src[0]. */
void sim_reduce(void *out, const void *const *src, int n, size_t count, int dtype, int op);

#endif
