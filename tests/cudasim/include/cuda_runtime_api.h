/* tests/cudasim/include/cuda_runtime_api.h — the simulator's CUDA runtime API:
 * the host-side types, constants and functions of the subset fsdp uses, with
 * the toolkit's names and values, so that C and C++ sources written against
 * the real header compile unchanged against the simulator (-Dgpu_sim=true).
 * Plain C (C11 and C++17). The device side (kernels, dim3, intrinsics) is in
 * cuda_runtime.h; what the simulator proves and what it cannot judge is
 * listed there.
 *
 * Environment (read once, at the first call):
 *   FSDP_SIM_DEVICES     simulated devices (default 4; 0: cudaErrorNoDevice)
 *   FSDP_SIM_DEVICE_MEM  memory per device, bytes with an optional K/M/G suffix
 *                        (default 80G, an H100's)
 *   FSDP_SIM_DRIVER=old  every call fails with cudaErrorInsufficientDriver, as
 *                        a driver older than the toolkit does
 *   FSDP_SIM_DRIVER=broken  every call fails with cudaErrorInitializationError,
 *                        as an installed driver that cannot start does (a
 *                        kernel module of another version, say) */
#ifndef FSDP_CUDASIM_CUDA_RUNTIME_API_H
#define FSDP_CUDASIM_CUDA_RUNTIME_API_H

#include <stddef.h>

/* Marks every translation unit built against the simulator. */
#define FSDP_CUDA_SIM 1
#define CUDART_VERSION 13000
#define CUDA_VERSION 13000
#define CUDART_CB

#ifdef __cplusplus
extern "C" {
#endif

/* The values are the toolkit's (driver_types.h). */
typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorIllegalInstruction = 715,
  cudaErrorMisalignedAddress = 716,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotPermitted = 800,
  cudaErrorUnknown = 999
} cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef void (*cudaHostFn_t)(void *userData);

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void *devicePointer;
  void *hostPointer;
};

/* The fields fsdp and its tests read, with an H100 SXM's values. */
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;      /* 48 KiB without opt-in */
  size_t sharedMemPerBlockOptin; /* 227 KiB */
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major, minor;
  int multiProcessorCount;
  int maxThreadsPerMultiProcessor;
};

/* The device attributes the simulator answers (cudaDeviceGetAttribute; any
 * other is refused), with the toolkit's values and an H100's answers. */
enum cudaDeviceAttr {
  cudaDevAttrMaxSharedMemoryPerBlock = 8,          /* 49152: 48 KiB without opt-in */
  cudaDevAttrComputeCapabilityMajor = 75,          /* 9: sm_90 */
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81, /* 233472: 228 KiB */
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,    /* 232448: 227 KiB */
  cudaDevAttrReservedSharedMemoryPerBlock = 111    /* 1024: the runtime's, per block */
};

/* The one function attribute modelled (cudaFuncSetAttribute): the most
 * dynamic shared memory a launch of the kernel may ask on the current device,
 * 48 KiB until raised, at most cudaDevAttrMaxSharedMemoryPerBlockOptin. */
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

#define cudaStreamDefault 0x0u
#define cudaStreamNonBlocking 0x1u
#define cudaEventDefault 0x0u
#define cudaEventBlockingSync 0x1u
#define cudaEventDisableTiming 0x2u
#define cudaHostAllocDefault 0x0u
#define cudaHostAllocPortable 0x1u
#define cudaHostAllocMapped 0x2u
#define cudaHostAllocWriteCombined 0x4u

/* errors */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t error);
const char *cudaGetErrorName(cudaError_t error);

/* devices */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
cudaError_t cudaDriverGetVersion(int *driverVersion);
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);

/* kernels (C++ also takes the kernel itself: cuda_runtime.h) */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

/* memory */
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);

/* streams */
cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int *priority);
cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData);

/* events */
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

#ifdef __cplusplus
}
#endif
#endif
