/* src/backend/cuda/attention_cudnn.cpp — bf16 causal attention through cuDNN's fused
 * flash SDPA, forward (keeping the softmax stats) and backward, with the cuDNN
 * frontend's graph API (header-only C++, pinned by scripts/cudnn-headers.sh).
 * The frontend's dynamic loading resolves every cuDNN call with dlsym on the
 * handle opened here, so libfsdp has no DT_NEEDED on libcudnn. Host code only
 * (the host C++ compiler); attention_cudnn.h documents the contract.
 *
 * Why graphs per shape: building one (operation graph, heuristics, plan) takes
 * tens to hundreds of milliseconds; executing one is an enqueue. The cache
 * and each device's builder handle (the plans were built with it) are
 * deliberately never destroyed: a frontend graph destroyed by a static
 * destructor after the CUDA runtime has gone would call into a dead cuDNN at
 * exit. The per-stream handles and buffers go at
 * fsdp_cudnn_attention_release (the CUDA table's release). */
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>
#include <dlfcn.h>
#include <link.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

extern "C" {
#include "core/internal.h"
}
#include "backend/cuda/attention_cudnn.h"

/* The library the frontend's dynamic loading takes every symbol from. */
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}

namespace fe = cudnn_frontend;

namespace {

/* The variant pack's tensor ids. */
enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

const size_t kMinVersion = 90000; /* cuDNN 9.0.0: flash SDPA forward and backward in bf16 */

/* ---- opening cuDNN ---- */

std::once_flag load_once;
bool load_ok;
char load_text[640];

void load(void) {
  const char *env = getenv("FSDP_CUDNN_LIBRARY");
  const char *name = env && *env ? env : "libcudnn.so.9";
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(load_text, sizeof load_text, "cuDNN not found: cannot open %s: %s (install cuDNN 9 "
             "for CUDA 13, e.g. the nvidia-cudnn-cu13 wheel, and put its lib directory on "
             "LD_LIBRARY_PATH, or set FSDP_CUDNN_LIBRARY to the library's path)", name, dlerror());
    return;
  }
  const char *path = name;
  struct link_map *map = nullptr;
  if (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name)
    path = map->l_name;
  fe::cudnn_dlhandle = lib;
  size_t v = 0;
  try {
    v = fe::detail::get_backend_version();
  } catch (const std::exception &e) {
    snprintf(load_text, sizeof load_text, "cuDNN at %s is not usable: %s", path, e.what());
    return;
  }
  if (v < kMinVersion) {
    snprintf(load_text, sizeof load_text, "cuDNN at %s is version %zu.%zu.%zu; fused attention "
             "needs 9.0.0 or newer", path, v / 10000, v % 10000 / 100, v % 100);
    return;
  }
  snprintf(load_text, sizeof load_text, "cudnn %zu.%zu.%zu (%s)", v / 10000, v % 10000 / 100,
           v % 100, path);
  load_ok = true;
}

/* ---- per-stream handles and buffers, per-shape graphs ---- */

struct stream_slot {
  int device;
  cudaStream_t stream;
  cudnnHandle_t handle; /* bound to stream once, at creation */
  void *workspace;      /* the largest workspace a graph run on this stream needed */
  size_t workspace_bytes;
};

struct shape_graphs {
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  int64_t fwd_workspace, bwd_workspace;
};

typedef std::array<int, 6> shape_key; /* device, B, T, NH, NKV, HS */

std::mutex &lock() {
  static std::mutex &m = *new std::mutex;
  return m;
}
/* A deque: a slot's address stays valid while others are added. */
std::deque<stream_slot> &slots() {
  static std::deque<stream_slot> &v = *new std::deque<stream_slot>;
  return v;
}
std::map<shape_key, shape_graphs> &graphs() {
  static std::map<shape_key, shape_graphs> &m = *new std::map<shape_key, shape_graphs>;
  return m;
}

fsdp_status_t cudnn_side_cuda_fail(cudaError_t e, const char *what) {
  return fsdp_error(e == cudaErrorMemoryAllocation ? FSDP_ERR_OUT_OF_MEMORY : FSDP_ERR_SYSTEM,
                    "cuDNN attention: %s: %s", what, cudaGetErrorString(e));
}

fsdp_status_t fe_fail(const fe::error_t &e, const char *what, const shape_key &k) {
  return fsdp_error(FSDP_ERR_UNSUPPORTED, "cuDNN attention %s (B %d, T %d, %d heads of %d, %d "
                    "KV heads): %s", what, k[1], k[2], k[3], k[5], k[4], e.err_msg.c_str());
}

#define FE_TRY(expr, what, key)                                                     \
  do {                                                                              \
    const fe::error_t fe_try_e_ = (expr);                                           \
    if (fe_try_e_.is_bad()) return fe_fail(fe_try_e_, what, key);                   \
  } while (0)

/* The handle of stream on the current device, made on first use. Graphs are
 * built with the slot of stream nullptr, which runs nothing: a stream that
 * only asked which kernel runs (and may be destroyed, its address reused)
 * gets no handle. */
fsdp_status_t slot_for(cudaStream_t stream, stream_slot **out) {
  int device;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return cudnn_side_cuda_fail(e, "cudaGetDevice");
  for (stream_slot &s : slots())
    if (s.device == device && s.stream == stream) {
      *out = &s;
      return FSDP_SUCCESS;
    }
  cudnnHandle_t h = nullptr;
  cudnnStatus_t st = fe::detail::create_handle(&h);
  if (st == CUDNN_STATUS_SUCCESS) {
    st = fe::detail::set_stream(h, stream);
    if (st != CUDNN_STATUS_SUCCESS) fe::detail::destroy_handle(h);
  }
  if (st != CUDNN_STATUS_SUCCESS)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "cuDNN attention: a handle for device %d: %s", device,
                      fe::detail::get_error_string(st));
  slots().push_back(stream_slot{device, stream, h, nullptr, 0});
  *out = &slots().back();
  return FSDP_SUCCESS;
}

/* *buf holds at least need bytes. The old buffer may still be read by work
 * queued on the stream: cudaFree waits for the device first. */
fsdp_status_t grow_buffer(void **buf, size_t *have, size_t need, const char *what) {
  if (need <= *have) return FSDP_SUCCESS;
  if (*buf) {
    cudaError_t e = cudaFree(*buf);
    *buf = nullptr, *have = 0;
    if (e != cudaSuccess) return cudnn_side_cuda_fail(e, what);
  }
  cudaError_t e = cudaMalloc(buf, need);
  if (e != cudaSuccess) {
    *buf = nullptr;
    return cudnn_side_cuda_fail(e, what);
  }
  *have = need;
  return FSDP_SUCCESS;
}

typedef std::shared_ptr<fe::graph::Tensor_attributes> tensor_t;

/* A (B,n,T,HS) bf16 view of n heads in rows ld elements apart, head h at
 * column h*HS (n: NH for q, o and their gradients, NKV for k and v). */
tensor_t heads(fe::graph::Graph &g, const char *name, int64_t uid, const shape_key &k, int64_t n,
               int64_t ld) {
  const int64_t B = k[1], T = k[2], HS = k[5];
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({B, n, T, HS})
                      .set_stride({T * ld, HS, ld, 1}));
}

void set_heads(const tensor_t &t, int64_t uid, const shape_key &k, int64_t n, int64_t ld) {
  const int64_t B = k[1], T = k[2], HS = k[5];
  t->set_output(true).set_uid(uid).set_dim({B, n, T, HS}).set_stride({T * ld, HS, ld, 1});
}

/* The packed qkv's row length, (NH + 2*NKV) * HS. */
int64_t qkv_ld(const shape_key &k) { return ((int64_t)k[3] + 2 * (int64_t)k[4]) * k[5]; }

/* (B,NH,T,1) fp32: one log-sum-exp per query row. */
fe::graph::Tensor_attributes stats_attributes(const shape_key &k) {
  const int64_t B = k[1], T = k[2], NH = k[3];
  return fe::graph::Tensor_attributes()
      .set_name("stats")
      .set_uid(UID_STATS)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({B, NH, T, 1})
      .set_stride({NH * T, T, 1, 1});
}

std::shared_ptr<fe::graph::Graph> new_graph(void) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

/* Validated, lowered, one plan from heuristics mode A built, its workspace read. */
fsdp_status_t finish(fe::graph::Graph &g, cudnnHandle_t h, const char *what, const shape_key &k,
                     int64_t *workspace) {
  FE_TRY(g.validate(), what, k);
  FE_TRY(g.build_operation_graph(h), what, k);
  FE_TRY(g.create_execution_plans({fe::HeurMode_t::A}), what, k);
  FE_TRY(g.check_support(), what, k);
  FE_TRY(g.build_plans(), what, k);
  FE_TRY(g.get_workspace_size(*workspace), what, k);
  return FSDP_SUCCESS;
}

float scale_of(const shape_key &k) { return 1.0f / sqrtf((float)k[5]); }

fsdp_status_t build_forward(shape_graphs *sg, cudnnHandle_t h, const shape_key &k) {
  const int64_t NH = k[3], NKV = k[4], C = NH * k[5], ld = qkv_ld(k);
  auto g = new_graph();
  tensor_t q = heads(*g, "q", UID_Q, k, NH, ld), kk = heads(*g, "k", UID_K, k, NKV, ld),
           v = heads(*g, "v", UID_V, k, NKV, ld);
  auto opts = fe::graph::SDPA_attributes()
                  .set_name("attention_forward")
                  .set_generate_stats(true)
                  .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                  .set_diagonal_band_right_bound(0) /* causal: no key after the query */
                  .set_attn_scale(scale_of(k));
  auto [o, stats] = g->sdpa(q, kk, v, opts);
  set_heads(o, UID_O, k, NH, C);
  const int64_t B = k[1], T = k[2];
  stats->set_output(true)
      .set_uid(UID_STATS)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({B, NH, T, 1})
      .set_stride({NH * T, T, 1, 1});
  FSDP_TRY(finish(*g, h, "forward", k, &sg->fwd_workspace));
  sg->fwd = g;
  return FSDP_SUCCESS;
}

/* Deterministic (dQ without atomics, as every fsdp kernel but the embedding's
 * scatter) where this cuDNN has it for the shape, else cuDNN's atomic dQ. */
fsdp_status_t build_backward(shape_graphs *sg, cudnnHandle_t h, const shape_key &k) {
  const int64_t NH = k[3], NKV = k[4], C = NH * k[5], ld = qkv_ld(k);
  fsdp_status_t st = FSDP_SUCCESS;
  for (int deterministic = 1; deterministic >= 0; --deterministic) {
    auto g = new_graph();
    tensor_t q = heads(*g, "q", UID_Q, k, NH, ld), kk = heads(*g, "k", UID_K, k, NKV, ld),
             v = heads(*g, "v", UID_V, k, NKV, ld), o = heads(*g, "o", UID_O, k, NH, C),
             dout = heads(*g, "dout", UID_DO, k, NH, C), stats = g->tensor(stats_attributes(k));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("attention_backward")
                    .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                    .set_diagonal_band_right_bound(0)
                    .set_attn_scale(scale_of(k))
                    .set_deterministic_algorithm(deterministic != 0);
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, opts);
    set_heads(dq, UID_DQ, k, NH, ld);
    set_heads(dk, UID_DK, k, NKV, ld);
    set_heads(dv, UID_DV, k, NKV, ld);
    st = finish(*g, h, "backward", k, &sg->bwd_workspace);
    if (st == FSDP_SUCCESS) {
      if (!deterministic)
        fsdp_log(FSDP_LOG_INFO, "cuDNN attention backward (B %d, T %d, %d heads of %d, %d KV "
                 "heads): no deterministic plan, dQ is accumulated with atomics", k[1], k[2],
                 k[3], k[5], k[4]);
      sg->bwd = g;
      return FSDP_SUCCESS;
    }
  }
  return st;
}

fsdp_status_t check_shape(int B, int T, int C, int NH, int NKV) {
  if (B <= 0 || T <= 0 || NH <= 0 || C <= 0 || C % NH != 0 || NKV <= 0 || NH % NKV != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "cuDNN attention: B %d, T %d, C %d, NH %d, NKV "
                      "%d: positive sizes with C a multiple of NH and NKV dividing NH expected",
                      B, T, C, NH, NKV);
  return FSDP_SUCCESS;
}

/* The graphs of this shape on the current device, built the first time. */
fsdp_status_t graphs_for(int B, int T, int C, int NH, int NKV, shape_graphs **out) {
  FSDP_TRY(check_shape(B, T, C, NH, NKV));
  stream_slot *builder;
  FSDP_TRY(slot_for(nullptr, &builder));
  const shape_key k = {builder->device, B, T, NH, NKV, C / NH};
  auto it = graphs().find(k);
  if (it == graphs().end()) {
    shape_graphs sg{};
    FSDP_TRY(build_forward(&sg, builder->handle, k));
    FSDP_TRY(build_backward(&sg, builder->handle, k));
    it = graphs().emplace(k, sg).first;
  }
  *out = &it->second;
  return FSDP_SUCCESS;
}

fsdp_status_t check_aligned(const void *const *ptrs, const char *const *names, int n) {
  for (int i = 0; i < n; ++i)
    if ((uintptr_t)ptrs[i] % 16)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "cuDNN attention: %s at %p is not 16-byte aligned", names[i], ptrs[i]);
  return FSDP_SUCCESS;
}

fsdp_status_t not_loaded(void) {
  return fsdp_error(FSDP_ERR_UNSUPPORTED, "cuDNN attention: %s", load_text);
}

fsdp_status_t thrown(const char *what, const char *msg) {
  return fsdp_error(FSDP_ERR_UNSUPPORTED, "cuDNN attention %s: %s", what, msg);
}

void *at(const void *base, size_t elems) { /* bf16 element offset */
  return const_cast<char *>(static_cast<const char *>(base)) + 2 * elems;
}

} // namespace

extern "C" int fsdp_cudnn_load(const char **text) {
  std::call_once(load_once, load);
  if (text) *text = load_text;
  return load_ok;
}

extern "C" fsdp_status_t fsdp_cudnn_attention_prepare(int B, int T, int C, int NH, int NKV) {
  if (!fsdp_cudnn_load(nullptr)) return not_loaded();
  NKV = NKV == 0 ? NH : NKV;
  try {
    std::lock_guard<std::mutex> guard(lock());
    shape_graphs *sg;
    return graphs_for(B, T, C, NH, NKV, &sg);
  } catch (const std::exception &e) {
    return thrown("graphs", e.what());
  }
}

extern "C" fsdp_status_t fsdp_cudnn_attention_forward(void *out, float *stats, const void *qkv,
                                                      int B, int T, int C, int NH, int NKV,
                                                      cudaStream_t stream) {
  if (!fsdp_cudnn_load(nullptr)) return not_loaded();
  NKV = NKV == 0 ? NH : NKV;
  const void *ptrs[] = {out, stats, qkv};
  const char *names[] = {"out", "stats", "qkv"};
  FSDP_TRY(check_aligned(ptrs, names, 3));
  try {
    std::lock_guard<std::mutex> guard(lock());
    stream_slot *slot;
    shape_graphs *sg;
    FSDP_TRY(slot_for(stream, &slot));
    FSDP_TRY(graphs_for(B, T, C, NH, NKV, &sg));
    FSDP_TRY(grow_buffer(&slot->workspace, &slot->workspace_bytes, (size_t)sg->fwd_workspace,
                         "cudaMalloc(workspace)"));
    const size_t kv = (size_t)NKV * (size_t)(C / NH); /* columns of the k (and v) heads */
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, at(qkv, 0)}, {UID_K, at(qkv, (size_t)C)}, {UID_V, at(qkv, (size_t)C + kv)},
        {UID_O, out},        {UID_STATS, stats}};
    const shape_key k = {slot->device, B, T, NH, NKV, C / NH};
    FE_TRY(sg->fwd->execute(slot->handle, pack, slot->workspace), "forward", k);
    return FSDP_SUCCESS;
  } catch (const std::exception &e) {
    return thrown("forward", e.what());
  }
}

extern "C" fsdp_status_t fsdp_cudnn_attention_backward(void *dqkv, const void *dout,
                                                       const void *qkv, const void *out,
                                                       const float *stats, int B, int T, int C,
                                                       int NH, int NKV, cudaStream_t stream) {
  if (!fsdp_cudnn_load(nullptr)) return not_loaded();
  NKV = NKV == 0 ? NH : NKV;
  const void *ptrs[] = {dqkv, dout, qkv, out, stats};
  const char *names[] = {"dqkv", "dout", "qkv", "out", "stats"};
  FSDP_TRY(check_aligned(ptrs, names, 5));
  try {
    std::lock_guard<std::mutex> guard(lock());
    stream_slot *slot;
    shape_graphs *sg;
    FSDP_TRY(slot_for(stream, &slot));
    FSDP_TRY(graphs_for(B, T, C, NH, NKV, &sg));
    FSDP_TRY(grow_buffer(&slot->workspace, &slot->workspace_bytes, (size_t)sg->bwd_workspace,
                         "cudaMalloc(workspace)"));
    const size_t kv = (size_t)NKV * (size_t)(C / NH); /* columns of the k (and v) heads */
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, at(qkv, 0)},
        {UID_K, at(qkv, (size_t)C)},
        {UID_V, at(qkv, (size_t)C + kv)},
        {UID_O, const_cast<void *>(out)},
        {UID_DO, const_cast<void *>(dout)},
        {UID_STATS, const_cast<float *>(stats)},
        {UID_DQ, dqkv},
        {UID_DK, at(dqkv, (size_t)C)},
        {UID_DV, at(dqkv, (size_t)C + kv)}};
    const shape_key k = {slot->device, B, T, NH, NKV, C / NH};
    FE_TRY(sg->bwd->execute(slot->handle, pack, slot->workspace), "backward", k);
    return FSDP_SUCCESS;
  } catch (const std::exception &e) {
    return thrown("backward", e.what());
  }
}

/* Every slot goes even when one fails; the first failure is reported. */
extern "C" fsdp_status_t fsdp_cudnn_attention_release(void) {
  std::lock_guard<std::mutex> guard(lock());
  if (slots().empty()) return FSDP_SUCCESS;
  int current;
  cudaError_t e = cudaGetDevice(&current);
  if (e != cudaSuccess) return cudnn_side_cuda_fail(e, "cudaGetDevice");
  fsdp_status_t first = FSDP_SUCCESS;
  size_t kept = 0; /* the builders, moved to the front */
  for (size_t i = 0; i < slots().size(); ++i) {
    stream_slot s = slots()[i];
    /* A handle is destroyed, a buffer freed, on the device it was made on. */
    e = cudaSetDevice(s.device);
    if (e != cudaSuccess) {
      if (first == FSDP_SUCCESS) first = cudnn_side_cuda_fail(e, "cudaSetDevice(device)");
      continue;
    }
    const cudaError_t ew = cudaFree(s.workspace);
    if (first == FSDP_SUCCESS && ew != cudaSuccess)
      first = cudnn_side_cuda_fail(ew, "cudaFree(workspace)");
    if (s.stream == nullptr) { /* the builder: its handle stays with the graphs */
      slots()[kept++] = stream_slot{s.device, nullptr, s.handle, nullptr, 0};
      continue;
    }
    const cudnnStatus_t st = fe::detail::destroy_handle(s.handle);
    if (first == FSDP_SUCCESS && st != CUDNN_STATUS_SUCCESS)
      first = fsdp_error(FSDP_ERR_SYSTEM, "cuDNN attention: cudnnDestroy (device %d): %s",
                         s.device, fe::detail::get_error_string(st));
  }
  slots().resize(kept);
  e = cudaSetDevice(current); /* the caller's device, as it was */
  if (first == FSDP_SUCCESS && e != cudaSuccess)
    first = cudnn_side_cuda_fail(e, "cudaSetDevice(current)");
  return first;
}
