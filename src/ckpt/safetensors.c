/* src/ckpt/safetensors.c — writing full tensors as safetensors, streaming:
 * consolidate (every state, our names) and export (parameters, GPT-2 names,
 * or a Llama's own).
 * Format: an 8-byte little-endian header length, a JSON header {name: {dtype,
 * shape, data_offsets}, "__metadata__": {str: str}} padded with spaces to a
 * multiple of 8 bytes, then the raw data in header order. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/gpt2_layout.h"
#include "ckpt/offline.h"
#include "core/json.h"

#define COPY_FLOATS ((size_t)1 << 18) /* 1 MiB */

fsdp_status_t st_header(const st_entry_t *e, int n, const char *metadata, sbuf_t *out) {
  sbuf_t h = {0};
  uint64_t at = 0;
  sb_printf(&h, "{\"__metadata__\":{%s}", metadata);
  for (int i = 0; i < n; i++) {
    uint64_t bytes = (uint64_t)e[i].numel * sizeof(float);
    sb_printf(&h, ",");
    sb_json_str(&h, e[i].name);
    sb_printf(&h, ":{\"dtype\":\"F32\",\"shape\":[");
    for (int d = 0; d < e[i].ndim; d++) sb_printf(&h, "%s%" PRId64, d ? "," : "", e[i].shape[d]);
    sb_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", at, at + bytes);
    at += bytes;
  }
  sb_printf(&h, "}");
  while (h.len % 8) sb_printf(&h, " ");
  size_t start = out->len;
  sb_printf(out, "%8s", ""); /* room for the length, which may hold NUL bytes */
  if (!out->failed)
    for (int i = 0; i < 8; i++) out->buf[start + (size_t)i] = (char)((uint64_t)h.len >> (8 * i));
  if (!h.failed) sb_printf(out, "%s", h.buf);
  int failed = h.failed || out->failed;
  sb_free(&h);
  if (failed) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "safetensors header: out of memory");
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_copy_unit(ckpt_files_t *f, int u, int s, size_t first, size_t n,
                             ckpt_writer_t *w) {
  float *buf = malloc(COPY_FLOATS * sizeof(float));
  if (!buf) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "checkpoint copy buffer");
  fsdp_status_t st = FSDP_SUCCESS;
  for (size_t done = 0; done < n && !st;) {
    size_t k = n - done < COPY_FLOATS ? n - done : COPY_FLOATS;
    st = ckpt_read_unit(f, u, s, first + done, k, buf);
    if (!st) st = ckpt_write(w, buf, k * sizeof(float));
    done += k;
  }
  free(buf);
  return st;
}

/* ---- writing a whole file ----------------------------------------------------------- */

typedef struct {
  st_entry_t *entries;
  int *tensor, *state; /* where each entry's data comes from */
  char **names;        /* owned */
  int n;
} plan_t;

static void plan_free(plan_t *p) {
  for (int i = 0; p->names && i < p->n; i++) free(p->names[i]);
  free(p->entries);
  free(p->tensor);
  free(p->state);
  free(p->names);
}

/* The exported name: the published GPT-2 names where ours differ, under
 * GPT2LMHeadModel's "transformer." for Hugging Face; a Llama's as it is. */
static void export_name(const char *name, int mode, char *out, size_t cap) {
  if (mode == CKPT_ST_LLAMA) snprintf(out, cap, "%s", name);
  else snprintf(out, cap, "%s%s", mode == CKPT_ST_HF ? GPT2_HF_PREFIX : "", gpt2_published_name(name));
}

static fsdp_status_t plan_make(const ckpt_manifest_t *m, int n_states, int mode, plan_t *p) {
  int n = m->n_tensors * n_states;
  p->n = 0;
  p->entries = calloc((size_t)n, sizeof *p->entries);
  p->tensor = calloc((size_t)n, sizeof *p->tensor);
  p->state = calloc((size_t)n, sizeof *p->state);
  p->names = calloc((size_t)n, sizeof *p->names);
  if (!p->entries || !p->tensor || !p->state || !p->names)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "safetensors plan: out of memory");
  for (int s = 0; s < n_states; s++)
    for (int t = 0; t < m->n_tensors; t++, p->n++) {
      const ckpt_tensor_t *ts = &m->tensors[t];
      size_t len = strlen(ts->name) + 32;
      if (!(p->names[p->n] = malloc(len)))
        return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "safetensors plan: out of memory");
      if (s == 0 && mode != CKPT_ST_ALL) export_name(ts->name, mode, p->names[p->n], len);
      else if (s == 0) snprintf(p->names[p->n], len, "%s", ts->name);
      else snprintf(p->names[p->n], len, "optim.%s.%s", m->state_names[s], ts->name);
      p->entries[p->n] = (st_entry_t){p->names[p->n], ts->ndim, ts->shape, ts->numel};
      p->tensor[p->n] = t;
      p->state[p->n] = s;
    }
  return FSDP_SUCCESS;
}

static void metadata(const ckpt_manifest_t *m, int pt, sbuf_t *sb) {
  if (pt) {
    sb_printf(sb, "\"format\":\"pt\"");
    return;
  }
  sb_printf(sb, "\"format\":\"fsdp-consolidated\",\"step\":\"%" PRId64 "\",\"optimizer\":\"%s\"",
            m->step, m->optimizer);
  for (int i = 0; i < m->meta.n; i++)
    sb_printf(sb, ",\"trainer.%s\":\"%" PRId64 "\"", m->meta.kv[i].key, m->meta.kv[i].value);
}

static fsdp_status_t write_body(ckpt_files_t *f, const plan_t *p, ckpt_writer_t *w) {
  for (int i = 0; i < p->n; i++) {
    const ckpt_tensor_t *ts = &f->m->tensors[p->tensor[i]];
    FSDP_TRY(ckpt_copy_unit(f, ts->unit, p->state[i], ts->offset, ts->numel, w));
  }
  return FSDP_SUCCESS;
}

/* Header and data into out_file.tmp, fsync, rename: never a half file. */
static fsdp_status_t write_file(fsdp_ckpt_t c, const plan_t *p, int pt, const char *out_file,
                                uint64_t *bytes) {
  char tmp[CKPT_PATH_MAX];
  sbuf_t meta = {0}, head = {0};
  ckpt_writer_t w;
  FSDP_TRY(ckpt_path(tmp, sizeof tmp, "%s.tmp", out_file));
  metadata(&c->m, pt, &meta);
  fsdp_status_t st = meta.failed ? fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "safetensors metadata")
                                 : st_header(p->entries, p->n, meta.buf, &head);
  sb_free(&meta);
  if (!st) st = ckpt_writer_open(&w, tmp, NULL);
  if (st) return sb_free(&head), st;
  st = ckpt_write(&w, head.buf, head.len);
  sb_free(&head);
  if (!st) st = write_body(&c->f, p, &w);
  if (st) ckpt_writer_abort(&w);
  else st = ckpt_writer_close(&w);
  *bytes = w.bytes;
  if (!st && rename(tmp, out_file) != 0)
    st = fsdp_error(FSDP_ERR_IO, "%s: cannot rename to %s: %s", tmp, out_file, strerror(errno));
  if (st) unlink(tmp);
  return st;
}

/* Checked before the first byte is read, so a refusal costs nothing. */
static fsdp_status_t check_overwrite(const char *out_file, int flags) {
  struct stat sb;
  if (!(flags & FSDP_CKPT_OVERWRITE) && stat(out_file, &sb) == 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s already exists: refusing to overwrite it (ask "
                      "for overwrite, e.g. fsdp-ckpt export --overwrite, or write elsewhere)",
                      out_file);
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_write_safetensors(fsdp_ckpt_t c, const char *out_file, int mode, int flags,
                                     fsdp_ckpt_io_summary_t *sum) {
  if (!c || !out_file || !out_file[0])
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "safetensors output: no checkpoint or file name");
  FSDP_TRY(check_overwrite(out_file, flags));
  FSDP_TRY(fsdp_ckpt_verify(c));
  plan_t p = {0};
  uint64_t bytes = 0;
  fsdp_status_t st = plan_make(&c->m, mode == CKPT_ST_ALL ? c->m.n_states : 1, mode, &p);
  if (!st) st = write_file(c, &p, mode != CKPT_ST_ALL, out_file, &bytes);
  if (!st && sum) {
    *sum = (fsdp_ckpt_io_summary_t){.tensors = p.n, .bytes = bytes};
    for (int i = 0; i < p.n; i++) sum->numel += p.entries[i].numel;
    snprintf(sum->file, sizeof sum->file, "%s", out_file);
    snprintf(sum->dtype, sizeof sum->dtype, "F32");
  }
  plan_free(&p);
  return st;
}

fsdp_status_t fsdp_ckpt_consolidate(fsdp_ckpt_t c, const char *out_file) {
  return ckpt_write_safetensors(c, out_file, CKPT_ST_ALL, FSDP_CKPT_OVERWRITE, NULL);
}

fsdp_status_t fsdp_ckpt_export(fsdp_ckpt_t c, const char *out_file) {
  return ckpt_write_safetensors(c, out_file, CKPT_ST_GPT2, FSDP_CKPT_OVERWRITE, NULL);
}

fsdp_status_t fsdp_ckpt_export_ex(fsdp_ckpt_t c, const char *out_file, int flags,
                                  fsdp_ckpt_io_summary_t *summary) {
  return ckpt_write_safetensors(c, out_file, CKPT_ST_GPT2, flags, summary);
}
