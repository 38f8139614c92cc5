/* tests/cudasim/runtime/sim_internal.h — what the simulator's runtime
 * (runtime.cc: devices, memory, streams, events, errors) and its kernel
 * executor (exec.cc: launches, fibers, barriers, warp operations, shared
 * memory) share. Not seen by the code under test. */
#ifndef FSDP_CUDASIM_SIM_INTERNAL_H
#define FSDP_CUDASIM_SIM_INTERNAL_H

#include <cuda_runtime.h>

#include <functional>
#include <string>

namespace fsdp_sim {

/* An sm_90 block's shared memory: without the opt-in, and the most with it. */
const size_t kSharedPerBlock = 48 * 1024;
const size_t kSharedOptin = 227 * 1024;

/* One kernel launch, as queued on its stream. */
struct launch {
  std::string name, site; /* the kernel and file:line of the launch */
  const void *func;       /* the kernel: its attributes' key */
  dim3 grid, block;
  size_t shared_bytes;
  size_t shared_limit; /* the kernel's dynamic shared memory limit on device */
  int device;
  std::function<void()> body;
};

/* Runs every block of l on the calling thread (a stream's worker). Returns
 * cudaSuccess, or the fault that stopped it (already reported on stderr). */
cudaError_t run_launch(const launch &l);

/* Checks l's configuration as an H100 would; on refusal returns the error
 * CUDA gives and fills why. */
cudaError_t check_launch(const launch &l, std::string *why);

/* runtime.cc: queues l on stream (NULL: the legacy default stream of the
 * current device) after the launch checks. */
cudaError_t enqueue_launch(launch *l, cudaStream_t stream);

/* runtime.cc: the geometry of l in words, for messages. */
std::string describe(const launch &l);

/* runtime.cc: a line on stderr, prefixed "cudasim: ". */
void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

} // namespace fsdp_sim

#endif
