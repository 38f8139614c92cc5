/* tests/cudasim/sim_test.h — what the simulator's own test programs share
 * (runtime/test_sim.cc, cublas/test_*.cc, nccl/test_*.cc; STYLE: test
 * helpers live once): CHECK, which counts checks and failures and prints
 * each failure with its place and process; sim_run_ranks, which forks the
 * ranks of a multi-process test; a monotonic clock; bf16 conversions.
 * Header-only C++: each program includes it once. */
#ifndef FSDP_CUDASIM_SIM_TEST_H
#define FSDP_CUDASIM_SIM_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <vector>

static int failures, checks;

#define CHECK(cond, ...)                                                                      \
  do {                                                                                        \
    ++checks;                                                                                 \
    if (!(cond)) {                                                                            \
      ++failures;                                                                             \
      fprintf(stderr, "%s:%d: [pid %d] FAILED %s: ", __FILE__, __LINE__, (int)getpid(), #cond); \
      fprintf(stderr, __VA_ARGS__);                                                           \
      fputc('\n', stderr);                                                                    \
    }                                                                                         \
  } while (0)

/* Runs body(rank) in n forked processes, each exiting 1 when one of its
 * CHECKs failed; returns how many ranks failed. */
template <class Body> static int sim_run_ranks(int n, Body body) {
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    fflush(stdout), fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
      failures = 0;
      body(r);
      fflush(stderr);
      _exit(failures ? 1 : 0);
    }
    kids.push_back(pid);
  }
  int bad = 0;
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    bad += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  return bad;
}

static inline double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline uint16_t bf16_of(float x) { /* nearest even, as nccl.h says */
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float f_of(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

#endif
