/* tests/cudasim/nccl/shm_group.cc — the shared-memory segment, the barriers
 * with deadlines, and the collectives of the simulated NCCL (shm_group.h).
 * Waits sleep on a futex in the segment, woken by every arrival and by an
 * abort, and wake on their own every 50 ms to notice a dead peer (kill(pid,
 * 0)), a local abort and the deadline: a stalled or vanished peer is an error
 * with its rank in the message, never a hang. */
#include "shm_group.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <type_traits>
#include <vector>

struct alignas(64) sim_slot {
  std::atomic<uint64_t> step;  /* barriers this rank has reached */
  std::atomic<int32_t> pid;    /* 0 until the rank joins */
  sim_desc desc;               /* its current collective, posted before the first barrier */
};

/* Rank src's sends to rank dst (sim_group_p2p): chunks through src's
 * staging slice for dst, one at a time. Counters only grow. */
struct alignas(64) sim_chan {
  std::atomic<uint64_t> ready;  /* chunks src has published */
  std::atomic<uint64_t> taken;  /* chunks dst has copied out */
  uint64_t len, msg;            /* bytes of the published chunk, and of its whole message */
};

/* ftruncate fills the segment with zeros: every atomic starts at 0. */
struct sim_segment {
  std::atomic<uint32_t> ready;      /* 1 once the creator has filled in the fields below */
  int32_t nranks;
  uint64_t bytes;
  std::atomic<int32_t> joined;
  std::atomic<uint32_t> wake;       /* futex word: bumped by every arrival and abort */
  std::atomic<int32_t> aborted_by;  /* rank + 1 of a rank that aborted, 0 if none */
  sim_slot slots[SIM_NCCL_MAX_RANKS];
  sim_chan chans[SIM_NCCL_MAX_RANKS][SIM_NCCL_MAX_RANKS]; /* [src][dst] */
};

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex word must be lock-free");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "step must be lock-free");

namespace {

double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

unsigned char *stage(sim_segment *s, int rank) {
  return reinterpret_cast<unsigned char *>(s + 1) + (size_t)rank * SIM_NCCL_STAGE;
}

size_t segment_bytes(int nranks) { return sizeof(sim_segment) + (size_t)nranks * SIM_NCCL_STAGE; }

void wake_all(sim_segment *s) {
  s->wake.fetch_add(1, std::memory_order_acq_rel);
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(&s->wake), FUTEX_WAKE, INT_MAX, nullptr,
          nullptr, 0);
}

void sleep_on(sim_segment *s, uint32_t seen, double secs) {
  if (secs > 0.05) secs = 0.05;
  if (secs <= 0) return;
  struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(&s->wake), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

__attribute__((format(printf, 3, 4))) ncclResult_t fail(std::string *err, ncclResult_t r,
                                                        const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  *err = buf;
  return r;
}

/* Exited: no such process, or a zombie its parent has not reaped yet. */
bool pid_gone(int32_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  const size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *state = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces */
  return state && (state[2] == 'Z' || state[2] == 'X');
}

/* Whether this rank (its watchdog) or another rank aborted the communicator
 * while this one waited at `what`; *err then says which. */
bool aborted(sim_group *g, const std::string &what, std::string *err) {
  if (g->abort && g->abort->load()) {
    fail(err, ncclRemoteError, "rank %d aborted this communicator while waiting at %s", g->rank,
         what.c_str());
    return true;
  }
  const int32_t ab = g->seg->aborted_by.load();
  if (ab <= 0) return false;
  fail(err, ncclRemoteError, "rank %d aborted the communicator (ncclCommAbort) while rank %d "
       "waited at %s", ab - 1, g->rank, what.c_str());
  return true;
}

/* Waits until ready(r) holds for every rank r. `what` names the wait. */
template <class Ready>
ncclResult_t wait_all(sim_group *g, Ready ready, const std::string &what, std::string *err) {
  sim_segment *s = g->seg;
  const double deadline = now_s() + g->timeout_s;
  for (;;) {
    const uint32_t seen = s->wake.load(std::memory_order_acquire);
    std::string missing;
    int first_missing = -1;
    for (int r = 0; r < g->nranks; ++r)
      if (!ready(r)) {
        if (first_missing < 0) first_missing = r;
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    if (first_missing < 0) return ncclSuccess;
    if (aborted(g, what, err)) return ncclRemoteError;
    for (int r = 0; r < g->nranks; ++r)
      if (!ready(r) && pid_gone(s->slots[r].pid.load()))
        return fail(err, ncclRemoteError, "rank %d (pid %d) exited without reaching %s", r,
                    (int)s->slots[r].pid.load(), what.c_str());
    const double left = deadline - now_s();
    if (left <= 0)
      return fail(err, ncclRemoteError, "rank(s) %s did not reach %s within %g s "
                  "(FSDP_SIM_NCCL_TIMEOUT_S); rank %d waited", missing.c_str(), what.c_str(),
                  g->timeout_s, g->rank);
    sleep_on(s, seen, left);
  }
}

ncclResult_t barrier(sim_group *g, const std::string &what, std::string *err) {
  const uint64_t step = ++g->step;
  g->seg->slots[g->rank].step.store(step, std::memory_order_release);
  wake_all(g->seg);
  sim_slot *slots = g->seg->slots;
  return wait_all(g, [&](int r) { return slots[r].step.load(std::memory_order_acquire) >= step; },
                  what, err);
}

/* ---- arithmetic ---- */

uint16_t bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float bf16_value(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* IEEE fp16, nearest even (fsdp_f32_to_f16 in src/core/core.c, bit for bit). */
uint16_t f16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu);
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a >= 0x38800000u) {
    a += 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((a - 0x38000000u) >> 13);
  }
  if (a < 0x33000000u) return sign;
  const uint32_t shift = 126u - (a >> 23), m = (a & 0x7fffffu) | 0x800000u;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return sign | (uint16_t)q;
}

float f16_value(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t u;
  if (e == 0x1fu) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else {
    const float f = (float)m * 0x1p-24f;
    memcpy(&u, &f, sizeof u);
    u |= sign;
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Storage S, arithmetic in V, each result rounded back to what S holds. */
template <class S> struct plain {
  using V = S;
  static V load(const void *p, size_t i) { return static_cast<const S *>(p)[i]; }
  static void store(void *p, size_t i, V v) { static_cast<S *>(p)[i] = v; }
  static V round(V v) { return v; }
};

struct bf16 {
  using V = float;
  static V load(const void *p, size_t i) { return bf16_value(static_cast<const uint16_t *>(p)[i]); }
  static void store(void *p, size_t i, V v) { static_cast<uint16_t *>(p)[i] = bf16_bits(v); }
  static V round(V v) { return bf16_value(bf16_bits(v)); }
};

struct f16 { /* NCCL's half sums: each result rounded to fp16 */
  using V = float;
  static V load(const void *p, size_t i) { return f16_value(static_cast<const uint16_t *>(p)[i]); }
  static void store(void *p, size_t i, V v) { static_cast<uint16_t *>(p)[i] = f16_bits(v); }
  static V round(V v) { return f16_value(f16_bits(v)); }
};

template <class V> V combine(int op, V a, V b) {
  if constexpr (std::is_integral_v<V>) {
    using U = std::make_unsigned_t<V>; /* wrap around, as the GPU does, without UB */
    if (op == ncclSum || op == ncclAvg) return (V)((U)a + (U)b);
    if (op == ncclProd) return (V)((U)a * (U)b);
  } else {
    if (op == ncclSum || op == ncclAvg) return a + b;
    if (op == ncclProd) return a * b;
  }
  if (op == ncclMax) return b > a ? b : a;
  return b < a ? b : a; /* ncclMin */
}

template <class T>
void reduce_as(void *out, const void *const *src, int n, size_t count, int op) {
  using V = typename T::V;
  constexpr bool premul = !std::is_integral_v<V>; /* NCCL's ncclAvg on floating types */
  const V scale = T::round((V)(1.0 / n));
  for (size_t i = 0; i < count; ++i) {
    V acc = T::load(src[0], i);
    if (op == ncclAvg && premul) acc = T::round(acc * scale);
    for (int r = 1; r < n; ++r) {
      V x = T::load(src[r], i);
      if (op == ncclAvg && premul) x = T::round(x * scale);
      acc = T::round(combine<V>(op, acc, x));
    }
    if constexpr (!premul)
      if (op == ncclAvg) acc = (V)(acc / (V)n);
    T::store(out, i, acc);
  }
}

} // namespace

size_t sim_type_size(int t) {
  switch (t) {
  case ncclInt8: case ncclUint8: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0; /* fp8, or no type at all */
}

const char *sim_type_name(int t) {
  static const char *names[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32",
                                "ncclInt64", "ncclUint64", "ncclFloat16", "ncclFloat32",
                                "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                "ncclFloat8e5m2"};
  return t >= 0 && t < ncclNumTypes ? names[t] : "not a datatype";
}

const char *sim_op_name(int op) {
  static const char *names[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
  return op >= 0 && op < ncclNumOps ? names[op] : "not an op";
}

std::string sim_desc_text(const sim_desc &d) {
  static const char *kinds[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduceScatter",
                                "ncclAllGather", "ncclSend", "ncclRecv"};
  char buf[192];
  if (d.kind == SIM_SEND || d.kind == SIM_RECV) {
    snprintf(buf, sizeof buf, "%s(count %llu, %s, peer %d)", kinds[d.kind],
             (unsigned long long)d.count, sim_type_name(d.dtype), d.root);
    return buf;
  }
  int n = snprintf(buf, sizeof buf, "%s(%s %llu, %s", kinds[d.kind % 4],
                   d.kind == SIM_REDUCE_SCATTER ? "recvcount" : d.kind == SIM_ALL_GATHER
                                                                    ? "sendcount" : "count",
                   (unsigned long long)d.count, sim_type_name(d.dtype));
  if (d.op >= 0) n += snprintf(buf + n, sizeof buf - n, ", %s", sim_op_name(d.op));
  if (d.root >= 0) n += snprintf(buf + n, sizeof buf - n, ", root %d", d.root);
  snprintf(buf + n, sizeof buf - n, ")");
  return buf;
}

void sim_reduce(void *out, const void *const *src, int n, size_t count, int dtype, int op) {
  switch (dtype) {
  case ncclInt8: return reduce_as<plain<int8_t>>(out, src, n, count, op);
  case ncclUint8: return reduce_as<plain<uint8_t>>(out, src, n, count, op);
  case ncclInt32: return reduce_as<plain<int32_t>>(out, src, n, count, op);
  case ncclUint32: return reduce_as<plain<uint32_t>>(out, src, n, count, op);
  case ncclInt64: return reduce_as<plain<int64_t>>(out, src, n, count, op);
  case ncclUint64: return reduce_as<plain<uint64_t>>(out, src, n, count, op);
  case ncclFloat32: return reduce_as<plain<float>>(out, src, n, count, op);
  case ncclFloat64: return reduce_as<plain<double>>(out, src, n, count, op);
  case ncclFloat16: return reduce_as<f16>(out, src, n, count, op);
  case ncclBfloat16: return reduce_as<bf16>(out, src, n, count, op);
  }
}

/* ---- joining ---- */

namespace {

/* Opens the segment another rank created, waiting for it to be filled in. */
ncclResult_t open_existing(sim_group *g, const char *name, double deadline, int *fd_out,
                           std::string *err) {
  int fd = shm_open(name, O_RDWR, 0600);
  if (fd < 0)
    return fail(err, ncclSystemError, "rank %d: shm_open(%s) failed: %s (the id was used up: "
                "its communicator already formed or its init timed out)", g->rank, name,
                strerror(errno));
  struct stat st;
  for (;;) { /* the creator's single ftruncate makes the size 0 or complete */
    if (fstat(fd, &st) != 0 || st.st_size > 0 || now_s() > deadline) break;
    const struct timespec ms = {0, 1000000};
    nanosleep(&ms, nullptr);
  }
  if (st.st_size < (off_t)sizeof(sim_segment)) {
    close(fd);
    return fail(err, ncclRemoteError, "rank %d: the rank that created %s never sized it "
                "within %g s", g->rank, name, g->timeout_s);
  }
  *fd_out = fd;
  return ncclSuccess;
}

ncclResult_t map_segment(sim_group *g, const char *name, int nranks, double deadline,
                         std::string *err) {
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  const bool creator = fd >= 0;
  size_t bytes = segment_bytes(nranks);
  if (!creator) {
    if (errno != EEXIST)
      return fail(err, ncclSystemError, "rank %d: shm_open(%s) failed: %s", g->rank, name,
                  strerror(errno));
    ncclResult_t r = open_existing(g, name, deadline, &fd, err);
    if (r != ncclSuccess) return r;
    struct stat st;
    fstat(fd, &st);
    bytes = (size_t)st.st_size;
  } else if (ftruncate(fd, (off_t)bytes) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(name);
    return fail(err, ncclSystemError, "rank %d: cannot size %s to %zu bytes: %s", g->rank, name,
                bytes, strerror(e));
  }
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    if (creator) shm_unlink(name);
    return fail(err, ncclSystemError, "rank %d: mmap of %s failed: %s", g->rank, name,
                strerror(errno));
  }
  g->seg = static_cast<sim_segment *>(p);
  g->map_bytes = bytes;
  if (creator) {
    g->seg->nranks = nranks;
    g->seg->bytes = bytes;
    g->seg->ready.store(1, std::memory_order_release);
    return ncclSuccess;
  }
  while (!g->seg->ready.load(std::memory_order_acquire) && now_s() < deadline) {
    const struct timespec ms = {0, 1000000};
    nanosleep(&ms, nullptr);
  }
  if (!g->seg->ready.load(std::memory_order_acquire))
    return fail(err, ncclRemoteError, "rank %d: the rank that created %s never finished it "
                "within %g s", g->rank, name, g->timeout_s);
  if (g->seg->nranks != nranks)
    return fail(err, ncclInvalidUsage, "rank %d passed nranks = %d to ncclCommInitRank, but "
                "the first rank to arrive passed nranks = %d: every rank must pass the same",
                g->rank, nranks, (int)g->seg->nranks);
  return ncclSuccess;
}

} // namespace

ncclResult_t sim_group_join(sim_group *g, const char *name, int nranks, int rank,
                            std::string *err) {
  g->rank = rank;
  g->nranks = nranks;
  g->step = 0;
  const double deadline = now_s() + g->timeout_s;
  ncclResult_t r = map_segment(g, name, nranks, deadline, err);
  if (r == ncclSuccess) {
    int32_t expected = 0;
    if (!g->seg->slots[rank].pid.compare_exchange_strong(expected, (int32_t)getpid()))
      r = fail(err, ncclInvalidUsage, "rank %d of this id was already taken by pid %d: two "
               "processes passed the same rank to ncclCommInitRank", rank, (int)expected);
  }
  if (r == ncclSuccess) {
    g->seg->joined.fetch_add(1);
    wake_all(g->seg);
    sim_slot *slots = g->seg->slots;
    r = wait_all(g, [&](int p) { return slots[p].pid.load() != 0; },
                 std::string("ncclCommInitRank of ") + std::to_string(nranks) + " ranks", err);
  }
  /* Formed or failed, the name has done its job; the mapping lives on. */
  shm_unlink(name);
  if (r != ncclSuccess) sim_group_leave(g);
  return r;
}

void sim_group_leave(sim_group *g) {
  if (g->seg) munmap(g->seg, g->map_bytes);
  g->seg = nullptr;
}

void sim_group_abort(sim_group *g) {
  if (!g->seg) return;
  int32_t none = 0;
  g->seg->aborted_by.compare_exchange_strong(none, g->rank + 1);
  wake_all(g->seg);
}

ncclResult_t sim_group_stall(sim_group *g, const sim_desc &d, std::string *err) {
  const std::string what = sim_desc_text(d) + " #" + std::to_string(d.seq);
  fprintf(stderr, "simnccl: rank %d stalls at %s (FSDP_SIM_NCCL_STALL): it will not arrive "
          "until ncclCommAbort or %g s pass\n", g->rank, what.c_str(), g->timeout_s);
  const ncclResult_t r = wait_all(g, [](int) { return false; }, "a stall at " + what, err);
  *err = "stalled at " + what + " on purpose (FSDP_SIM_NCCL_STALL); ended: " + *err;
  return r;
}

/* ---- collectives ---- */

namespace {

ncclResult_t check_same(sim_group *g, const sim_desc &d, std::string *err) {
  sim_slot *slots = g->seg->slots;
  bool same = true;
  for (int r = 0; r < g->nranks; ++r) {
    const sim_desc &o = slots[r].desc;
    same = same && o.kind == d.kind && o.dtype == d.dtype && o.op == d.op && o.root == d.root &&
           o.count == d.count;
  }
  if (same) return ncclSuccess;
  std::string calls;
  for (int r = 0; r < g->nranks; ++r)
    calls += "; rank " + std::to_string(r) + ": " + sim_desc_text(slots[r].desc);
  return fail(err, ncclInvalidUsage, "collective #%llu differs across ranks (real NCCL would "
              "hang or corrupt memory)%s", (unsigned long long)d.seq, calls.c_str());
}

} // namespace

ncclResult_t sim_group_run(sim_group *g, const sim_desc &d, const void *send, void *recv,
                           std::string *err) {
  const size_t es = sim_type_size(d.dtype);
  const int N = g->nranks, me = g->rank;
  const std::string what = sim_desc_text(d) + " #" + std::to_string(d.seq);
  g->seg->slots[me].desc = d;
  ncclResult_t r = barrier(g, "the start of " + what, err);
  if (r != ncclSuccess) return r;
  if ((r = check_same(g, d, err)) != ncclSuccess) {
    /* Every rank reads every description before anyone posts its next one. */
    std::string ignored;
    barrier(g, what, &ignored);
    return r;
  }
  const unsigned char *in = static_cast<const unsigned char *>(send);
  unsigned char *out = static_cast<unsigned char *>(recv);
  const size_t per_round = d.kind == SIM_REDUCE_SCATTER ? SIM_NCCL_STAGE / (es * N)
                                                        : SIM_NCCL_STAGE / es;
  const void *srcs[SIM_NCCL_MAX_RANKS];
  bool moved = false;
  for (size_t off = 0; off < d.count; off += per_round) {
    const size_t len = d.count - off < per_round ? d.count - off : per_round, bytes = len * es;
    unsigned char *mine = stage(g->seg, me);
    if (d.kind == SIM_REDUCE_SCATTER)
      for (int p = 0; p < N; ++p) memcpy(mine + p * bytes, in + (p * d.count + off) * es, bytes);
    else if (d.kind != SIM_BROADCAST || me == d.root)
      memcpy(mine, in + off * es, bytes);
    if ((r = barrier(g, what, err)) != ncclSuccess) return r;
    switch (d.kind) {
    case SIM_ALL_REDUCE:
    case SIM_REDUCE_SCATTER:
      for (int p = 0; p < N; ++p)
        srcs[p] = stage(g->seg, p) + (d.kind == SIM_REDUCE_SCATTER ? me * bytes : 0);
      sim_reduce(out + off * es, srcs, N, len, d.dtype, d.op);
      break;
    case SIM_ALL_GATHER:
      for (int p = 0; p < N; ++p) memcpy(out + (p * d.count + off) * es, stage(g->seg, p), bytes);
      break;
    case SIM_BROADCAST:
      memcpy(out + off * es, stage(g->seg, d.root), bytes);
      break;
    }
    if ((r = barrier(g, what, err)) != ncclSuccess) return r;
    moved = true;
  }
  /* Nobody may post the next description before every rank compared this one. */
  if (!moved) r = barrier(g, what, err);
  return r;
}

/* ---- point to point ---- */

namespace {

/* One send or receive of a group as it progresses. */
struct p2p_state {
  size_t bytes, at = 0;  /* the message; how much has moved */
  uint64_t chunks = 0;   /* published (send) or copied out (receive) */
  bool done = false;
};

/* The staging slice of src's area that carries its chunks to dst. */
size_t slice_bytes(int nranks) { return (SIM_NCCL_STAGE / (size_t)nranks) & ~(size_t)63; }

uint64_t chunks_of(size_t bytes, size_t slice) {
  return bytes == 0 ? 1 : (bytes + slice - 1) / slice; /* an empty message still pairs */
}

/* One step of op i, when nothing earlier in the group uses its channel;
 * *moved when it did something. */
ncclResult_t p2p_step(sim_group *g, const sim_p2p *ops, p2p_state *st, size_t i, uint64_t seq,
                      bool *moved, std::string *err) {
  const sim_desc &d = ops[i].d;
  for (size_t j = 0; j < i; ++j)
    if (!st[j].done && ops[j].d.kind == d.kind && ops[j].d.root == d.root) return ncclSuccess;
  const int me = g->rank, peer = d.root;
  const size_t slice = slice_bytes(g->nranks), need = chunks_of(st[i].bytes, slice);
  unsigned char *buf = static_cast<unsigned char *>(ops[i].buf);
  if (d.kind == SIM_SEND) {
    sim_chan &c = g->seg->chans[me][peer];
    const uint64_t ready = c.ready.load(std::memory_order_relaxed);
    if (c.taken.load(std::memory_order_acquire) != ready) return ncclSuccess; /* slot busy */
    if (st[i].chunks == need) { /* the last chunk was taken */
      st[i].done = *moved = true;
      return ncclSuccess;
    }
    const size_t len = st[i].bytes - st[i].at < slice ? st[i].bytes - st[i].at : slice;
    memcpy(stage(g->seg, me) + (size_t)peer * slice, buf + st[i].at, len);
    c.len = len;
    c.msg = st[i].bytes;
    c.ready.store(ready + 1, std::memory_order_release);
    st[i].at += len;
    st[i].chunks++;
    *moved = true;
    wake_all(g->seg);
    return ncclSuccess;
  }
  sim_chan &c = g->seg->chans[peer][me];
  const uint64_t taken = c.taken.load(std::memory_order_relaxed);
  if (c.ready.load(std::memory_order_acquire) == taken) return ncclSuccess; /* nothing yet */
  if (c.msg != st[i].bytes)
    return fail(err, ncclInvalidUsage, "rank %d sends %llu bytes to rank %d, which receives "
                "%zu (%s in group #%llu): a send and its receive must move the same bytes",
                peer, (unsigned long long)c.msg, me, st[i].bytes, sim_desc_text(d).c_str(),
                (unsigned long long)seq);
  memcpy(buf + st[i].at, stage(g->seg, peer) + (size_t)me * slice, c.len);
  st[i].at += c.len;
  c.taken.store(taken + 1, std::memory_order_release);
  st[i].done = ++st[i].chunks == need;
  *moved = true;
  wake_all(g->seg);
  return ncclSuccess;
}

} // namespace

ncclResult_t sim_group_p2p(sim_group *g, const sim_p2p *ops, size_t n, uint64_t seq,
                           std::string *err) {
  sim_segment *s = g->seg;
  std::vector<p2p_state> st(n);
  for (size_t i = 0; i < n; ++i) st[i].bytes = ops[i].d.count * sim_type_size(ops[i].d.dtype);
  double deadline = now_s() + g->timeout_s;
  for (;;) {
    const uint32_t seen = s->wake.load(std::memory_order_acquire);
    bool moved = false, all = true;
    for (size_t i = 0; i < n; ++i) {
      if (st[i].done) continue;
      const ncclResult_t r = p2p_step(g, ops, st.data(), i, seq, &moved, err);
      if (r != ncclSuccess) return r;
      all = all && st[i].done;
    }
    if (all) return ncclSuccess;
    if (moved) {
      deadline = now_s() + g->timeout_s;
      continue;
    }
    size_t k = 0; /* the first half still waiting, for the messages */
    while (st[k].done) ++k;
    const std::string what = sim_desc_text(ops[k].d) + " of group #" + std::to_string(seq);
    const int peer = ops[k].d.root;
    if (aborted(g, what, err)) return ncclRemoteError;
    for (size_t i = 0; i < n; ++i)
      if (!st[i].done && pid_gone(s->slots[ops[i].d.root].pid.load()))
        return fail(err, ncclRemoteError, "rank %d (pid %d) exited without the %s that matches "
                    "rank %d's %s", ops[i].d.root, (int)s->slots[ops[i].d.root].pid.load(),
                    ops[i].d.kind == SIM_SEND ? "ncclRecv" : "ncclSend", g->rank,
                    sim_desc_text(ops[i].d).c_str());
    const double left = deadline - now_s();
    if (left <= 0)
      return fail(err, ncclRemoteError, "rank %d waited %g s (FSDP_SIM_NCCL_TIMEOUT_S) at %s "
                  "for rank %d's matching %s", g->rank, g->timeout_s, what.c_str(), peer,
                  ops[k].d.kind == SIM_SEND ? "ncclRecv" : "ncclSend");
    sleep_on(s, seen, left);
  }
}
