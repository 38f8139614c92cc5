/* src/device/cuda_stream.c — CUDA streams, CUDA event records and device
 * memory (the CUDA section of include/fsdp/device.h). Plain C over the CUDA
 * runtime API; without CUDA in the build every entry point reports
 * FSDP_ERR_UNSUPPORTED and host memory still works through the CPU kind.
 *
 * An fsdp_event recorded on a CUDA stream holds one reference to a cu_event,
 * a cudaEvent_t made for that record (timing disabled), which the CPU side
 * reaches only through its record table (stream_impl.h). A CPU worker told to
 * wait for it takes its own reference, so recording the fsdp_event again (a
 * new cu_event) never moves the point that worker waits for. Spent cu_events
 * go to a free list and are reused, so steady-state steps create none.
 * Timing marks (stream_internal.h) are a separate pool of timed events. */
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "device/stream_impl.h"
#include "device/stream_internal.h"
#include "fsdp/device.h"
#include "fsdp_config.h"

#if FSDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <stdatomic.h>

static fsdp_status_t cuda_fail(cudaError_t rc, const char *what, const char *name) {
  return fsdp_error(FSDP_ERR_SYSTEM, "CUDA: %s%s%s%s failed: %s (%s)", what, name ? " '" : "",
                    name ? name : "", name ? "'" : "", cudaGetErrorString(rc),
                    cudaGetErrorName(rc));
}

/* ---- event records --------------------------------------------------------- */

struct cu_event {
  record_t rec; /* first: a record_t * is a struct cu_event * */
  cudaEvent_t ev;
  int device; /* an event records only on streams of its device */
  int refs;   /* guarded by pool_mu */
  struct cu_event *next_free;
};

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cu_event *pool;
static const record_ops_t cu_event_ops;

/* A spent record of `device` from the pool, or a new one made there. */
static fsdp_status_t cu_event_new(int device, struct cu_event **out) {
  pthread_mutex_lock(&pool_mu);
  struct cu_event **at = &pool;
  while (*at && (*at)->device != device) at = &(*at)->next_free;
  struct cu_event *c = *at;
  if (c) *at = c->next_free;
  pthread_mutex_unlock(&pool_mu);
  if (!c) {
    if (!(c = fsdp_alloc(sizeof *c)))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "CUDA: cannot allocate an event record");
    int current = device;
    cudaGetDevice(&current);
    if (current != device) cudaSetDevice(device);
    cudaError_t rc = cudaEventCreateWithFlags(&c->ev, cudaEventDisableTiming);
    if (current != device) cudaSetDevice(current);
    if (rc != cudaSuccess) {
      fsdp_free(c);
      return cuda_fail(rc, "cudaEventCreateWithFlags", NULL);
    }
    c->device = device;
    c->rec.ops = &cu_event_ops;
  }
  c->refs = 1;
  c->next_free = NULL;
  *out = c;
  return FSDP_SUCCESS;
}

static void cu_event_unref(record_t *r) {
  struct cu_event *c = (struct cu_event *)r;
  pthread_mutex_lock(&pool_mu);
  if (--c->refs == 0) {
    c->next_free = pool; /* a cudaEvent may be recorded again once nobody waits on it */
    pool = c;
  }
  pthread_mutex_unlock(&pool_mu);
}

static record_t *cu_event_ref(record_t *r) {
  struct cu_event *c = (struct cu_event *)r;
  pthread_mutex_lock(&pool_mu);
  c->refs++;
  pthread_mutex_unlock(&pool_mu);
  return r;
}

/* Blocks until the record is done (cudaEventSynchronize). */
static fsdp_status_t cu_event_wait(record_t *r) {
  struct cu_event *c = (struct cu_event *)r;
  cudaError_t rc = cudaEventSynchronize(c->ev);
  return rc == cudaSuccess ? FSDP_SUCCESS : cuda_fail(rc, "cudaEventSynchronize", NULL);
}

static int cu_event_done(record_t *r) {
  struct cu_event *c = (struct cu_event *)r;
  return cudaEventQuery(c->ev) != cudaErrorNotReady;
}

static const record_ops_t cu_event_ops = {
    .ref = cu_event_ref,
    .unref = cu_event_unref,
    .wait = cu_event_wait,
    .done = cu_event_done,
};

static fsdp_status_t cuda_record(struct fsdp_event *e, struct fsdp_stream *s) {
  struct cu_event *c = NULL;
  FSDP_TRY(cu_event_new(s->device, &c));
  cudaError_t rc = cudaEventRecord(c->ev, (cudaStream_t)s->cuda);
  if (rc != cudaSuccess) {
    cu_event_unref(&c->rec);
    return cuda_fail(rc, "cudaEventRecord on stream", s->name);
  }
  pthread_mutex_lock(&e->mu);
  record_t *old = e->rec;
  e->rec = &c->rec;
  e->stream = s;
  e->ticket = 0;
  pthread_mutex_unlock(&e->mu);
  if (old) old->ops->unref(old);
  return FSDP_SUCCESS;
}

/* Later work on CUDA stream s waits for r (cudaStreamWaitEvent). */
static fsdp_status_t cuda_wait_record(struct fsdp_stream *s, record_t *r) {
  struct cu_event *c = (struct cu_event *)r;
  cudaError_t rc = cudaStreamWaitEvent((cudaStream_t)s->cuda, c->ev, 0);
  return rc == cudaSuccess ? FSDP_SUCCESS : cuda_fail(rc, "cudaStreamWaitEvent on", s->name);
}

/* ---- streams --------------------------------------------------------------- */

/* CUDA calls this on its own thread once the stream reaches the task. */
static void CUDART_CB host_trampoline(void *arg) {
  task_t *t = arg;
  struct fsdp_stream *s = t->owner;
  char msg[STREAM_ERROR_MAX];
  pthread_mutex_lock(&s->mu);
  int skip = s->error != FSDP_SUCCESS;
  pthread_mutex_unlock(&s->mu);
  fsdp_status_t st = FSDP_SUCCESS;
  if (!skip)
    st = fsdp_task_call(s, t, msg);
  else if (t->on_skip)
    t->on_skip(t->arg);
  if (st != FSDP_SUCCESS) {
    pthread_mutex_lock(&s->mu);
    fsdp_stream_set_sticky(s, st, msg);
    pthread_mutex_unlock(&s->mu);
  }
  fsdp_free(t);
}

static atomic_uint_fast64_t host_fns;

uint64_t fsdp_cuda_host_fn_count(void) { return atomic_load(&host_fns); }

static fsdp_status_t cuda_enqueue(struct fsdp_stream *s, task_t *t) {
  /* Waits never reach here: fsdp_stream_wait_event turns them into
   * cudaStreamWaitEvent or a host wait. */
  t->owner = s;
  atomic_fetch_add(&host_fns, 1);
  cudaError_t rc = cudaLaunchHostFunc((cudaStream_t)s->cuda, host_trampoline, t);
  if (rc != cudaSuccess) {
    fsdp_free(t);
    return cuda_fail(rc, "cudaLaunchHostFunc on stream", s->name);
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t cuda_synchronize(struct fsdp_stream *s) {
  cudaError_t rc = cudaStreamSynchronize((cudaStream_t)s->cuda);
  if (rc != cudaSuccess) return cuda_fail(rc, "cudaStreamSynchronize on", s->name);
  return fsdp_stream_sticky(s);
}

static void cuda_destroy(struct fsdp_stream *s) {
  cudaStreamSynchronize((cudaStream_t)s->cuda);
  cudaStreamDestroy((cudaStream_t)s->cuda);
  fsdp_stream_fini_sync(s);
  fsdp_free(s);
}

static const stream_ops_t cuda_ops = {
    .enqueue = cuda_enqueue,
    .synchronize = cuda_synchronize,
    .destroy = cuda_destroy,
    .record = cuda_record,
    .wait_record = cuda_wait_record,
};

fsdp_status_t fsdp_stream_create_cuda(const char *name, int high_priority,
                                      fsdp_stream_t *stream) {
  if (!stream)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_stream_create_cuda: stream is NULL");
  const char *label = name && *name ? name : "fsdp-cuda";
  int least = 0, greatest = 0;
  cudaError_t rc = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (rc != cudaSuccess) return cuda_fail(rc, "cudaDeviceGetStreamPriorityRange for", label);
  struct fsdp_stream *s = fsdp_alloc(sizeof *s);
  if (!s) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "stream '%s': cannot allocate it", label);
  s->ops = &cuda_ops;
  s->kind = FSDP_DEVICE_CUDA;
  snprintf(s->name, sizeof s->name, "%s", label);
  fsdp_status_t st = fsdp_stream_init_sync(s);
  if (st != FSDP_SUCCESS) {
    fsdp_free(s);
    return st;
  }
  cudaStream_t cs;
  rc = cudaStreamCreateWithPriority(&cs, cudaStreamNonBlocking, high_priority ? greatest : least);
  if (rc != cudaSuccess) {
    fsdp_stream_fini_sync(s);
    fsdp_free(s);
    return cuda_fail(rc, "cudaStreamCreateWithPriority for", label);
  }
  s->cuda = cs;
  cudaGetDevice(&s->device);
  *stream = s;
  return FSDP_SUCCESS;
}

/* ---- timing marks ---------------------------------------------------------- */

struct fsdp_marks {
  cudaEvent_t *ev; /* capacity of them, timing enabled */
  size_t capacity, head, used; /* taken: used marks from head on, in a ring */
  cudaEvent_t anchor;
  double anchor_t;   /* fsdp_time_now() when the anchor was recorded */
  double anchor_err; /* s: how far off anchor_t may be (half the measured bracket) */
};

void fsdp_marks_destroy(fsdp_marks_t m) {
  if (!m) return;
  for (size_t i = 0; i < m->capacity && m->ev; i++)
    if (m->ev[i]) cudaEventDestroy(m->ev[i]);
  if (m->anchor) cudaEventDestroy(m->anchor);
  fsdp_free(m->ev);
  fsdp_free(m);
}

fsdp_status_t fsdp_marks_create(size_t capacity, fsdp_marks_t *out) {
  fsdp_marks_t m = fsdp_alloc(sizeof *m);
  if (m) m->ev = fsdp_alloc(capacity * sizeof *m->ev);
  if (!m || !m->ev) {
    fsdp_free(m);
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "CUDA: cannot allocate %zu timing marks", capacity);
  }
  memset(m->ev, 0, capacity * sizeof *m->ev);
  m->capacity = capacity;
  m->head = m->used = 0;
  m->anchor = NULL;
  cudaError_t rc = cudaEventCreate(&m->anchor);
  for (size_t i = 0; rc == cudaSuccess && i < capacity; i++) rc = cudaEventCreate(&m->ev[i]);
  if (rc != cudaSuccess) {
    fsdp_marks_destroy(m);
    return cuda_fail(rc, "cudaEventCreate (timeline marks)", NULL);
  }
  *out = m;
  return FSDP_SUCCESS;
}

/* The record happened between t0 (before it was queued) and the end of the
 * wait for it: the middle is off by at most half that bracket, microseconds
 * on an idle GPU. The tightest of a few tries counts (a busy host can stretch
 * one), kept in a spare event that then becomes the anchor. */
fsdp_status_t fsdp_marks_anchor(fsdp_marks_t m, fsdp_stream_t s) {
  double best = -1.0;
  for (int i = 0; i < 5 && (best < 0 || best > 50e-6); i++) {
    cudaEvent_t ev = best < 0 ? m->anchor : m->ev[0]; /* no mark is taken yet */
    double t0 = fsdp_time_now();
    cudaError_t rc = cudaEventRecord(ev, (cudaStream_t)s->cuda);
    if (rc == cudaSuccess) rc = cudaEventSynchronize(ev);
    if (rc != cudaSuccess) return cuda_fail(rc, "timeline anchor on stream", s->name);
    double t1 = fsdp_time_now();
    if (best >= 0 && t1 - t0 >= best) continue;
    if (ev != m->anchor) m->ev[0] = m->anchor, m->anchor = ev;
    best = t1 - t0;
    m->anchor_t = 0.5 * (t0 + t1);
    m->anchor_err = 0.5 * best;
  }
  return FSDP_SUCCESS;
}

double fsdp_marks_anchor_error(fsdp_marks_t m) { return m->anchor_err; }

fsdp_status_t fsdp_marks_record(fsdp_marks_t m, fsdp_stream_t s, size_t *id) {
  *id = FSDP_NO_MARK;
  if (m->used == m->capacity) return FSDP_SUCCESS;
  size_t at = (m->head + m->used) % m->capacity;
  cudaError_t rc = cudaEventRecord(m->ev[at], (cudaStream_t)s->cuda);
  if (rc != cudaSuccess) return cuda_fail(rc, "cudaEventRecord (timing mark) on", s->name);
  m->used++;
  *id = at;
  return FSDP_SUCCESS;
}

int fsdp_marks_done(fsdp_marks_t m, size_t id) { return cudaEventQuery(m->ev[id]) != cudaErrorNotReady; }

fsdp_status_t fsdp_marks_between(fsdp_marks_t m, size_t a, size_t b, double *seconds) {
  float ms = 0.0f;
  cudaError_t rc = cudaEventSynchronize(m->ev[b]);
  if (rc == cudaSuccess) rc = cudaEventElapsedTime(&ms, m->ev[a], m->ev[b]);
  if (rc != cudaSuccess) return cuda_fail(rc, "cudaEventElapsedTime (timing marks)", NULL);
  *seconds = 1e-3 * (double)ms;
  return FSDP_SUCCESS;
}

void fsdp_marks_release(fsdp_marks_t m, size_t n) {
  if (n > m->used) n = m->used;
  m->head = (m->head + n) % m->capacity;
  m->used -= n;
}

fsdp_status_t fsdp_marks_time(fsdp_marks_t m, size_t id, double *t) {
  float ms = 0.0f;
  cudaError_t rc = cudaEventSynchronize(m->ev[id]);
  if (rc == cudaSuccess) rc = cudaEventElapsedTime(&ms, m->anchor, m->ev[id]);
  if (rc != cudaSuccess) return cuda_fail(rc, "cudaEventElapsedTime (timeline mark)", NULL);
  *t = m->anchor_t + 1e-3 * (double)ms;
  return FSDP_SUCCESS;
}

void fsdp_marks_recycle(fsdp_marks_t m, size_t latest, double t) {
  if (latest < m->used) { /* swap: the old anchor's event becomes a free mark */
    cudaEvent_t a = m->anchor;
    m->anchor = m->ev[latest];
    m->ev[latest] = a;
    m->anchor_t = t;
  }
  m->head = m->used = 0;
}

/* ---- devices and memory ---------------------------------------------------- */

int fsdp_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* clear it: no driver or no device is an answer, not a fault */
    return 0;
  }
  return n;
}

fsdp_status_t fsdp_cuda_set_device(int ordinal) {
  int n = fsdp_cuda_device_count();
  if (ordinal < 0 || ordinal >= n)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "CUDA device %d does not exist: this process sees %d device%s", ordinal, n,
                      n == 1 ? "" : "s");
  cudaError_t rc = cudaSetDevice(ordinal);
  return rc == cudaSuccess ? FSDP_SUCCESS : cuda_fail(rc, "cudaSetDevice", NULL);
}

fsdp_status_t fsdp_cuda_get_device(int *ordinal) {
  if (!ordinal) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_cuda_get_device: NULL");
  cudaError_t rc = cudaGetDevice(ordinal);
  return rc == cudaSuccess ? FSDP_SUCCESS : cuda_fail(rc, "cudaGetDevice", NULL);
}

fsdp_status_t fsdp_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
  if (!free_bytes || !total_bytes)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_cuda_mem_info: NULL");
  cudaError_t rc = cudaMemGetInfo(free_bytes, total_bytes);
  return rc == cudaSuccess ? FSDP_SUCCESS : cuda_fail(rc, "cudaMemGetInfo", NULL);
}

static atomic_uint_fast64_t device_allocs, device_bytes, device_paged;

void fsdp_cuda_alloc_totals(uint64_t *count, uint64_t *bytes, uint64_t *paged_bytes) {
  *count = atomic_load(&device_allocs);
  *bytes = atomic_load(&device_bytes);
  *paged_bytes = atomic_load(&device_paged);
}

static fsdp_status_t cuda_alloc(size_t bytes, void **ptr) {
  cudaError_t rc = cudaMalloc(ptr, bytes);
  if (rc == cudaSuccess) {
    atomic_fetch_add(&device_allocs, 1);
    atomic_fetch_add(&device_bytes, bytes);
    atomic_fetch_add(&device_paged, (bytes + FSDP_CUDA_PAGE - 1) / FSDP_CUDA_PAGE * FSDP_CUDA_PAGE);
    return FSDP_SUCCESS;
  }
  cudaGetLastError();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  return fsdp_error(rc == cudaErrorMemoryAllocation ? FSDP_ERR_OUT_OF_MEMORY : FSDP_ERR_SYSTEM,
                    "CUDA: cudaMalloc of %zu bytes failed: %s (%zu of %zu bytes free)", bytes,
                    cudaGetErrorString(rc), free_b, total_b);
}

static void cuda_free(void *p) { cudaFree(p); }

static fsdp_status_t pinned_alloc(size_t bytes, void **ptr) {
  cudaError_t rc = cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
  if (rc == cudaSuccess) return FSDP_SUCCESS;
  cudaGetLastError();
  *ptr = NULL;
  return fsdp_error(rc == cudaErrorMemoryAllocation ? FSDP_ERR_OUT_OF_MEMORY : FSDP_ERR_SYSTEM,
                    "CUDA: cannot pin %zu bytes of host memory (cudaHostAlloc): %s", bytes,
                    cudaGetErrorString(rc));
}

static void pinned_free(void *p) { cudaFreeHost(p); }

int fsdp_is_device_pointer(const void *p) {
  /* Host collectives ask on every call: without a device, answer at once. */
  static int devices = -1;
  if (devices < 0) devices = fsdp_cuda_device_count(); /* a benign race: same answer */
  struct cudaPointerAttributes a;
  if (!p || devices == 0 || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return a.type == cudaMemoryTypeDevice;
}

fsdp_status_t fsdp_device_copy(void *dst, const void *src, size_t bytes, fsdp_stream_t stream) {
  if (bytes == 0) return FSDP_SUCCESS;
  if (!dst || !src)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_device_copy: NULL buffer (%zu bytes)",
                      bytes);
  cudaError_t rc;
  if (stream && stream->kind == FSDP_DEVICE_CUDA)
    rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream->cuda);
  else if (!fsdp_is_device_pointer(dst) && !fsdp_is_device_pointer(src))
    return memcpy(dst, src, bytes), FSDP_SUCCESS;
  else if ((rc = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault)) == cudaSuccess)
    rc = cudaStreamSynchronize(0); /* some cudaMemcpy forms return before they land */
  return rc == cudaSuccess ? FSDP_SUCCESS : cuda_fail(rc, "copy (cudaMemcpy)", NULL);
}

fsdp_status_t fsdp_device_zero(void *dst, size_t bytes, fsdp_stream_t stream) {
  if (bytes == 0) return FSDP_SUCCESS;
  if (!dst) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_device_zero: NULL buffer");
  cudaError_t rc;
  if (stream && stream->kind == FSDP_DEVICE_CUDA)
    rc = cudaMemsetAsync(dst, 0, bytes, (cudaStream_t)stream->cuda);
  else if (!fsdp_is_device_pointer(dst))
    return memset(dst, 0, bytes), FSDP_SUCCESS;
  else if ((rc = cudaMemset(dst, 0, bytes)) == cudaSuccess)
    rc = cudaStreamSynchronize(0); /* cudaMemset on device memory is asynchronous */
  return rc == cudaSuccess ? FSDP_SUCCESS : cuda_fail(rc, "cudaMemset", NULL);
}

#else /* no CUDA in this build */

static fsdp_status_t no_cuda(const char *what) {
  return fsdp_error(FSDP_ERR_UNSUPPORTED,
                    "%s: this fsdp was built without CUDA (configure with nvcc on PATH, "
                    "-Dcuda=enabled)", what);
}

fsdp_status_t fsdp_stream_create_cuda(const char *name, int high_priority,
                                      fsdp_stream_t *stream) {
  (void)name, (void)high_priority, (void)stream;
  return no_cuda("fsdp_stream_create_cuda");
}
int fsdp_cuda_device_count(void) { return 0; }
fsdp_status_t fsdp_cuda_attention_impl(fsdp_stream_t stream, fsdp_dtype_t dtype, int B, int T,
                                       int C, int NH, int NKV, char *buf, size_t len) {
  (void)stream, (void)dtype, (void)B, (void)T, (void)C, (void)NH, (void)NKV, (void)buf, (void)len;
  return no_cuda("fsdp_cuda_attention_impl");
}
fsdp_status_t fsdp_cuda_product_impl(fsdp_stream_t stream, fsdp_dtype_t dtype, int B, int C,
                                     int OC, int flags, char *buf, size_t len) {
  (void)stream, (void)dtype, (void)B, (void)C, (void)OC, (void)flags, (void)buf, (void)len;
  return no_cuda("fsdp_cuda_product_impl");
}
fsdp_status_t fsdp_cuda_set_device(int ordinal) {
  (void)ordinal;
  return no_cuda("fsdp_cuda_set_device");
}
fsdp_status_t fsdp_cuda_get_device(int *ordinal) {
  (void)ordinal;
  return no_cuda("fsdp_cuda_get_device");
}
fsdp_status_t fsdp_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
  (void)free_bytes, (void)total_bytes;
  return no_cuda("fsdp_cuda_mem_info");
}
static fsdp_status_t cuda_alloc(size_t bytes, void **ptr) {
  (void)bytes, (void)ptr;
  return no_cuda("fsdp_device_alloc(FSDP_DEVICE_CUDA)");
}
static void cuda_free(void *p) { (void)p; }
static fsdp_status_t pinned_alloc(size_t bytes, void **ptr) {
  (void)bytes, (void)ptr;
  return no_cuda("fsdp_pinned_alloc");
}
static void pinned_free(void *p) { (void)p; }
int fsdp_is_device_pointer(const void *p) { return (void)p, 0; }
uint64_t fsdp_cuda_host_fn_count(void) { return 0; }
void fsdp_cuda_alloc_totals(uint64_t *count, uint64_t *bytes, uint64_t *paged_bytes) {
  *count = *bytes = *paged_bytes = 0;
}
fsdp_status_t fsdp_marks_create(size_t capacity, fsdp_marks_t *marks) {
  (void)capacity, (void)marks;
  return no_cuda("timeline marks");
}
void fsdp_marks_destroy(fsdp_marks_t marks) { (void)marks; }
double fsdp_marks_anchor_error(fsdp_marks_t marks) { return (void)marks, 0.0; }
fsdp_status_t fsdp_marks_anchor(fsdp_marks_t marks, fsdp_stream_t s) {
  (void)marks, (void)s;
  return no_cuda("timeline marks");
}
fsdp_status_t fsdp_marks_record(fsdp_marks_t marks, fsdp_stream_t s, size_t *id) {
  (void)marks, (void)s, (void)id;
  return no_cuda("timeline marks");
}
fsdp_status_t fsdp_marks_time(fsdp_marks_t marks, size_t id, double *t) {
  (void)marks, (void)id, (void)t;
  return no_cuda("timeline marks");
}
int fsdp_marks_done(fsdp_marks_t marks, size_t id) { return (void)marks, (void)id, 1; }
fsdp_status_t fsdp_marks_between(fsdp_marks_t marks, size_t a, size_t b, double *seconds) {
  (void)marks, (void)a, (void)b, (void)seconds;
  return no_cuda("timing marks");
}
void fsdp_marks_release(fsdp_marks_t marks, size_t n) { (void)marks, (void)n; }
void fsdp_marks_recycle(fsdp_marks_t marks, size_t latest, double t) {
  (void)marks, (void)latest, (void)t;
}
fsdp_status_t fsdp_device_copy(void *dst, const void *src, size_t bytes, fsdp_stream_t stream) {
  (void)stream;
  if (bytes && (!dst || !src))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_device_copy: NULL buffer (%zu bytes)",
                      bytes);
  if (bytes) memcpy(dst, src, bytes);
  return FSDP_SUCCESS;
}
fsdp_status_t fsdp_device_zero(void *dst, size_t bytes, fsdp_stream_t stream) {
  (void)stream;
  if (bytes && !dst) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_device_zero: NULL buffer");
  if (bytes) memset(dst, 0, bytes);
  return FSDP_SUCCESS;
}
#endif

/* ---- both builds ----------------------------------------------------------- */

fsdp_device_kind_t fsdp_stream_device(fsdp_stream_t stream) {
  return stream ? stream->kind : FSDP_DEVICE_CPU;
}

void *fsdp_stream_cuda_handle(fsdp_stream_t stream) {
  return stream && stream->kind == FSDP_DEVICE_CUDA ? stream->cuda : NULL;
}

fsdp_status_t fsdp_device_alloc(fsdp_device_kind_t kind, size_t bytes, void **ptr) {
  if (!ptr) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_device_alloc: ptr is NULL");
  *ptr = NULL;
  if (bytes == 0) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_device_alloc: 0 bytes");
  if (kind == FSDP_DEVICE_CUDA) return cuda_alloc(bytes, ptr);
  if (kind != FSDP_DEVICE_CPU)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_device_alloc: device kind %d unknown",
                      (int)kind);
  if (!(*ptr = fsdp_alloc(bytes)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", bytes);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_pinned_alloc(size_t bytes, void **ptr) {
  if (!ptr) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_pinned_alloc: ptr is NULL");
  *ptr = NULL;
  if (bytes == 0) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_pinned_alloc: 0 bytes");
  return pinned_alloc(bytes, ptr);
}

void fsdp_pinned_free(void *ptr) {
  if (ptr) pinned_free(ptr);
}

void fsdp_device_free(fsdp_device_kind_t kind, void *ptr) {
  if (!ptr) return;
  if (kind == FSDP_DEVICE_CUDA)
    cuda_free(ptr);
  else
    fsdp_free(ptr);
}
