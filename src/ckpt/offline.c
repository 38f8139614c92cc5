/* src/ckpt/offline.c — a checkpoint opened by one process without an engine:
 * what it holds, whole-file verification, and element reads. The tools
 * (consolidate, export, reshard) are built on it. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"
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

fsdp_status_t fsdp_ckpt_verify(fsdp_ckpt_t c) {
  if (!c) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_verify: handle is NULL");
  for (int r = 0; r < c->m.world; r++) FSDP_TRY(ckpt_check_file(&c->f, r, 1));
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_ckpt_read(fsdp_ckpt_t c, int index, int state, size_t first, size_t count,
                             float *out) {
  if (!c || !out || index < 0 || index >= c->m.n_tensors)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_read: no tensor %d or no output",
                      index);
  return ckpt_read_elems(&c->f, index, state, first, count, out);
}
