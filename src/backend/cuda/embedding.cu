/* src/backend/cuda/embedding.cu — token + position embedding forward and backward
 * (fp32 and bf16 storage; gradients fp32), or the token embedding alone (no
 * wpe: the RoPE models). The position gradient is summed over the batch in
 * order; the token gradient is a float atomicAdd scatter. */
#include "backend/cuda/cuda_internal.cuh"

template <typename T>
__global__ void embedding_forward_kernel(T *out, const int *tokens, const T *wte, const T *wpe,
                                         int T_, int C, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t bt = i / C, c = i % C, t = bt % T_;
    const float e = load(wte + (size_t)tokens[bt] * C + c);
    store(out + i, wpe ? e + load(wpe + t * C + c) : e);
  }
}

/* One thread per (t, c): adds dout over b in the CPU's order, starting from
 * the existing dwpe value, so the result is the CPU's bit for bit. */
template <typename T>
__global__ void embedding_dwpe_kernel(float *dwpe, const T *dout, int B, int T_, int C) {
  const size_t n = (size_t)T_ * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += load(dout + (size_t)b * n + i);
    dwpe[i] = acc;
  }
}

/* Rows of dwte that several positions share (a repeated token) are added to by
 * several threads; atomicAdd orders them as they come. A deterministic scatter
 * would need the positions sorted by token first. */
template <typename T>
__global__ void embedding_dwte_kernel(float *dwte, const T *dout, const int *tokens, int C,
                                      size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t bt = i / C, c = i % C;
    atomicAdd(dwte + (size_t)tokens[bt] * C + c, load(dout + i));
  }
}

template <typename T>
static fsdp_status_t embedding_forward(T *out, const int *tokens, const T *wte, const T *wpe,
                                       int B, int T_, int C, cudaStream_t s) {
  if (B <= 0 || T_ <= 0 || C <= 0) return FSDP_SUCCESS;
  const size_t n = (size_t)B * T_ * C;
  FSDP_LAUNCH(embedding_forward_kernel<T>, fsdp_grid(n, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, s, out,
              tokens, wte, wpe, T_, C, n);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

template <typename T>
static fsdp_status_t embedding_backward(float *dwte, float *dwpe, const T *dout,
                                        const int *tokens, int B, int T_, int C,
                                        cudaStream_t s) {
  if (B <= 0 || T_ <= 0 || C <= 0) return FSDP_SUCCESS;
  const size_t n = (size_t)B * T_ * C, tc = (size_t)T_ * C;
  if (dwpe) {
    FSDP_LAUNCH(embedding_dwpe_kernel<T>, fsdp_grid(tc, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, s,
                dwpe, dout, B, T_, C);
    LAUNCH_CHECK();
  }
  FSDP_LAUNCH(embedding_dwte_kernel<T>, fsdp_grid(n, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0, s, dwte,
              dout, tokens, C, n);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_cuda_embedding_forward(const fsdp_embedding_forward_args_t *a,
                                          fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("embedding_forward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return embedding_forward(as<S>(a->out), a->tokens, as<S>(a->wte), as<S>(a->wpe), a->B, a->T,
                             a->C, s);
  });
}

fsdp_status_t fsdp_cuda_embedding_backward(const fsdp_embedding_backward_args_t *a,
                                           fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("embedding_backward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return embedding_backward(a->dwte, a->dwpe, as<S>(a->dout), a->tokens, a->B, a->T, a->C, s);
  });
}
