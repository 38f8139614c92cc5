/* src/engine/profile.c — per-kernel-class timing on the compute stream
 * (fsdp/profile.h): the class names, and the scopes' sums. On CUDA each scope
 * is a pair of timing marks (the device layer's CUDA events) on the compute
 * stream, read in the order they were taken once the stream has passed them;
 * on the CPU the kernels run in the caller and the host clock times them. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

/* Scopes in flight on CUDA between two reads; past it, a begin waits for
 * the oldest (a GPT-2 124M step takes about 300). */
#define KPROF_SCOPES 4096

struct kprof {
  int on;
  int open;        /* the class of the scope begun and not ended, -1 none */
  double t_open;   /* CPU: when it began */
  size_t m_open;   /* CUDA: its begin mark */
  fsdp_marks_t marks;
  struct { int k; size_t begin, end; } *ring; /* CUDA scopes not read yet, oldest first */
  size_t head, n;
  fsdp_kclass_time_t sum[FSDP_KC_COUNT];
};

static const char *const names[FSDP_KC_COUNT] = {
#define FSDP_KC_NAME_(id, name) [FSDP_KC_##id] = name,
    FSDP_KERNEL_CLASSES(FSDP_KC_NAME_)
#undef FSDP_KC_NAME_
};

const char *fsdp_kclass_name(fsdp_kclass_t k) {
  return (int)k >= 0 && k < FSDP_KC_COUNT ? names[k] : "?";
}

/* e->stats.prof is set only once all of it exists (a failure leaves it NULL and
 * a later call tries again). */
static fsdp_status_t kprof_create(struct fsdp_engine *e) {
  struct kprof *p = calloc(1, sizeof *p);
  if (!p) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "profile: out of host memory");
  p->open = -1;
  fsdp_status_t st = FSDP_SUCCESS;
  if (fsdp_stream_cuda_handle(e->dev.s_compute)) { /* CUDA: scopes timed by events */
    if (!(p->ring = calloc(KPROF_SCOPES, sizeof *p->ring)))
      st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "profile: out of host memory");
    else st = fsdp_marks_create(2 * KPROF_SCOPES, &p->marks);
  }
  if (st != FSDP_SUCCESS) {
    free(p->ring);
    free(p);
    return st;
  }
  e->stats.prof = p;
  return FSDP_SUCCESS;
}

void fsdp_kprof_destroy(struct fsdp_engine *e) {
  if (!e->stats.prof) return;
  fsdp_marks_destroy(e->stats.prof->marks);
  free(e->stats.prof->ring);
  free(e->stats.prof);
  e->stats.prof = NULL;
}

/* Adds the CUDA scopes the stream has passed (all of them with wait). */
fsdp_status_t fsdp_kprof_drain(struct fsdp_engine *e, int wait) {
  struct kprof *p = e->stats.prof;
  while (p && p->marks && p->n) {
    const size_t at = p->head;
    if (!wait && !fsdp_marks_done(p->marks, p->ring[at].end)) break;
    double s;
    FSDP_TRY(fsdp_marks_between(p->marks, p->ring[at].begin, p->ring[at].end, &s));
    p->sum[p->ring[at].k].calls++;
    p->sum[p->ring[at].k].seconds += s;
    fsdp_marks_release(p->marks, 2);
    p->head = (p->head + 1) % KPROF_SCOPES;
    p->n--;
  }
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_profile(fsdp_engine_t e, int on) {
  if (!e) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_profile: engine is NULL");
  if (on && !e->stats.prof) FSDP_TRY(kprof_create(e));
  if (!e->stats.prof) return FSDP_SUCCESS;
  if (e->stats.prof->open >= 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_engine_profile: the scope of '%s' is open",
                      names[e->stats.prof->open]);
  if (on) { /* scopes still queued belong to the last run: read, then dropped */
    FSDP_TRY(fsdp_stream_synchronize(e->dev.s_compute));
    FSDP_TRY(fsdp_kprof_drain(e, 1));
    memset(e->stats.prof->sum, 0, sizeof e->stats.prof->sum);
  }
  e->stats.prof->on = on;
  return FSDP_SUCCESS;
}

static fsdp_status_t bad_class(const char *what, fsdp_kclass_t k) {
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: kernel class %d does not exist (%d classes)",
                    what, (int)k, FSDP_KC_COUNT);
}

fsdp_status_t fsdp_engine_kclass_begin(fsdp_engine_t e, fsdp_kclass_t k) {
  struct kprof *p = e ? e->stats.prof : NULL;
  if (!p || !p->on) return FSDP_SUCCESS;
  if ((int)k < 0 || k >= FSDP_KC_COUNT) return bad_class("fsdp_engine_kclass_begin", k);
  if (p->open >= 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_engine_kclass_begin('%s') inside the scope "
                      "of '%s': scopes do not nest", names[k], names[p->open]);
  p->open = (int)k;
  if (!p->marks) {
    p->t_open = fsdp_time_now();
    return FSDP_SUCCESS;
  }
  if (p->n == KPROF_SCOPES) FSDP_TRY(fsdp_kprof_drain(e, 0));
  if (p->n == KPROF_SCOPES) FSDP_TRY(fsdp_kprof_drain(e, 1)); /* all queued: a host wait */
  return fsdp_marks_record(p->marks, e->dev.s_compute, &p->m_open);
}

fsdp_status_t fsdp_engine_kclass_end(fsdp_engine_t e, fsdp_kclass_t k) {
  struct kprof *p = e ? e->stats.prof : NULL;
  if (!p || !p->on) return FSDP_SUCCESS;
  if (p->open != (int)k)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_engine_kclass_end('%s') without its begin%s%s",
                      fsdp_kclass_name(k), p->open >= 0 ? " (open: " : "",
                      p->open >= 0 ? names[p->open] : "");
  p->open = -1;
  if (!p->marks) {
    p->sum[k].calls++;
    p->sum[k].seconds += fsdp_time_now() - p->t_open;
    return FSDP_SUCCESS;
  }
  size_t end;
  FSDP_TRY(fsdp_marks_record(p->marks, e->dev.s_compute, &end));
  p->ring[(p->head + p->n) % KPROF_SCOPES].k = (int)k;
  p->ring[(p->head + p->n) % KPROF_SCOPES].begin = p->m_open;
  p->ring[(p->head + p->n) % KPROF_SCOPES].end = end;
  p->n++;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_profile_read(fsdp_engine_t e, fsdp_kclass_time_t *out, int n) {
  if (!e || !out || n < 0 || n > FSDP_KC_COUNT)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_profile_read: engine and out must "
                      "not be NULL, n in [0, %d]", FSDP_KC_COUNT);
  memset(out, 0, (size_t)n * sizeof *out);
  if (!e->stats.prof) return FSDP_SUCCESS;
  FSDP_TRY(fsdp_stream_synchronize(e->dev.s_compute));
  FSDP_TRY(fsdp_kprof_drain(e, 1));
  memcpy(out, e->stats.prof->sum, (size_t)n * sizeof *out);
  return FSDP_SUCCESS;
}
