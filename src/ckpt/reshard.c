/* src/ckpt/reshard.c — rewriting a checkpoint for another number of ranks,
 * streaming every element range from the old files into the new ones. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/offline.h"

/* The same checkpoint with new ranges for `world` ranks (the engine's split at
 * the saved alignment) and a new id. */
static fsdp_status_t remap(const ckpt_manifest_t *old, int world, ckpt_manifest_t *m) {
  FSDP_TRY(ckpt_manifest_alloc(m, world, old->n_units, old->n_tensors));
  m->step = old->step;
  m->id = ckpt_random_id();
  m->align = old->align;
  m->n_states = old->n_states;
  m->meta = old->meta;
  m->has_scaler = old->has_scaler; /* the loss scale resumes at any N */
  m->loss_scale = old->loss_scale;
  m->good_steps = old->good_steps;
  m->has_llama = old->has_llama;
  m->llama = old->llama;
  memcpy(m->state_names, old->state_names, sizeof m->state_names);
  memcpy(m->strategy, old->strategy, sizeof m->strategy);
  memcpy(m->optimizer, old->optimizer, sizeof m->optimizer);
  memcpy(m->param_dtype, old->param_dtype, sizeof m->param_dtype);
  size_t align = strcmp(old->strategy, "zero3") && strcmp(old->strategy, "zero2") ? 1 : old->align;
  for (int u = 0; u < m->n_units; u++) {
    ckpt_unit_t *un = &m->units[u];
    un->name = fsdp_strdup(old->units[u].name);
    un->kind = fsdp_strdup(old->units[u].kind);
    un->numel = old->units[u].numel;
    if (!un->name || !un->kind) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "reshard: out of memory");
    for (int r = 0; r < world; r++)
      FSDP_TRY(fsdp_shard_layout(un->numel, world, align, r, NULL, NULL, &un->ranges[r].begin,
                                 &un->ranges[r].end));
  }
  for (int t = 0; t < m->n_tensors; t++) {
    m->tensors[t] = old->tensors[t];
    if (!(m->tensors[t].name = fsdp_strdup(old->tensors[t].name)))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "reshard: out of memory");
  }
  return ckpt_manifest_layout(m, "resharded checkpoint");
}

static fsdp_status_t write_rank(ckpt_files_t *f, ckpt_manifest_t *m, int r) {
  char path[CKPT_PATH_MAX];
  uint8_t head[CKPT_HEADER_BYTES];
  ckpt_writer_t w;
  ckpt_shard_path(m, r, path, sizeof path);
  ckpt_header_encode(m, r, head);
  FSDP_TRY(ckpt_writer_open(&w, path, NULL));
  fsdp_status_t st = ckpt_write(&w, head, sizeof head);
  for (int u = 0; u < m->n_units && !st; u++) {
    const ckpt_range_t *g = &m->units[u].ranges[r];
    for (int s = 0; s < m->n_states && !st; s++)
      st = ckpt_copy_unit(f, u, s, g->begin, g->end - g->begin, &w);
  }
  if (st) return ckpt_writer_abort(&w), st;
  FSDP_TRY(ckpt_writer_close(&w));
  m->files[r] = (ckpt_file_t){w.bytes, w.crc};
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_ckpt_reshard(fsdp_ckpt_t c, int world, const char *out_dir) {
  if (!c || !out_dir || !out_dir[0] || world < 1 || world > (1 << 16))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "reshard: needs a checkpoint, an output "
                      "directory and a world size in [1, 65536] (got %d)", world);
  FSDP_TRY(fsdp_ckpt_verify(c));
  ckpt_manifest_t m = {0};
  char tmp[CKPT_PATH_MAX];
  int guard = -1;
  fsdp_status_t st = remap(&c->m, world, &m);
  if (!st) st = ckpt_prepare(out_dir, m.step, m.id, 0, tmp, sizeof tmp, &guard);
  if (st) return ckpt_manifest_free(&m), st;
  st = ckpt_path(m.dir, sizeof m.dir, "%s", tmp);
  for (int r = 0; r < world && !st; r++) st = write_rank(&c->f, &m, r);
  if (!st) st = ckpt_commit(&m, out_dir, tmp, NULL, NULL, 0);
  if (st) ckpt_discard(tmp);
  ckpt_guard_release(guard);
  ckpt_manifest_free(&m);
  return st;
}
