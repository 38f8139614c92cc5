/* tests/cudasim/nccl/test_shm_group.cc — the simulated NCCL's core
 * (shm_group.cc) between forked ranks, N = 2..4: every collective, type and
 * reduction against references computed here from nccl.h's rules (integer
 * data, so sums are exact; bf16 rounding order; AVG within include/fsdp/
 * comm.h's bound), counts of 0, 1, 7 and past one staging round, in place
 * and out of place; then the failure paths: differing calls reported with
 * each rank's call, a dead peer, a peer's abort, a local abort from another
 * thread, the deadline, a stall ended by abort, bad init arguments, and no
 * name left in /dev/shm by any of them. Exit 0 when every check passes. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "../sim_test.h"
#include "shm_group.h"

static char prefix[64];
static int names_made;

static std::string fresh_name() {
  return std::string(prefix) + "-" + std::to_string(++names_made);
}

/* ---- values and references ---- */

/* Rank r's element i: a small integer, nonzero so products stay informative. */
static double val(int r, size_t i) {
  const int v = (int)((r * 7 + i * 3) % 9) - 4;
  return v == 0 ? 1 : v;
}

static void put(void *b, int t, size_t i, double v) {
  switch (t) {
  case ncclInt8: ((int8_t *)b)[i] = (int8_t)v; break;
  case ncclUint8: ((uint8_t *)b)[i] = (uint8_t)(int)v; break;
  case ncclInt32: ((int32_t *)b)[i] = (int32_t)v; break;
  case ncclUint32: ((uint32_t *)b)[i] = (uint32_t)(int64_t)v; break;
  case ncclInt64: ((int64_t *)b)[i] = (int64_t)v; break;
  case ncclUint64: ((uint64_t *)b)[i] = (uint64_t)(int64_t)v; break;
  case ncclFloat32: ((float *)b)[i] = (float)v; break;
  case ncclFloat64: ((double *)b)[i] = v; break;
  case ncclBfloat16: ((uint16_t *)b)[i] = bf16_of((float)v); break;
  }
}

/* out[0] = the reduction over ranks of val(., i) in the type's arithmetic. */
static void reference(void *out, int t, int op, int n, size_t i) {
  if (t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16) {
    /* every value and partial result is a small integer: exact in all three */
    double acc = val(0, i);
    for (int r = 1; r < n; ++r) {
      const double x = val(r, i);
      acc = op == ncclSum || op == ncclAvg ? acc + x : op == ncclProd ? acc * x
            : op == ncclMax ? fmax(acc, x) : fmin(acc, x);
    }
    put(out, t, 0, acc); /* AVG: the sum here; checked against the bound */
    return;
  }
  /* integers: wrap-around sums and products, max and min in the type's order */
  const bool is_unsigned = t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
  const int bits = t == ncclInt8 || t == ncclUint8 ? 8 : t == ncclInt32 || t == ncclUint32 ? 32 : 64;
  const unsigned long long mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
  auto in_type = [&](double v) { return (unsigned long long)(long long)v & mask; };
  auto less = [&](unsigned long long a, unsigned long long b) {
    if (is_unsigned) return a < b;
    const unsigned long long sign = 1ull << (bits - 1); /* compare sign-extended */
    return (long long)((a ^ sign) - sign) < (long long)((b ^ sign) - sign);
  };
  unsigned long long acc = in_type(val(0, i));
  for (int r = 1; r < n; ++r) {
    const unsigned long long x = in_type(val(r, i));
    acc = (op == ncclSum || op == ncclAvg ? acc + x : op == ncclProd ? acc * x
           : op == ncclMax ? (less(acc, x) ? x : acc) : (less(x, acc) ? x : acc)) & mask;
  }
  if (op == ncclAvg) { /* C division in the type: truncation toward zero */
    if (is_unsigned) acc /= (unsigned long long)n;
    else {
      const unsigned long long sign = 1ull << (bits - 1);
      acc = (unsigned long long)((long long)((acc ^ sign) - sign) / n) & mask;
    }
  }
  memcpy(out, &acc, bits / 8); /* little-endian: the low bytes are the value */
}

static double as_double(const void *b, int t, size_t i) {
  return t == ncclFloat32 ? ((const float *)b)[i] : t == ncclFloat64 ? ((const double *)b)[i]
                                                  : f_of(((const uint16_t *)b)[i]);
}

/* 1 when recv[i] is the reduction: bitwise, or for floating AVG within
 * comm.h's bound ((1 + u)^(N+1) - 1) * sum |x| / N around the exact mean. */
static bool reduced_ok(const void *recv, int t, int op, int n, size_t i) {
  const size_t es = sim_type_size(t);
  if (op == ncclAvg && (t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16)) {
    double sum = 0, mass = 0;
    for (int r = 0; r < n; ++r) sum += val(r, i), mass += fabs(val(r, i));
    const double u = t == ncclBfloat16 ? ldexp(1, -8) : t == ncclFloat32 ? ldexp(1, -24)
                                                                        : ldexp(1, -53);
    /* expm1/log1p: (1 + 2^-53) rounds to 1 in double, the bound must not */
    return fabs(as_double(recv, t, i) - sum / n) <= expm1((n + 1) * log1p(u)) * mass / n;
  }
  unsigned char w[8];
  reference(w, t, op, n, i);
  return memcmp((const unsigned char *)recv + i * es, w, es) == 0;
}

/* ---- the collectives, every type and op ---- */

static const int types[] = {ncclInt8,  ncclUint8,   ncclInt32,   ncclUint32,  ncclInt64,
                            ncclUint64, ncclFloat32, ncclFloat64, ncclBfloat16};

static void collectives(sim_group *g, int n, int me) {
  uint64_t seq = 0;
  std::string err;
  for (int t : types) {
    const size_t es = sim_type_size(t);
    /* past one staging round for every kind (reduce-scatter's round is STAGE / (es N)),
     * for one type of each element size (the rounds depend on nothing else) */
    const bool one_of_size = t == ncclUint8 || t == ncclBfloat16 || t == ncclFloat32 ||
                             t == ncclFloat64;
    const size_t counts[] = {0, 1, 7, SIM_NCCL_STAGE / es + 5};
    for (size_t count : counts) {
      if (count > 7 && !one_of_size) continue;
      const bool big = count > 7;
      for (int op = 0; op < ncclNumOps; ++op) {
        if (big && op != ncclSum) continue; /* the rounds are the same for every op */
        for (int inplace = 0; inplace < 2; ++inplace) {
          /* all-reduce */
          std::vector<unsigned char> send(count * es + 1), recv(count * es + 1);
          for (size_t i = 0; i < count; ++i) put(send.data(), t, i, val(me, i));
          void *out = inplace ? send.data() : recv.data();
          sim_desc d = {SIM_ALL_REDUCE, t, op, -1, count, ++seq};
          CHECK(sim_group_run(g, d, send.data(), out, &err) == ncclSuccess, "%s", err.c_str());
          size_t bad = 0;
          for (size_t i = 0; i < count; ++i) bad += !reduced_ok(out, t, op, n, i);
          CHECK(bad == 0, "all_reduce %s %s count %zu inplace %d: %zu wrong", sim_type_name(t),
                sim_op_name(op), count, inplace, bad);
          /* reduce-scatter: rank p's block of send is val(me, p*count + i) */
          std::vector<unsigned char> big(n * count * es + 1), part(count * es + 1);
          for (size_t i = 0; i < n * count; ++i) put(big.data(), t, i, val(me, i));
          void *rs_out = inplace ? big.data() + me * count * es : part.data();
          d = {SIM_REDUCE_SCATTER, t, op, -1, count, ++seq};
          CHECK(sim_group_run(g, d, big.data(), rs_out, &err) == ncclSuccess, "%s", err.c_str());
          bad = 0;
          std::vector<unsigned char> whole(n * count * es + 1);
          for (size_t i = 0; i < count; ++i) {
            memcpy(whole.data() + (me * count + i) * es, (unsigned char *)rs_out + i * es, es);
            bad += !reduced_ok(whole.data(), t, op, n, me * count + i);
          }
          CHECK(bad == 0, "reduce_scatter %s %s count %zu inplace %d: %zu wrong",
                sim_type_name(t), sim_op_name(op), count, inplace, bad);
        }
      }
      for (int inplace = 0; inplace < 2; ++inplace) {
        /* all-gather: rank p contributes val(p, i) */
        std::vector<unsigned char> all(n * count * es + 1), mine(count * es + 1);
        for (size_t i = 0; i < count; ++i) put(mine.data(), t, i, val(me, i));
        const void *src = mine.data();
        if (inplace) {
          memcpy(all.data() + me * count * es, mine.data(), count * es);
          src = all.data() + me * count * es;
        }
        sim_desc d = {SIM_ALL_GATHER, t, -1, -1, count, ++seq};
        CHECK(sim_group_run(g, d, src, all.data(), &err) == ncclSuccess, "%s", err.c_str());
        std::vector<unsigned char> want(n * count * es + 1);
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < count; ++i) put(want.data(), t, p * count + i, val(p, i));
        CHECK(memcmp(all.data(), want.data(), n * count * es) == 0,
              "all_gather %s count %zu inplace %d", sim_type_name(t), count, inplace);
        /* broadcast from the last rank */
        const int root = n - 1;
        std::vector<unsigned char> b(count * es + 1), r2(count * es + 1);
        for (size_t i = 0; i < count; ++i) put(b.data(), t, i, val(me, i));
        d = {SIM_BROADCAST, t, -1, root, count, ++seq};
        void *bout = inplace ? b.data() : r2.data();
        CHECK(sim_group_run(g, d, b.data(), bout, &err) == ncclSuccess, "%s", err.c_str());
        for (size_t i = 0; i < count; ++i) put(want.data(), t, i, val(root, i));
        CHECK(memcmp(bout, want.data(), count * es) == 0, "broadcast %s count %zu inplace %d",
              sim_type_name(t), count, inplace);
      }
    }
  }
}

/* bf16 sums combine in rank order and round at each step (nearest even):
 * 1 + 2^-8 + 2^-8 + 2^-8 is 1 that way (each step is a tie, kept even), but
 * 1 + 2^-7 if rounded once at the end. */
static void bf16_rounding(sim_group *g, int n, int me) {
  uint16_t x = bf16_of(me == 0 ? 1.0f : ldexpf(1, -8)), y = 0;
  std::string err;
  sim_desc d = {SIM_ALL_REDUCE, ncclBfloat16, ncclSum, -1, 1, 1000};
  CHECK(sim_group_run(g, d, &x, &y, &err) == ncclSuccess, "%s", err.c_str());
  CHECK(f_of(y) == 1.0f, "bf16 sum over %d ranks = %.9g, want 1 (rounded at each step)", n,
        f_of(y));
  /* AVG on bf16: each contribution times bf16(1/N), rounded, then summed */
  const float s = f_of(bf16_of(1.0f / n));
  x = bf16_of(3.0f);
  d = {SIM_ALL_REDUCE, ncclBfloat16, ncclAvg, -1, 1, 1001};
  CHECK(sim_group_run(g, d, &x, &y, &err) == ncclSuccess, "%s", err.c_str());
  float want = f_of(bf16_of(3.0f * s));
  for (int r = 1; r < n; ++r) want = f_of(bf16_of(want + f_of(bf16_of(3.0f * s))));
  CHECK(y == bf16_of(want), "bf16 avg of 3 over %d ranks = %.9g, want %.9g", n, f_of(y), want);
}

static sim_group joined(const std::string &name, int n, int r, double timeout = 30) {
  sim_group g;
  g.timeout_s = timeout;
  std::string err;
  const ncclResult_t res = sim_group_join(&g, name.c_str(), n, r, &err);
  CHECK(res == ncclSuccess, "join %s rank %d/%d: %s", name.c_str(), r, n, err.c_str());
  return g;
}

static void test_collectives(int n) {
  const std::string name = fresh_name();
  const double t0 = now_s();
  const int bad = sim_run_ranks(n, [&](int r) {
    sim_group g = joined(name, n, r);
    if (!g.seg) return;
    collectives(&g, n, r);
    bf16_rounding(&g, n, r);
    sim_group_leave(&g);
  });
  CHECK(bad == 0, "collectives at N = %d: %d rank(s) failed", n, bad);
  printf("collectives, every type and op, N = %d: %s (%.1f s)\n", n, bad ? "FAILED" : "ok",
         now_s() - t0);
}

/* ---- failure paths ---- */

static void test_mismatch(void) {
  const std::string name = fresh_name();
  const int bad = sim_run_ranks(2, [&](int r) {
    sim_group g = joined(name, 2, r);
    float buf[16] = {0}, out[16];
    std::string err;
    sim_desc d = {SIM_ALL_REDUCE, ncclFloat32, ncclSum, -1, (uint64_t)(10 + r), 1};
    CHECK(sim_group_run(&g, d, buf, out, &err) == ncclInvalidUsage, "want ncclInvalidUsage");
    CHECK(err.find("rank 0: ncclAllReduce(count 10, ncclFloat32, ncclSum)") != std::string::npos &&
              err.find("rank 1: ncclAllReduce(count 11, ncclFloat32, ncclSum)") != std::string::npos,
          "message must show each rank's call: %s", err.c_str());
    /* a different kind / type / root is named the same way */
    d = r == 0 ? sim_desc{SIM_BROADCAST, ncclFloat32, -1, 0, 4, 2}
               : sim_desc{SIM_BROADCAST, ncclBfloat16, -1, 1, 4, 2};
    CHECK(sim_group_run(&g, d, buf, out, &err) == ncclInvalidUsage, "want ncclInvalidUsage");
    CHECK(err.find("ncclBfloat16, root 1") != std::string::npos, "%s", err.c_str());
    if (r == 0) fprintf(stderr, "  (expected) mismatch report: %s\n", err.c_str());
    sim_group_leave(&g);
  });
  CHECK(bad == 0, "mismatch test: %d rank(s) failed", bad);
  printf("differing counts, types, roots reported on every rank: %s\n", bad ? "FAILED" : "ok");
}

static void test_dead_peer(void) {
  const std::string name = fresh_name();
  const int bad = sim_run_ranks(2, [&](int r) {
    sim_group g = joined(name, 2, r, 60);
    if (r == 1) _exit(0); /* dies without a word */
    float x = 1, y;
    std::string err;
    const double t0 = now_s();
    sim_desc d = {SIM_ALL_REDUCE, ncclFloat32, ncclSum, -1, 1, 1};
    CHECK(sim_group_run(&g, d, &x, &y, &err) == ncclRemoteError, "want ncclRemoteError");
    CHECK(err.find("rank 1") != std::string::npos && err.find("exited") != std::string::npos,
          "%s", err.c_str());
    CHECK(now_s() - t0 < 10, "a dead peer must be noticed long before the 60 s deadline");
    sim_group_leave(&g);
  });
  CHECK(bad == 0, "dead peer test: %d rank(s) failed", bad);
  printf("a peer that exits is reported by rank: %s\n", bad ? "FAILED" : "ok");
}

static void test_peer_abort_and_deadline(void) {
  std::string name = fresh_name();
  int bad = sim_run_ranks(2, [&](int r) {
    sim_group g = joined(name, 2, r, 60);
    std::string err;
    float x = 1, y;
    sim_desc d = {SIM_ALL_REDUCE, ncclFloat32, ncclSum, -1, 1, 1};
    if (r == 1) {
      sim_group_abort(&g); /* aborts instead of joining the collective */
    } else {
      const double t0 = now_s();
      CHECK(sim_group_run(&g, d, &x, &y, &err) == ncclRemoteError, "want ncclRemoteError");
      CHECK(err.find("rank 1 aborted") != std::string::npos, "%s", err.c_str());
      CHECK(now_s() - t0 < 10, "a peer's abort must end the wait at once");
    }
    sim_group_leave(&g);
  });
  CHECK(bad == 0, "peer abort test: %d rank(s) failed", bad);
  name = fresh_name();
  bad = sim_run_ranks(2, [&](int r) {
    sim_group g = joined(name, 2, r);
    g.timeout_s = r == 0 ? 0.5 : 30;
    std::string err;
    float x = 1;
    sim_desc d = {SIM_ALL_GATHER, ncclFloat32, -1, -1, 1, 7};
    float all[2];
    if (r == 0) {
      CHECK(sim_group_run(&g, d, &x, all, &err) == ncclRemoteError, "want ncclRemoteError");
      CHECK(err.find("rank(s) 1 did not reach") != std::string::npos &&
                err.find("ncclAllGather(sendcount 1, ncclFloat32) #7") != std::string::npos,
            "%s", err.c_str());
      fprintf(stderr, "  (expected) deadline report: %s\n", err.c_str());
      sim_group_abort(&g); /* ends the peer's stall */
    } else {
      /* the stall: never arrives; rank 0's abort, after its deadline, ends it */
      CHECK(sim_group_stall(&g, d, &err) == ncclRemoteError &&
                err.find("rank 0 aborted") != std::string::npos, "%s", err.c_str());
    }
    sim_group_leave(&g);
  });
  CHECK(bad == 0, "deadline test: %d rank(s) failed", bad);
  printf("a peer's abort, and the deadline naming the missing rank: %s\n", bad ? "FAILED" : "ok");
}

/* ncclCommAbort's core: another thread of the waiting rank raises the flag. */
static void test_local_abort(void) {
  const std::string name = fresh_name();
  const int bad = sim_run_ranks(2, [&](int r) {
    std::atomic<int> aborted{0};
    sim_group g = joined(name, 2, r, 60);
    g.abort = &aborted;
    if (r == 0) {
      ncclResult_t res = ncclSuccess;
      std::string err;
      const double t0 = now_s();
      std::thread waiter([&] {
        float x = 1, y;
        sim_desc d = {SIM_ALL_REDUCE, ncclFloat32, ncclSum, -1, 1, 1};
        res = sim_group_run(&g, d, &x, &y, &err);
      });
      const struct timespec ms = {0, 100000000};
      nanosleep(&ms, nullptr); /* not synchronisation: the waiter fails either way */
      aborted.store(1);
      sim_group_abort(&g);
      waiter.join();
      CHECK(res == ncclRemoteError && err.find("aborted") != std::string::npos, "%s", err.c_str());
      CHECK(now_s() - t0 < 10, "abort must unblock the waiter at once");
    } else {
      /* stalls; rank 0's abort ends it */
      sim_desc d = {SIM_ALL_REDUCE, ncclFloat32, ncclSum, -1, 1, 1};
      std::string err;
      CHECK(sim_group_stall(&g, d, &err) == ncclRemoteError &&
                err.find("rank 0 aborted") != std::string::npos, "%s", err.c_str());
    }
    sim_group_leave(&g);
  });
  CHECK(bad == 0, "local abort test: %d rank(s) failed", bad);
  printf("abort from another thread unblocks a waiting rank and ends a peer's stall: %s\n",
         bad ? "FAILED" : "ok");
}

static void test_bad_init(void) {
  std::string name = fresh_name();
  int bad = sim_run_ranks(2, [&](int r) {
    sim_group g;
    g.timeout_s = 2;
    std::string err;
    /* rank 0 says 2 ranks, rank 1 says 3: whoever comes second is refused */
    const ncclResult_t res = sim_group_join(&g, name.c_str(), r == 0 ? 2 : 3, r, &err);
    CHECK(res != ncclSuccess, "a disagreement on nranks must fail");
    CHECK(err.find("nranks") != std::string::npos || err.find("did not reach") != std::string::npos,
          "%s", err.c_str());
  });
  CHECK(bad == 0, "nranks mismatch: %d rank(s) failed", bad);
  name = fresh_name();
  bad = sim_run_ranks(2, [&](int) {
    sim_group g;
    g.timeout_s = 2;
    std::string err;
    const ncclResult_t res = sim_group_join(&g, name.c_str(), 2, 0, &err); /* both rank 0 */
    CHECK(res != ncclSuccess, "two rank 0s must fail");
    CHECK(err.find("already taken") != std::string::npos ||
              err.find("rank(s) 1 did not reach") != std::string::npos, "%s", err.c_str());
  });
  CHECK(bad == 0, "duplicate rank: %d rank(s) failed", bad);
  name = fresh_name();
  sim_group g;
  g.timeout_s = 0.3;
  std::string err;
  CHECK(sim_group_join(&g, name.c_str(), 3, 2, &err) == ncclRemoteError &&
            err.find("rank(s) 0, 1 did not reach ncclCommInitRank of 3 ranks") != std::string::npos,
        "%s", err.c_str());
  printf("init: differing nranks, a rank taken twice, missing ranks: ok unless reported\n");
}

/* Every name this program made is gone from /dev/shm. */
static void test_no_leftovers(void) {
  DIR *d = opendir("/dev/shm");
  CHECK(d != NULL, "cannot list /dev/shm");
  if (!d) return;
  int left = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strncmp(e->d_name, prefix + 1, strlen(prefix + 1)) == 0) {
      ++left;
      fprintf(stderr, "  left in /dev/shm: %s\n", e->d_name);
    }
  closedir(d);
  CHECK(left == 0, "%d segment name(s) left in /dev/shm", left);
  printf("nothing left in /dev/shm: %s\n", left ? "FAILED" : "ok");
}

int main(void) {
  snprintf(prefix, sizeof prefix, "/simnccl-test-%d", (int)getpid());
  for (int n = 2; n <= 4; ++n) test_collectives(n);
  test_mismatch();
  test_dead_peer();
  test_peer_abort_and_deadline();
  test_local_abort();
  test_bad_init();
  test_no_leftovers();
  printf("test_shm_group: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
