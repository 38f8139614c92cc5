/* src/ckpt/offline.c — a checkpoint opened by one process without an engine:
 * what it holds, whole-file verification (structure, CRC, finite values), and
 * element reads. The tools
 * (consolidate, export, reshard) are built on it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
#include "ckpt/llama_hf.h"
#include "ckpt/offline.h"

fsdp_status_t fsdp_ckpt_open(const char *path, fsdp_ckpt_t *out) {
  char dir[CKPT_PATH_MAX];
  if (!out) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_open: no output handle");
  FSDP_TRY(fsdp_ckpt_resolve(path, dir, sizeof dir));
  struct fsdp_ckpt *c = calloc(1, sizeof *c);
  if (!c) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_ckpt_open: out of memory");
  fsdp_status_t st = ckpt_manifest_read(dir, &c->m);
  if (!st) st = ckpt_files_init(&c->f, &c->m);
  if (st) {
    fsdp_ckpt_close(c);
    return st;
  }
  *out = c;
  return FSDP_SUCCESS;
}

void fsdp_ckpt_close(fsdp_ckpt_t c) {
  if (!c) return;
  ckpt_files_close(&c->f);
  ckpt_manifest_free(&c->m);
  free(c);
}

fsdp_status_t fsdp_ckpt_info(fsdp_ckpt_t c, fsdp_ckpt_info_t *info) {
  if (!c || !info)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_info: handle and info must not "
                      "be NULL");
  const ckpt_manifest_t *m = &c->m;
  size_t numel = 0;
  for (int u = 0; u < m->n_units; u++) numel += m->units[u].numel;
  *info = (fsdp_ckpt_info_t){m->dir, m->step, m->id, m->world, m->strategy, m->optimizer,
                             m->param_dtype, m->n_states, m->n_units, m->n_tensors, numel,
                             m->align, &m->meta};
  return FSDP_SUCCESS;
}

const char *fsdp_ckpt_family(fsdp_ckpt_t c) {
  if (!c) return "other";
  if (c->m.has_llama) return "llama";
  return ckpt_find_tensor(&c->m, "wte") >= 0 && ckpt_find_tensor(&c->m, "wpe") >= 0 ? "gpt2"
                                                                                     : "other";
}

fsdp_status_t fsdp_ckpt_llama_config(fsdp_ckpt_t c, fsdp_llama_config_t *out) {
  if (!c || !out || !c->m.has_llama)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: the checkpoint records no Llama (a %s "
                      "checkpoint)", c ? c->m.dir : "(null)", fsdp_ckpt_family(c));
  *out = c->m.llama;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_ckpt_llama_check(fsdp_ckpt_t c, const fsdp_llama_config_t *want) {
  if (!c || !want)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_llama_check: handle and config must "
                      "not be NULL");
  if (!c->m.has_llama) return FSDP_SUCCESS;
  char what[CKPT_PATH_MAX + 32];
  snprintf(what, sizeof what, "the Llama %s records", c->m.dir);
  /* llama_config_same's message stands; the status is a mismatch's, not a bad file's */
  return llama_config_same(what, &c->m.llama, "this model", want) ? FSDP_ERR_INVALID_ARGUMENT
                                                                   : FSDP_SUCCESS;
}

fsdp_status_t fsdp_ckpt_tensor(fsdp_ckpt_t c, int index, fsdp_ckpt_tensor_t *t) {
  if (!c || !t || index < 0 || index >= c->m.n_tensors)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_tensor: no tensor %d (%d tensors)",
                      index, c ? c->m.n_tensors : 0);
  const ckpt_tensor_t *s = &c->m.tensors[index];
  *t = (fsdp_ckpt_tensor_t){s->name, c->m.units[s->unit].name, s->ndim, {0}, s->numel, s->offset};
  memcpy(t->shape, s->shape, sizeof t->shape);
  return FSDP_SUCCESS;
}

const char *fsdp_ckpt_state_name(fsdp_ckpt_t c, int state) {
  if (!c || state < 0 || state >= c->m.n_states) return "unknown";
  return c->m.state_names[state];
}

/* Non-finite elements of one tensor's state: how many and the first. */
static fsdp_status_t count_nonfinite(fsdp_ckpt_t c, int t, int s, float *buf, size_t cap,
                                     size_t *bad, size_t *first) {
  size_t numel = c->m.tensors[t].numel;
  *bad = 0;
  for (size_t at = 0; at < numel; at += cap) {
    size_t n = numel - at < cap ? numel - at : cap;
    FSDP_TRY(ckpt_read_elems(&c->f, t, s, at, n, buf));
    for (size_t i = 0; i < n; i++)
      if (!isfinite(buf[i]) && (*bad)++ == 0) *first = at + i;
  }
  return FSDP_SUCCESS;
}

/* Every element of every state: a NaN or Inf makes the checkpoint unusable
 * (fsdp_ckpt_save never writes one; older versions did). The message names
 * the first few tensors, each with its count and first index. */
static fsdp_status_t check_finite(fsdp_ckpt_t c) {
  enum { CAP = 1 << 16, SHOWN = 4 };
  float *buf = malloc(CAP * sizeof(float));
  if (!buf) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_ckpt_verify: out of memory");
  char msg[1024] = "";
  size_t len = 0, total = 0;
  int tensors = 0;
  fsdp_status_t st = FSDP_SUCCESS;
  for (int t = 0; t < c->m.n_tensors && !st; t++)
    for (int s = 0; s < c->m.n_states && !st; s++) {
      size_t bad = 0, first = 0;
      st = count_nonfinite(c, t, s, buf, CAP, &bad, &first);
      if (st || !bad) continue;
      total += bad;
      if (tensors++ < SHOWN && len < sizeof msg)
        len += (size_t)snprintf(msg + len, sizeof msg - len, "%s %s (%s): %zu of %zu, first at "
                                "index %zu", tensors > 1 ? ";" : "", c->m.tensors[t].name,
                                c->m.state_names[s], bad, c->m.tensors[t].numel, first);
    }
  free(buf);
  if (st || !total) return st;
  return fsdp_error(FSDP_ERR_NONFINITE, "%s: %zu non-finite values (NaN/Inf) in %d tensor "
                    "states:%s%s", c->m.dir, total, tensors, msg,
                    tensors > SHOWN ? "; ..." : "");
}

fsdp_status_t fsdp_ckpt_verify(fsdp_ckpt_t c) {
  if (!c) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_verify: handle is NULL");
  for (int r = 0; r < c->m.world; r++) FSDP_TRY(ckpt_check_file(&c->f, r, 1));
  return check_finite(c);
}

fsdp_status_t fsdp_ckpt_read(fsdp_ckpt_t c, int index, int state, size_t first, size_t count,
                             float *out) {
  if (!c || !out || index < 0 || index >= c->m.n_tensors)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_read: no tensor %d or no output",
                      index);
  return ckpt_read_elems(&c->f, index, state, first, count, out);
}
