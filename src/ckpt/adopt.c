/* src/ckpt/adopt.c — a save that finds its step already committed: a restart
 * that re-ran the steps after `latest` failed to move (disk full while writing
 * it) holds exactly the committed state, and keeping that copy is the same as
 * writing it again; anything else is still refused. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_internal.h"

/* This rank's shard of the live engine against rank's file in final. */
static fsdp_status_t same_shard(fsdp_engine_t e, const ckpt_manifest_t *m, const char *final,
                                int rank) {
  char path[CKPT_PATH_MAX];
  ckpt_writer_t w;
  FSDP_TRY(ckpt_path(path, sizeof path, "%s/rank-%d-of-%d.bin", final, rank, m->world));
  FSDP_TRY(ckpt_writer_open_compare(&w, path));
  fsdp_status_t st = ckpt_stream_shard(e, m, rank, &w);
  if (st) return ckpt_writer_abort(&w), st;
  FSDP_TRY(ckpt_writer_close(&w));
  if (w.crc != m->files[rank].crc)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: CRC-32 is %08" PRIx32 ", the manifest says %08" PRIx32
                      " (corrupt)", path, w.crc, m->files[rank].crc);
  return FSDP_SUCCESS;
}

/* The manifest this save would write, with the committed id and files. */
static fsdp_status_t same_manifest(const ckpt_manifest_t *m, const char *final) {
  char path[CKPT_PATH_MAX], *text = NULL;
  size_t len = 0;
  sbuf_t sb = {0};
  FSDP_TRY(ckpt_path(path, sizeof path, "%s/" CKPT_MANIFEST, final));
  fsdp_status_t st = ckpt_manifest_write(m, &sb);
  if (!st) st = ckpt_read_whole(path, &text, &len);
  if (!st && (len != sb.len || memcmp(text, sb.buf, len)))
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: differs from this run's (another model, configuration "
                    "or trainer state)", path);
  free(text);
  sb_free(&sb);
  return st;
}

static fsdp_status_t compare_local(fsdp_engine_t e, ckpt_manifest_t *m, const char *final,
                                   int rank) {
  ckpt_manifest_t old = {0};
  fsdp_status_t st = ckpt_manifest_read(final, &old);
  if (!st && old.world != m->world)
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: saved by %d ranks, this run has %d", final, old.world,
                    m->world);
  if (!st) {
    m->id = old.id;
    memcpy(m->files, old.files, (size_t)m->world * sizeof *m->files);
    /* HSDP: only the first shard group wrote; the others hold the same. */
    if (rank < m->world) st = same_shard(e, m, final, rank);
  }
  if (!st && rank == 0) st = same_manifest(m, final);
  ckpt_manifest_free(&old);
  return st;
}

fsdp_status_t ckpt_adopt(fsdp_engine_t e, const char *save_dir, ckpt_manifest_t *m, int *adopted,
                         char *path_out, size_t cap) {
  fsdp_comm_t comm = fsdp_engine_comm(e);
  int rank = fsdp_comm_rank(comm);
  char final[CKPT_PATH_MAX];
  struct stat sb;
  *adopted = 0;
  fsdp_status_t st = ckpt_path(final, sizeof final, "%s/step-%" PRId64, save_dir, m->step);
  double here = !st && rank == 0 && stat(final, &sb) == 0, any = 0;
  FSDP_TRY(ckpt_agree(comm, st));
  FSDP_TRY(fsdp_all_reduce(comm, &here, &any, 1, FSDP_F64, FSDP_MAX, FSDP_HOST_STREAM));
  if (any == 0) return FSDP_SUCCESS;
  st = ckpt_agree(comm, compare_local(e, m, final, rank));
  if (st) {
    char why[1024];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s already exists and is not this run's state at "
                      "step %" PRId64 " (%s): refusing to overwrite a committed checkpoint (ask "
                      "for overwrite, e.g. fsdp-train --save-overwrite, or save elsewhere)", final,
                      m->step, why);
  }
  fsdp_ckpt_repair_t rep;
  st = rank == 0 ? ckpt_repair_local(save_dir, &rep) : FSDP_SUCCESS;
  if (!st && rank == 0)
    fsdp_log(FSDP_LOG_INFO, "%s was already committed with this state: kept%s%s", final,
             rep.changed ? "; " : "", rep.changed ? rep.reason : "");
  FSDP_TRY(ckpt_agree(comm, st));
  if (path_out && cap) snprintf(path_out, cap, "%s", final);
  *adopted = 1;
  return FSDP_SUCCESS;
}
