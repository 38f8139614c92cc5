/* tests/cudasim/nccl/test_nccl.cc — the simulated NCCL through its API, as
 * comm_nccl.c uses it: forked ranks (N = 1..4) each on a simulated device,
 * collectives on device buffers queued on streams, f32/f64/bf16 with sum,
 * avg and max against host references, in a group too; ncclSend/ncclRecv in
 * a group (a ring shift, two messages to one peer paired in order); then the
 * errors: a send without its receive failing at the deadline naming the
 * peer, a receive of another size than its send; a
 * host buffer refused at the call, differing counts reported asynchronously
 * with each rank's call, ncclCommAbort unblocking a stream that waits for a
 * peer that never comes, FSDP_SIM_NCCL_STALL ending in an error that names
 * the stalled rank, and no name left in /dev/shm. Exit 0 when all pass. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <functional>
#include <vector>

#include "../sim_test.h"
#include "nccl.h"

/* Forks n ranks sharing a fresh id (made here: ncclGetUniqueId touches no
 * CUDA, and no rank inherits a started runtime); returns the failed count. */
static int run_ranks(int n, const std::function<void(int, int, ncclUniqueId)> &body) {
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
  return sim_run_ranks(n, [&](int r) {
    CHECK(cudaSetDevice(r % 4) == cudaSuccess, "cudaSetDevice(%d)", r % 4);
    body(r, n, id);
  });
}

/* The communicator's asynchronous error once there is one (a failed
 * collective keeps its stream until the abort, as in NCCL), within 30 s. */
static ncclResult_t wait_async(ncclComm_t c) {
  ncclResult_t async = ncclSuccess;
  const double give_up = now_s() + 30;
  while (ncclCommGetAsyncError(c, &async) == ncclSuccess && async == ncclSuccess &&
         now_s() < give_up)
    usleep(1000);
  return async;
}

static ncclComm_t init(int r, int n, ncclUniqueId id) {
  ncclComm_t c = nullptr;
  const ncclResult_t res = ncclCommInitRank(&c, n, id, r);
  CHECK(res == ncclSuccess, "ncclCommInitRank rank %d of %d: %s", r, n, ncclGetLastError(nullptr));
  return c;
}

static double val(int r, size_t i) { return (double)((int)((r * 5 + i * 3) % 13) - 6); }

static void put(void *b, ncclDataType_t t, size_t i, double v) {
  if (t == ncclFloat32) ((float *)b)[i] = (float)v;
  else if (t == ncclFloat64) ((double *)b)[i] = v;
  else if (t == ncclFloat16) ((_Float16 *)b)[i] = (_Float16)v; /* the compiler's fp16 */
  else ((uint16_t *)b)[i] = bf16_of((float)v);
}
static double get(const void *b, ncclDataType_t t, size_t i) {
  return t == ncclFloat32   ? ((const float *)b)[i]
         : t == ncclFloat64 ? ((const double *)b)[i]
         : t == ncclFloat16 ? (double)((const _Float16 *)b)[i]
                            : f_of(((const uint16_t *)b)[i]);
}

/* Exact for SUM and MAX (small integers); AVG within comm.h's bound. */
static bool reduced_ok(double got, ncclRedOp_t op, ncclDataType_t t, int n, size_t j) {
  double acc = val(0, j), mass = fabs(acc);
  for (int r = 1; r < n; ++r) {
    const double x = val(r, j);
    acc = op == ncclMax ? fmax(acc, x) : acc + x;
    mass += fabs(x);
  }
  if (op != ncclAvg) return got == acc;
  const double u = t == ncclBfloat16 ? ldexp(1, -8) : t == ncclFloat16 ? ldexp(1, -11)
                   : t == ncclFloat32 ? ldexp(1, -24) : ldexp(1, -53);
  return fabs(got - acc / n) <= expm1((n + 1) * log1p(u)) * mass / n;
}

static void collectives(int r, int n, ncclUniqueId id) {
  ncclComm_t c = init(r, n, id);
  if (!c) return;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  const size_t count = 300001; /* past one staging round in f32 and bf16 */
  const ncclDataType_t types[] = {ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat16};
  const ncclRedOp_t ops[] = {ncclSum, ncclAvg, ncclMax};
  for (ncclDataType_t t : types) {
    const size_t es = t == ncclFloat64 ? 8 : t == ncclFloat32 ? 4 : 2;
    std::vector<unsigned char> host(n * count * es), back((n + 1) * count * es);
    void *dsend = nullptr, *drecv = nullptr;
    CHECK(cudaMalloc(&dsend, n * count * es) == cudaSuccess, "malloc");
    CHECK(cudaMalloc(&drecv, (n + 1) * count * es) == cudaSuccess, "malloc");
    for (ncclRedOp_t op : ops) {
      /* all-reduce of count, then reduce-scatter of n*count, grouped */
      for (size_t i = 0; i < n * count; ++i) put(host.data(), t, i, val(r, i));
      cudaMemcpy(dsend, host.data(), n * count * es, cudaMemcpyHostToDevice);
      CHECK(ncclGroupStart() == ncclSuccess, "group");
      CHECK(ncclAllReduce(dsend, drecv, count, t, op, c, s) == ncclSuccess, "%s", ncclGetLastError(c));
      CHECK(ncclReduceScatter(dsend, (char *)drecv + count * es, count, t, op, c, s) == ncclSuccess,
            "%s", ncclGetLastError(c));
      CHECK(ncclGroupEnd() == ncclSuccess, "group end");
      CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(c, &async);
      CHECK(async == ncclSuccess, "async error: %s", ncclGetLastError(c));
      cudaMemcpy(back.data(), drecv, 2 * count * es, cudaMemcpyDeviceToHost);
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        bad += !reduced_ok(get(back.data(), t, i), op, t, n, i);
        bad += !reduced_ok(get(back.data(), t, count + i), op, t, n, r * count + i);
      }
      CHECK(bad == 0, "N=%d type %d op %d: %zu wrong", n, (int)t, (int)op, bad);
    }
    /* all-gather in place, then broadcast from the last rank */
    for (size_t i = 0; i < count; ++i) put(host.data(), t, i, val(r, i));
    cudaMemcpy((char *)drecv + r * count * es, host.data(), count * es, cudaMemcpyHostToDevice);
    CHECK(ncclAllGather((char *)drecv + r * count * es, drecv, count, t, c, s) == ncclSuccess, "ag");
    CHECK(ncclBroadcast(drecv, dsend, count, t, n - 1, c, s) == ncclSuccess, "bcast");
    cudaStreamSynchronize(s);
    cudaMemcpy(back.data(), drecv, n * count * es, cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) bad += get(back.data(), t, p * count + i) != val(p, i);
    cudaMemcpy(back.data(), dsend, count * es, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < count; ++i) bad += get(back.data(), t, i) != val(0, i);
    CHECK(bad == 0, "N=%d all_gather/broadcast type %d: %zu wrong", n, (int)t, bad);
    cudaFree(dsend);
    cudaFree(drecv);
  }
  /* refused at the call, on every rank alike, before anything is queued */
  float host_buf[4];
  CHECK(ncclAllReduce(host_buf, host_buf, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument &&
            strstr(ncclGetLastError(c), "not CUDA memory"), "a host buffer: %s", ncclGetLastError(c));
  CHECK(ncclAllReduce(nullptr, nullptr, 4, ncclFloat8e4m3, ncclSum, c, s) == ncclInvalidArgument &&
            strstr(ncclGetLastError(c), "not modelled"), "fp8: %s", ncclGetLastError(c));
  CHECK(ncclBroadcast(nullptr, nullptr, 1, ncclFloat32, n, c, s) == ncclInvalidArgument, "root");
  CHECK(ncclCommDestroy(c) == ncclSuccess, "destroy");
  CHECK(ncclCommDestroy(c) == ncclInvalidArgument, "destroy twice");
  cudaStreamDestroy(s);
}

/* A ring in one group: each rank receives from rank - 1 before it sends to
 * rank + 1 (the group runs them together), two messages each, which pair in
 * order; past one chunk of the staging slice. */
static void p2p_ring(int r, int n, ncclUniqueId id) {
  ncclComm_t c = init(r, n, id);
  if (!c) return;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  const size_t count = 300001;
  const int to = (r + 1) % n, from = (r - 1 + n) % n;
  std::vector<float> host(2 * count), back(2 * count);
  for (size_t i = 0; i < count; ++i) host[i] = (float)val(r, i), host[count + i] = (float)val(r, i) + 100;
  float *d = nullptr; /* two messages out, two in */
  CHECK(cudaMalloc((void **)&d, 4 * count * sizeof(float)) == cudaSuccess, "malloc");
  cudaMemcpy(d, host.data(), 2 * count * sizeof(float), cudaMemcpyHostToDevice);
  CHECK(ncclGroupStart() == ncclSuccess, "group");
  CHECK(ncclRecv(d + 2 * count, count, ncclFloat32, from, c, s) == ncclSuccess, "%s", ncclGetLastError(c));
  CHECK(ncclRecv(d + 3 * count, count, ncclFloat32, from, c, s) == ncclSuccess, "%s", ncclGetLastError(c));
  CHECK(ncclSend(d, count, ncclFloat32, to, c, s) == ncclSuccess, "%s", ncclGetLastError(c));
  CHECK(ncclSend(d + count, count, ncclFloat32, to, c, s) == ncclSuccess, "%s", ncclGetLastError(c));
  CHECK(ncclGroupEnd() == ncclSuccess, "group end: %s", ncclGetLastError(c));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(c, &async);
  CHECK(async == ncclSuccess, "async error: %s", ncclGetLastError(c));
  cudaMemcpy(back.data(), d + 2 * count, 2 * count * sizeof(float), cudaMemcpyDeviceToHost);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i)
    bad += back[i] != (float)val(from, i) || back[count + i] != (float)val(from, i) + 100;
  CHECK(bad == 0, "N=%d ring of sends: %zu wrong", n, bad);
  CHECK(ncclSend(d, 1, ncclFloat32, n, c, s) == ncclInvalidArgument &&
            strstr(ncclGetLastError(c), "peer"), "peer out of range: %s", ncclGetLastError(c));
  cudaFree(d);
  ncclCommDestroy(c);
  cudaStreamDestroy(s);
}

/* Rank 0 sends to rank 1, which never receives: rank 0's send waits to its
 * 1 s deadline and fails naming rank 1 (on a GPU it would wait until the
 * abort); then rank 1 receives 11 floats from a send of 10 on a new
 * communicator: refused, naming both sizes. */
static int p2p_pipe[2];

static void p2p_errors(int r, int n, ncclUniqueId id) {
  setenv("FSDP_SIM_NCCL_TIMEOUT_S", r == 0 ? "1" : "60", 1);
  ncclComm_t c = init(r, n, id);
  if (!c) return;
  cudaStream_t s;
  cudaStreamCreate(&s);
  float *d = nullptr;
  cudaMalloc((void **)&d, 64 * sizeof(float));
  if (r == 0) {
    const double t0 = now_s();
    CHECK(ncclSend(d, 1, ncclFloat32, 1, c, s) == ncclSuccess, "queued");
    const ncclResult_t async = wait_async(c);
    CHECK(async == ncclRemoteError && strstr(ncclGetLastError(c), "rank 1's matching ncclRecv"),
          "an unmatched send fails naming its peer: %d %s", (int)async, ncclGetLastError(c));
    CHECK(now_s() - t0 >= 1, "the send must wait for its receive (%.2f s)", now_s() - t0);
    CHECK(ncclCommAbort(c) == ncclSuccess, "abort");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "the failed send ends at the abort");
    CHECK(write(p2p_pipe[1], "p", 1) == 1, "pipe");
  } else {
    char ch;
    CHECK(read(p2p_pipe[0], &ch, 1) == 1, "pipe");
    ncclCommAbort(c);
  }
  cudaStreamSynchronize(s);
  cudaFree(d);
  cudaStreamDestroy(s);
}

static void p2p_sizes(int r, int n, ncclUniqueId id) {
  ncclComm_t c = init(r, n, id);
  if (!c) return;
  cudaStream_t s;
  cudaStreamCreate(&s);
  float *d = nullptr;
  cudaMalloc((void **)&d, 64 * sizeof(float));
  if (r == 0) CHECK(ncclSend(d, 10, ncclFloat32, 1, c, s) == ncclSuccess, "queued");
  else CHECK(ncclRecv(d, 11, ncclFloat32, 0, c, s) == ncclSuccess, "queued");
  const ncclResult_t async = wait_async(c);
  if (r == 1)
    CHECK(async == ncclInvalidUsage &&
              strstr(ncclGetLastError(c), "rank 0 sends 40 bytes to rank 1, which receives 44"),
          "sizes differ: %d %s", (int)async, ncclGetLastError(c));
  else
    CHECK(async == ncclRemoteError && strstr(ncclGetLastError(c), "rank 1 aborted"),
          "the sender sees its peer's abort: %d %s", (int)async, ncclGetLastError(c));
  ncclCommAbort(c);
  cudaStreamSynchronize(s);
  cudaFree(d);
  cudaStreamDestroy(s);
}

static void mismatch(int r, int n, ncclUniqueId id) {
  ncclComm_t c = init(r, n, id);
  if (!c) return;
  cudaStream_t s;
  cudaStreamCreate(&s);
  float *d = nullptr;
  cudaMalloc((void **)&d, 64 * sizeof(float));
  CHECK(ncclAllReduce(d, d, 10 + r, ncclFloat32, ncclSum, c, s) == ncclSuccess, "queued");
  const ncclResult_t async = wait_async(c);
  CHECK(async == ncclInvalidUsage, "differing counts must fail: %d", (int)async);
  CHECK(strstr(ncclGetLastError(c), "rank 0: ncclAllReduce(count 10") &&
            strstr(ncclGetLastError(c), "rank 1: ncclAllReduce(count 11"),
        "the report shows each rank's call: %s", ncclGetLastError(c));
  CHECK(ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, s) == ncclInvalidUsage,
        "a failed communicator refuses new work");
  CHECK(ncclCommAbort(c) == ncclSuccess, "abort");
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "the failed collective ends at the abort");
  cudaFree(d);
  cudaStreamDestroy(s);
}

/* Rank 0 -> rank 1: "I have aborted" (a pipe made before the fork). */
static int abort_pipe[2];

/* Rank 1 issues nothing until rank 0 is done; rank 0's stream waits inside
 * the collective until its own ncclCommAbort, long before the 60 s deadline. */
static void abort_unblocks(int r, int n, ncclUniqueId id) {
  setenv("FSDP_SIM_NCCL_TIMEOUT_S", "60", 1);
  ncclComm_t c = init(r, n, id);
  if (!c) return;
  if (r == 0) {
    cudaStream_t s;
    cudaStreamCreate(&s);
    float *d = nullptr;
    cudaMalloc((void **)&d, sizeof(float));
    CHECK(ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, s) == ncclSuccess, "queued");
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "the collective must be waiting for rank 1");
    const double t0 = now_s();
    CHECK(ncclCommAbort(c) == ncclSuccess, "abort");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync after abort");
    CHECK(now_s() - t0 < 10, "abort must end the wait at once (took %.1f s)", now_s() - t0);
    CHECK(write(abort_pipe[1], "a", 1) == 1, "pipe");
    cudaFree(d);
    cudaStreamDestroy(s);
  } else {
    /* after rank 0 has aborted, rank 1's collective fails at once */
    cudaStream_t s;
    cudaStreamCreate(&s);
    float *d = nullptr;
    cudaMalloc((void **)&d, sizeof(float));
    char ch;
    CHECK(read(abort_pipe[0], &ch, 1) == 1, "pipe");
    const double t0 = now_s();
    ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, s);
    const ncclResult_t async = wait_async(c);
    CHECK(async == ncclRemoteError && strstr(ncclGetLastError(c), "rank 0 aborted"),
          "the peer sees the abort: %d %s", (int)async, ncclGetLastError(c));
    CHECK(now_s() - t0 < 10, "the peer must not wait for the deadline");
    ncclCommAbort(c); /* ends its failed collective, which keeps the stream */
    cudaFree(d);
    cudaStreamDestroy(s);
  }
}

/* FSDP_SIM_NCCL_STALL=1:2: rank 1 never arrives at the 2nd collective; rank
 * 0 fails at its 1 s deadline naming rank 1, then tells rank 1 (a pipe) to
 * abort, which ends the stall. */
static int stall_pipe[2];

static void stall(int r, int n, ncclUniqueId id) {
  setenv("FSDP_SIM_NCCL_STALL", "1:2", 1);
  setenv("FSDP_SIM_NCCL_TIMEOUT_S", r == 0 ? "1" : "60", 1);
  ncclComm_t c = init(r, n, id);
  if (!c) return;
  cudaStream_t s;
  cudaStreamCreate(&s);
  float *d = nullptr;
  cudaMalloc((void **)&d, sizeof(float));
  ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, s); /* #1 runs on both */
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "#1");
  ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, s); /* #2: rank 1 stalls */
  if (r == 1) {
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "rank 1 must be stalled");
    char ch;
    CHECK(read(stall_pipe[0], &ch, 1) == 1, "pipe");
    const double t0 = now_s();
    ncclCommAbort(c);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "the stall ends at abort");
    CHECK(now_s() - t0 < 10, "abort must end the stall at once");
  } else {
    const ncclResult_t async = wait_async(c);
    CHECK(async == ncclRemoteError &&
              strstr(ncclGetLastError(c), "rank(s) 1 did not reach") &&
              strstr(ncclGetLastError(c), "#2"),
          "the peer of a stalled rank fails, naming it: %s", ncclGetLastError(c));
    CHECK(write(stall_pipe[1], "s", 1) == 1, "pipe");
    ncclCommAbort(c);
  }
  cudaFree(d);
  cudaStreamDestroy(s);
}

static void no_leftovers(void) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "fsdp-simnccl-%d-", (int)getpid());
  DIR *d = opendir("/dev/shm");
  int left = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) ++left, fprintf(stderr, "  left: %s\n", e->d_name);
  if (d) closedir(d);
  CHECK(left == 0, "%d segment(s) left in /dev/shm", left);
}

int main(void) {
  for (int n = 1; n <= 4; ++n) {
    const double t0 = now_s();
    const int bad = run_ranks(n, collectives);
    CHECK(bad == 0, "collectives at N = %d: %d rank(s) failed", n, bad);
    printf("collectives f32/f64/bf16 x sum/avg/max, grouped, N = %d: %s (%.1f s)\n", n,
           bad ? "FAILED" : "ok", now_s() - t0);
  }
  for (int n = 1; n <= 4; ++n) {
    const int bad = run_ranks(n, p2p_ring);
    CHECK(bad == 0, "send/recv ring at N = %d: %d rank(s) failed", n, bad);
    printf("ncclSend/ncclRecv ring in a group, paired in order, N = %d: %s\n", n,
           bad ? "FAILED" : "ok");
  }
  CHECK(pipe(p2p_pipe) == 0, "pipe");
  int bad = run_ranks(2, p2p_errors);
  CHECK(bad == 0, "unmatched send: %d", bad);
  bad = run_ranks(2, p2p_sizes);
  CHECK(bad == 0, "p2p sizes: %d", bad);
  printf("an unmatched send fails at the deadline naming its peer; differing sizes: %s\n",
         bad ? "FAILED" : "ok");
  bad = run_ranks(2, mismatch);
  CHECK(bad == 0, "mismatch: %d", bad);
  printf("differing counts reported on both ranks: %s\n", bad ? "FAILED" : "ok");
  CHECK(pipe(abort_pipe) == 0, "pipe");
  bad = run_ranks(2, abort_unblocks);
  CHECK(bad == 0, "abort: %d", bad);
  printf("ncclCommAbort unblocks a waiting stream; the peer sees it: %s\n", bad ? "FAILED" : "ok");
  CHECK(pipe(stall_pipe) == 0, "pipe");
  bad = run_ranks(2, stall);
  CHECK(bad == 0, "stall: %d", bad);
  printf("FSDP_SIM_NCCL_STALL: the peer fails naming the stalled rank: %s\n", bad ? "FAILED" : "ok");
  no_leftovers();
  printf("test_nccl: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
