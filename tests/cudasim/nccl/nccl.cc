/* tests/cudasim/nccl/nccl.cc — the simulated NCCL's entry points (nccl.h):
 * ids, communicators (a registry of live ones, so a destroyed handle is an
 * error, not a read of freed memory), argument checks at the call, groups,
 * and each collective queued on the caller's stream with cudaLaunchHostFunc
 * (a group's sends and receives on one communicator as one queued item).
 * When the stream reaches it, the host function takes the communicator's
 * next turn (collectives of one communicator run one at a time in issue
 * order, whatever streams they were issued on, as NCCL serialises them) and
 * runs it between the ranks (shm_group.cc) or, at N = 1, copies. A failure
 * there becomes the communicator's asynchronous error
 * (ncclCommGetAsyncError), printed once on stderr. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <new>
#include <random>
#include <unordered_set>
#include <vector>

#include "shm_group.h"

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr uint64_t kIdMagic = 0x53494d4e43434c31ull; /* "SIMNCCL1" */

/* What ncclGetUniqueId writes into the 128 bytes. */
struct id_body {
  uint64_t magic;
  char name[64]; /* the shared-memory name, "/fsdp-simnccl-<pid>-<random>" */
};
static_assert(sizeof(id_body) <= NCCL_UNIQUE_ID_BYTES, "id too large");

} // namespace

struct ncclComm {
  int rank, nranks, index, device;
  sim_group group;                  /* nranks >= 2 */
  std::atomic<int> refs{1};         /* the user's, plus one per queued collective */
  std::atomic<int> aborted{0};
  std::atomic<int> async{ncclSuccess};
  uint64_t stall_op = 0;            /* FSDP_SIM_NCCL_STALL for this communicator, 0: none */
  bool stall_in_call = false;       /* ...:enqueue: the call blocks, not the stream */
  uint64_t fail_op = 0;             /* FSDP_SIM_NCCL_FAIL for this communicator, 0: none */
  std::mutex lock;                  /* guards the fields below */
  std::condition_variable turn_cv;
  uint64_t issued = 0, done = 0;    /* collectives queued / finished, in issue order */
  std::string error;                /* the asynchronous error's text */
};

namespace {

std::mutex registry_lock;
std::unordered_set<ncclComm *> registry;
int multi_rank_comms; /* communicators of N >= 2 made by this process, for the stall's index */

std::mutex last_lock;
std::string last_error;

__attribute__((format(printf, 2, 3))) ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
  char buf[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "simnccl: %s\n", buf);
  std::lock_guard<std::mutex> guard(last_lock);
  last_error = buf;
  return r;
}

void unref(ncclComm *c) {
  if (c->refs.fetch_sub(1) != 1) return;
  sim_group_leave(&c->group);
  delete c;
}

/* The first asynchronous error sticks; its text is in place (c->error,
 * ncclGetLastError) before ncclCommGetAsyncError can report it. */
void set_async(ncclComm *c, ncclResult_t r, const std::string &why) {
  std::lock_guard<std::mutex> guard(c->lock);
  if (c->async.load() != ncclSuccess) return;
  c->error = why;
  fail(r, "rank %d of %d: %s", c->rank, c->nranks, why.c_str());
  c->async.store(r);
}

ncclResult_t env_double(const char *name, double dflt, double *out) {
  const char *s = getenv(name);
  *out = dflt;
  if (!s || !*s) return ncclSuccess;
  char *end = nullptr;
  const double v = strtod(s, &end);
  if (*end || !(v > 0))
    return fail(ncclInvalidUsage, "%s='%s' is not a positive number of seconds", name, s);
  *out = v;
  return ncclSuccess;
}

/* FSDP_SIM_NCCL_STALL=rank:op[:comm[:enqueue]] for communicator `index` of
 * this rank. */
ncclResult_t stall_for(int rank, int index, uint64_t *op, bool *in_call) {
  *op = 0;
  *in_call = false;
  const char *s = getenv("FSDP_SIM_NCCL_STALL");
  if (!s || !*s) return ncclSuccess;
  int r = -1, c = 0, used = 0;
  unsigned long long k = 0;
  const int got = sscanf(s, "%d:%llu%n:%d%n", &r, &k, &used, &c, &used);
  const bool enq = got == 3 && !strcmp(s + used, ":enqueue");
  if (got < 2 || (s[used] && !enq) || r < 0 || k == 0 || c < 0)
    return fail(ncclInvalidUsage, "FSDP_SIM_NCCL_STALL='%s' is not rank:op[:comm[:enqueue]] "
                "(op counts from 1, comm from 0)", s);
  if (r == rank && c == index) *op = k, *in_call = enq;
  return ncclSuccess;
}

/* FSDP_SIM_NCCL_FAIL=rank:op[:comm] for communicator `index` of this rank. */
ncclResult_t fail_for(int rank, int index, uint64_t *op) {
  *op = 0;
  const char *s = getenv("FSDP_SIM_NCCL_FAIL");
  if (!s || !*s) return ncclSuccess;
  int r = -1, c = 0, used = 0;
  unsigned long long k = 0;
  const int got = sscanf(s, "%d:%llu%n:%d%n", &r, &k, &used, &c, &used);
  if (got < 2 || s[used] || r < 0 || k == 0 || c < 0)
    return fail(ncclInvalidUsage, "FSDP_SIM_NCCL_FAIL='%s' is not rank:op[:comm] (op counts "
                "from 1, comm from 0)", s);
  if (r == rank && c == index) *op = k;
  return ncclSuccess;
}

ncclComm *live(ncclComm_t comm) {
  std::lock_guard<std::mutex> guard(registry_lock);
  return registry.count(comm) ? comm : nullptr;
}

/* live() with a reference taken, for a call that may run while another
 * thread aborts the communicator (ncclCommAbort's purpose): the caller
 * unrefs it. */
ncclComm *live_ref(ncclComm_t comm) {
  std::lock_guard<std::mutex> guard(registry_lock);
  if (!registry.count(comm)) return nullptr;
  comm->refs.fetch_add(1);
  return comm;
}

/* ---- one queued collective ---- */

struct queued {
  ncclComm *comm;
  sim_desc desc;                /* a collective, or the first of p2p */
  const void *send;
  void *recv;
  cudaStream_t stream;
  std::vector<sim_p2p> p2p = {}; /* a group's sends and receives on comm, run together */
  bool skip = false;            /* its group failed at a call: it only takes its turn */
};

/* Waits for c's turn for ticket seq (1-based): every earlier collective of
 * c finished, however its stream is going. */
bool wait_turn(ncclComm *c, uint64_t seq, std::string *why) {
  std::unique_lock<std::mutex> guard(c->lock);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(c->group.timeout_s);
  while (c->done + 1 != seq && !c->aborted.load())
    if (c->turn_cv.wait_until(guard, deadline) == std::cv_status::timeout) {
      *why = "collective #" + std::to_string(seq) + " waited " +
             std::to_string(c->group.timeout_s) + " s for collective #" +
             std::to_string(c->done + 1) + " of the same communicator (issued earlier on "
             "another stream that never ran it?)";
      return false;
    }
  return true;
}

void finish_turn(ncclComm *c) {
  std::lock_guard<std::mutex> guard(c->lock);
  ++c->done;
  c->turn_cv.notify_all();
}

/* N = 1: the k-th send to itself lands in the k-th receive. */
ncclResult_t run_local_p2p(const std::vector<sim_p2p> &ops, std::string *why) {
  std::vector<const sim_p2p *> sends, recvs;
  for (const sim_p2p &o : ops) (o.d.kind == SIM_SEND ? sends : recvs).push_back(&o);
  if (sends.size() != recvs.size()) {
    *why = std::to_string(sends.size()) + " ncclSend and " + std::to_string(recvs.size()) +
           " ncclRecv to itself in one group on a communicator of 1 rank: one is unmatched";
    return ncclInvalidUsage;
  }
  for (size_t k = 0; k < sends.size(); ++k) {
    const size_t sb = sends[k]->d.count * sim_type_size(sends[k]->d.dtype),
                 rb = recvs[k]->d.count * sim_type_size(recvs[k]->d.dtype);
    if (sb != rb) {
      *why = "rank 0 sends " + std::to_string(sb) + " bytes to itself and receives " +
             std::to_string(rb) + ": a send and its receive must move the same bytes";
      return ncclInvalidUsage;
    }
    memmove(recvs[k]->buf, sends[k]->buf, sb);
  }
  return ncclSuccess;
}

void run_local(const sim_desc &d, const void *send, void *recv) {
  const size_t bytes = d.count * sim_type_size(d.dtype);
  if (d.kind == SIM_REDUCE_SCATTER || d.kind == SIM_ALL_REDUCE) {
    sim_reduce(recv, &send, 1, d.count, d.dtype, d.op); /* AVG at N = 1: times 1, exact */
    return;
  }
  if (send != recv) memmove(recv, send, bytes);
}

/* A collective that failed keeps its stream, as a real NCCL kernel does
 * (it waits for data that never comes), until ncclCommAbort (or, so that
 * nothing hangs forever, the deadline): work queued after it must not run
 * on its unwritten output before the program has seen the error. */
void hold_until_abort(ncclComm *c) {
  std::unique_lock<std::mutex> guard(c->lock);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(c->group.timeout_s);
  while (!c->aborted.load())
    if (c->turn_cv.wait_until(guard, deadline) == std::cv_status::timeout) return;
}

void run_queued(void *p) {
  queued *q = static_cast<queued *>(p);
  ncclComm *c = q->comm;
  std::string why;
  if (!wait_turn(c, q->desc.seq, &why)) {
    set_async(c, ncclInternalError, why);
    hold_until_abort(c);
  } else if (!q->skip && !c->aborted.load() && c->async.load() == ncclSuccess) {
    ncclResult_t r = ncclSuccess;
    if (c->nranks == 1 && !q->p2p.empty()) r = run_local_p2p(q->p2p, &why);
    else if (c->nranks == 1) run_local(q->desc, q->send, q->recv);
    else if (q->desc.seq == c->stall_op && !c->stall_in_call)
      r = sim_group_stall(&c->group, q->desc, &why);
    else if (q->desc.seq == c->fail_op)
      r = ncclSystemError, why = "injected failure (FSDP_SIM_NCCL_FAIL): this rank never "
                                 "joined it and its output is not written";
    else if (!q->p2p.empty())
      r = sim_group_p2p(&c->group, q->p2p.data(), q->p2p.size(), q->desc.seq, &why);
    else r = sim_group_run(&c->group, q->desc, q->send, q->recv, &why);
    if (r != ncclSuccess && !c->aborted.load()) {
      const std::string what = q->p2p.empty() ? sim_desc_text(q->desc) : "a group of " +
                               std::to_string(q->p2p.size()) + " ncclSend/ncclRecv";
      set_async(c, r, what + " #" + std::to_string(q->desc.seq) + ": " + why);
      hold_until_abort(c);
    }
  }
  finish_turn(c);
  unref(c);
  delete q;
}

ncclResult_t launch(queued *q) {
  const cudaError_t e = cudaLaunchHostFunc(q->stream, run_queued, q);
  if (e == cudaSuccess) return ncclSuccess;
  ncclComm *c = q->comm;
  const std::string what = sim_desc_text(q->desc);
  /* Never runs: its turn must still pass, or later collectives would wait. */
  set_async(c, ncclUnhandledCudaError, "cudaLaunchHostFunc failed for " + what + ": " +
                                           cudaGetErrorString(e));
  finish_turn(c);
  unref(c);
  delete q;
  return ncclUnhandledCudaError;
}

thread_local int group_depth;
thread_local std::vector<queued *> group_queue;
/* The group's sends and receives, each holding a reference on its comm,
 * queued per communicator at ncclGroupEnd. */
thread_local std::vector<queued *> group_p2p;
/* The first error a call of the open group returned: ncclGroupEnd returns
 * it and runs nothing of the group, as NCCL does. */
thread_local ncclResult_t group_error;

/* ---- argument checks ---- */

const char *kind_fn(int kind) {
  static const char *fns[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduceScatter",
                              "ncclAllGather", "ncclSend", "ncclRecv"};
  return fns[kind];
}

/* A buffer NCCL can use: device memory of the communicator's device, or host
 * memory registered with CUDA; plain host memory is refused as NCCL does. */
ncclResult_t check_buffer(const char *fn, const char *arg, const void *p, const ncclComm *c) {
  if (!p) return fail(ncclInvalidArgument, "%s: %s is NULL", fn, arg);
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type == cudaMemoryTypeUnregistered)
    return fail(ncclInvalidArgument, "%s: %s %p is not CUDA memory (plain host memory; NCCL "
                "needs a device buffer)", fn, arg, p);
  if (a.type == cudaMemoryTypeDevice && a.device != c->device)
    return fail(ncclInvalidArgument, "%s: %s %p lives on device %d, the communicator on "
                "device %d", fn, arg, p, a.device, c->device);
  return ncclSuccess;
}

bool overlap(const void *a, size_t na, const void *b, size_t nb) {
  const char *x = static_cast<const char *>(a), *y = static_cast<const char *>(b);
  return na && nb && x < y + nb && y < x + na;
}

ncclResult_t check_call(const sim_desc &d, const void *send, void *recv, ncclComm *c) {
  const char *fn = kind_fn(d.kind);
  if ((unsigned)d.dtype >= ncclNumTypes)
    return fail(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t", fn, d.dtype);
  const size_t es = sim_type_size(d.dtype);
  if (!es)
    return fail(ncclInvalidArgument, "%s: %s is not modelled by the simulator (fp8 is "
                "not)", fn, sim_type_name(d.dtype));
  if (d.kind == SIM_ALL_REDUCE || d.kind == SIM_REDUCE_SCATTER)
    if ((unsigned)d.op >= ncclNumOps)
      return fail(ncclInvalidArgument, "%s: op %d is not ncclSum, ncclProd, ncclMax, ncclMin or "
                  "ncclAvg (custom ops are not simulated)", fn, d.op);
  if (d.kind == SIM_BROADCAST && (d.root < 0 || d.root >= c->nranks))
    return fail(ncclInvalidArgument, "%s: root %d is not a rank of this communicator of %d",
                fn, d.root, c->nranks);
  if ((d.kind == SIM_SEND || d.kind == SIM_RECV) && (d.root < 0 || d.root >= c->nranks))
    return fail(ncclInvalidArgument, "%s: peer %d is not a rank of this communicator of %d",
                fn, d.root, c->nranks);
  if (d.count == 0) return ncclSuccess;
  if (d.kind == SIM_SEND) return check_buffer(fn, "sendbuff", send, c);
  if (d.kind == SIM_RECV) return check_buffer(fn, "recvbuff", recv, c);
  const size_t n = (size_t)c->nranks, send_n = d.kind == SIM_REDUCE_SCATTER ? n * d.count : d.count,
               recv_n = d.kind == SIM_ALL_GATHER ? n * d.count : d.count;
  if (d.kind != SIM_BROADCAST || c->rank == d.root) {
    const ncclResult_t r = check_buffer(fn, "sendbuff", send, c);
    if (r != ncclSuccess) return r;
  }
  const ncclResult_t r = check_buffer(fn, "recvbuff", recv, c);
  if (r != ncclSuccess) return r;
  /* In place is exactly: all-gather send == recv + rank*count, reduce-scatter
   * recv == send + rank*count, the others send == recv. */
  const char *in_place = d.kind == SIM_ALL_GATHER ? (const char *)recv + c->rank * d.count * es
                         : d.kind == SIM_REDUCE_SCATTER ? (const char *)send + c->rank * d.count * es
                                                        : (const char *)send;
  const bool exact = d.kind == SIM_REDUCE_SCATTER ? in_place == recv : in_place == send;
  if (!exact && (d.kind != SIM_BROADCAST || c->rank == d.root) &&
      overlap(send, send_n * es, recv, recv_n * es))
    return fail(ncclInvalidArgument, "%s: sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) "
                "overlap without being in place (rank %d)", fn, send, send_n * es, recv,
                recv_n * es, c->rank);
  return ncclSuccess;
}

/* FSDP_SIM_NCCL_STALL=...:enqueue: the call itself blocks, as a real
 * enqueue can (a peer that never connects, a full work queue), until
 * ncclCommAbort from another thread (or the deadline); the collective is
 * never queued, but its turn passes so that nothing after it waits. */
ncclResult_t stall_in_call(queued *q) {
  ncclComm *c = q->comm;
  const char *fn = kind_fn(q->desc.kind);
  fprintf(stderr, "simnccl: rank %d blocks inside the call %s #%llu (FSDP_SIM_NCCL_STALL "
          "...:enqueue): it returns at ncclCommAbort\n", c->rank, fn,
          (unsigned long long)q->desc.seq);
  std::string why;
  const ncclResult_t r = sim_group_stall(&c->group, q->desc, &why);
  finish_turn(c);
  unref(c);
  delete q;
  return fail(r == ncclSuccess ? ncclInternalError : r, "%s: %s", fn, why.c_str());
}

ncclResult_t enqueue(sim_desc d, const void *send, void *recv, ncclComm_t comm,
                     cudaStream_t stream) {
  const char *fn = kind_fn(d.kind);
  if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  ncclComm *c = live_ref(comm); /* the queued collective's reference, once queued */
  if (!c)
    return fail(ncclInvalidArgument, "%s: comm %p is not a live communicator (destroyed, "
                "aborted or never made)", fn, (void *)comm);
  ncclResult_t r = check_call(d, send, recv, c);
  if (r == ncclSuccess && c->async.load() != ncclSuccess) {
    std::lock_guard<std::mutex> guard(c->lock);
    r = fail((ncclResult_t)c->async.load(), "%s: the communicator failed earlier: %s", fn,
             c->error.c_str());
  }
  queued *q = r == ncclSuccess ? new (std::nothrow) queued{c, d, send, recv, stream} : nullptr;
  if (r == ncclSuccess && !q) r = fail(ncclSystemError, "%s: out of host memory", fn);
  if (r != ncclSuccess) {
    unref(c);
    if (group_depth > 0 && group_error == ncclSuccess) group_error = r;
    return r;
  }
  if (d.kind == SIM_SEND || d.kind == SIM_RECV) {
    q->p2p.push_back({d, d.kind == SIM_SEND ? const_cast<void *>(send) : recv});
    if (group_depth > 0) { /* its turn is taken at ncclGroupEnd, with its group's */
      group_p2p.push_back(q);
      return ncclSuccess;
    }
  }
  {
    std::lock_guard<std::mutex> guard(c->lock);
    q->desc.seq = ++c->issued;
  }
  if (c->stall_in_call && q->desc.seq == c->stall_op) return stall_in_call(q);
  if (group_depth > 0) {
    group_queue.push_back(q);
    return ncclSuccess;
  }
  return launch(q);
}

} // namespace

/* ---- the API ---- */

SIM_EXPORT ncclResult_t ncclGetVersion(int *version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

SIM_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  static std::mutex lock;
  static std::mt19937_64 rng(std::random_device{}() ^ ((uint64_t)getpid() << 32) ^
                             (uint64_t)time(nullptr));
  id_body body;
  memset(&body, 0, sizeof body);
  body.magic = kIdMagic;
  {
    std::lock_guard<std::mutex> guard(lock);
    snprintf(body.name, sizeof body.name, "/fsdp-simnccl-%d-%016llx", (int)getpid(),
             (unsigned long long)rng());
  }
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &body, sizeof body);
  return ncclSuccess;
}

SIM_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                         int rank) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  *comm = nullptr;
  if (nranks < 1 || nranks > SIM_NCCL_MAX_RANKS)
    return fail(ncclInvalidArgument, "ncclCommInitRank: nranks = %d is not in 1..%d", nranks,
                SIM_NCCL_MAX_RANKS);
  if (rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank = %d is not in 0..%d", rank,
                nranks - 1);
  id_body body;
  memcpy(&body, commId.internal, sizeof body);
  body.name[sizeof body.name - 1] = 0;
  if (body.magic != kIdMagic || body.name[0] != '/')
    return fail(ncclInvalidArgument, "ncclCommInitRank: commId was not made by ncclGetUniqueId "
                "(rank %d; did the id reach this rank?)", rank);
  double timeout = 0;
  ncclResult_t r = env_double("FSDP_SIM_NCCL_TIMEOUT_S", 120.0, &timeout);
  if (r != ncclSuccess) return r;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return fail(ncclUnhandledCudaError, "ncclCommInitRank: cudaGetDevice failed (rank %d)", rank);
  ncclComm *c = new (std::nothrow) ncclComm;
  if (!c) return fail(ncclSystemError, "ncclCommInitRank: out of host memory");
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->index = -1;
  c->group.timeout_s = timeout;
  c->group.abort = &c->aborted;
  if (nranks > 1) {
    {
      std::lock_guard<std::mutex> guard(registry_lock);
      c->index = multi_rank_comms++;
    }
    r = stall_for(rank, c->index, &c->stall_op, &c->stall_in_call);
    if (r == ncclSuccess) r = fail_for(rank, c->index, &c->fail_op);
    std::string why;
    if (r == ncclSuccess) r = sim_group_join(&c->group, body.name, nranks, rank, &why);
    if (r != ncclSuccess) {
      if (!why.empty()) fail(r, "ncclCommInitRank: %s", why.c_str());
      delete c;
      return r;
    }
  }
  std::lock_guard<std::mutex> guard(registry_lock);
  registry.insert(c);
  *comm = c;
  return ncclSuccess;
}

/* Removes comm from the registry; NULL when it was not there. */
static ncclComm *take(ncclComm_t comm) {
  std::lock_guard<std::mutex> guard(registry_lock);
  return registry.erase(comm) ? comm : nullptr;
}

SIM_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ncclComm *c = take(comm);
  if (!c)
    return fail(ncclInvalidArgument, "ncclCommDestroy: comm %p is not a live communicator",
                (void *)comm);
  unref(c); /* queued collectives hold their own references */
  return ncclSuccess;
}

SIM_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess; /* NCCL: aborting NULL is a no-op */
  ncclComm *c = take(comm);
  if (!c)
    return fail(ncclInvalidArgument, "ncclCommAbort: comm %p is not a live communicator",
                (void *)comm);
  c->aborted.store(1);
  sim_group_abort(&c->group); /* wakes this rank's waiter and tells the peers */
  {
    std::lock_guard<std::mutex> guard(c->lock);
    c->turn_cv.notify_all();
  }
  unref(c);
  return ncclSuccess;
}

SIM_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  ncclComm *c = live(comm);
  if (!c)
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm %p is not a live communicator",
                (void *)comm);
  *asyncError = (ncclResult_t)c->async.load();
  return ncclSuccess;
}

SIM_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  ncclComm *c = live(comm);
  if (!c || !count) return fail(ncclInvalidArgument, "ncclCommCount: bad comm or count");
  *count = c->nranks;
  return ncclSuccess;
}

SIM_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  ncclComm *c = live(comm);
  if (!c || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: bad comm or rank");
  *rank = c->rank;
  return ncclSuccess;
}

SIM_EXPORT const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

/* The last error's text, in this process (the simulator keeps one, whatever
 * comm says): a copy per thread, so the pointer stays valid for the caller. */
SIM_EXPORT const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  static thread_local std::string copy;
  std::lock_guard<std::mutex> guard(last_lock);
  copy = last_error;
  return copy.c_str();
}

SIM_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream) {
  return enqueue({SIM_ALL_REDUCE, (int)datatype, (int)op, -1, count, 0}, sendbuff, recvbuff,
                 comm, stream);
}

SIM_EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
  return enqueue({SIM_BROADCAST, (int)datatype, -1, root, count, 0}, sendbuff, recvbuff, comm,
                 stream);
}

SIM_EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op,
                                          ncclComm_t comm, cudaStream_t stream) {
  return enqueue({SIM_REDUCE_SCATTER, (int)datatype, (int)op, -1, recvcount, 0}, sendbuff,
                 recvbuff, comm, stream);
}

SIM_EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                      ncclDataType_t datatype, ncclComm_t comm,
                                      cudaStream_t stream) {
  return enqueue({SIM_ALL_GATHER, (int)datatype, -1, -1, sendcount, 0}, sendbuff, recvbuff, comm,
                 stream);
}

SIM_EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                                 int peer, ncclComm_t comm, cudaStream_t stream) {
  return enqueue({SIM_SEND, (int)datatype, -1, peer, count, 0}, sendbuff, nullptr, comm, stream);
}

SIM_EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
  return enqueue({SIM_RECV, (int)datatype, -1, peer, count, 0}, nullptr, recvbuff, comm, stream);
}

SIM_EXPORT ncclResult_t ncclGroupStart(void) {
  if (group_depth++ == 0) group_error = ncclSuccess;
  return ncclSuccess;
}

/* The group's sends and receives, one queued item per communicator (in the
 * order the communicators first appear), each taking one turn now. */
static ncclResult_t batch_p2p(std::vector<queued *> *batches) {
  std::vector<queued *> ops;
  ops.swap(group_p2p);
  ncclResult_t r = ncclSuccess;
  for (queued *o : ops) {
    queued *b = nullptr;
    for (queued *x : *batches)
      if (x->comm == o->comm) b = x;
    if (!b) {
      batches->push_back(o);
      continue;
    }
    if (b->stream != o->stream && r == ncclSuccess)
      r = fail(ncclInvalidUsage, "%s on another stream than the group's first send/receive on "
               "the same communicator: not modelled by the simulator", kind_fn(o->desc.kind));
    b->p2p.push_back(o->p2p[0]);
    unref(o->comm); /* the batch holds one reference */
    delete o;
  }
  for (queued *b : *batches) {
    std::lock_guard<std::mutex> guard(b->comm->lock);
    b->desc.seq = ++b->comm->issued;
  }
  return r;
}

SIM_EXPORT ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0)
    return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  std::vector<queued *> batch, p2p;
  batch.swap(group_queue);
  ncclResult_t first = group_error;
  const ncclResult_t paired = batch_p2p(&p2p);
  if (first == ncclSuccess) first = paired;
  batch.insert(batch.end(), p2p.begin(), p2p.end());
  for (queued *q : batch) {
    q->skip = first != ncclSuccess; /* a failed group runs nothing, but its turns pass */
    ncclComm *c = q->comm;
    const ncclResult_t r = !q->skip && c->stall_in_call && q->desc.seq == c->stall_op
                               ? stall_in_call(q) : launch(q);
    if (first == ncclSuccess) first = r;
  }
  return first;
}
