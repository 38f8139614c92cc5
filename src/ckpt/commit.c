/* src/ckpt/commit.c — the commit protocol shared by save, reshard and import:
 * a temporary step directory, then manifest, rename, and `latest`, each made
 * durable before the next, so a crash leaves the previous checkpoint current. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"

static fsdp_status_t make_dirs(const char *dir) {
  char path[CKPT_PATH_MAX];
  FSDP_TRY(ckpt_path(path, sizeof path, "%s", dir));
  for (char *p = path + 1;; p++) {
    int last = *p == '\0';
    if (*p == '/' || last) {
      *p = '\0';
      if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return fsdp_error(FSDP_ERR_IO, "%s: cannot create directory: %s", path, strerror(errno));
      if (last) break;
      *p = '/';
    }
  }
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return fsdp_error(FSDP_ERR_IO, "%s: is not a directory", dir);
  return FSDP_SUCCESS;
}

/* A crashed save leaves step-<k>.tmp-<id>; nothing reads those, so remove them. */
static fsdp_status_t remove_stale(const char *save_dir) {
  DIR *d = opendir(save_dir);
  if (!d)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot open directory: %s", save_dir, strerror(errno));
  struct dirent *ent;
  fsdp_status_t st = FSDP_SUCCESS;
  char path[CKPT_PATH_MAX];
  while (!st && (ent = readdir(d)) != NULL) {
    if (strncmp(ent->d_name, "step-", 5) != 0 || !strstr(ent->d_name, ".tmp-")) continue;
    st = ckpt_path(path, sizeof path, "%s/%s", save_dir, ent->d_name);
    if (!st) st = ckpt_remove_dir(path);
    if (!st) fsdp_log(FSDP_LOG_INFO, "removed %s, left by an interrupted save", path);
  }
  closedir(d);
  return st;
}

fsdp_status_t ckpt_prepare(const char *save_dir, int64_t step, uint64_t id, int overwrite,
                           char *tmp_out, size_t cap) {
  char final[CKPT_PATH_MAX];
  struct stat sb;
  FSDP_TRY(make_dirs(save_dir));
  FSDP_TRY(ckpt_path(final, sizeof final, "%s/step-%" PRId64, save_dir, step));
  if (!overwrite && stat(final, &sb) == 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s already exists: refusing to overwrite a "
                      "committed checkpoint (ask for overwrite, e.g. fsdp-train --save-overwrite, "
                      "or save elsewhere)", final);
  FSDP_TRY(remove_stale(save_dir));
  FSDP_TRY(ckpt_path(tmp_out, cap, "%s/step-%" PRId64 ".tmp-%016" PRIx64, save_dir, step, id));
  if (mkdir(tmp_out, 0755) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot create directory: %s", tmp_out, strerror(errno));
  return FSDP_SUCCESS;
}

static fsdp_status_t write_small(const char *path, const char *text, size_t n, int64_t *fault) {
  ckpt_writer_t w;
  FSDP_TRY(ckpt_writer_open(&w, path, fault));
  fsdp_status_t st = ckpt_write(&w, text, n);
  if (st) return ckpt_writer_abort(&w), st;
  return ckpt_writer_close(&w);
}

/* Renames tmp onto final; an existing final (overwrite) is swapped out
 * atomically and then removed, so final never goes missing. */
static fsdp_status_t publish(const char *tmp, const char *final) {
  struct stat sb;
  if (stat(final, &sb) != 0) {
    if (rename(tmp, final) != 0)
      return fsdp_error(FSDP_ERR_IO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    return FSDP_SUCCESS;
  }
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot replace %s: %s", tmp, final, strerror(errno));
  return ckpt_remove_dir(tmp);
}

static fsdp_status_t point_latest(const char *save_dir, int64_t step) {
  char tmp[CKPT_PATH_MAX], latest[CKPT_PATH_MAX], text[64];
  FSDP_TRY(ckpt_path(tmp, sizeof tmp, "%s/latest.tmp", save_dir));
  FSDP_TRY(ckpt_path(latest, sizeof latest, "%s/latest", save_dir));
  int n = snprintf(text, sizeof text, "step-%" PRId64 "\n", step);
  FSDP_TRY(write_small(tmp, text, (size_t)n, NULL));
  if (rename(tmp, latest) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot rename to %s: %s", tmp, latest, strerror(errno));
  return ckpt_fsync_dir(save_dir);
}

fsdp_status_t ckpt_commit(const ckpt_manifest_t *m, const char *save_dir, const char *tmp,
                          int64_t *fault_budget, char *path_out, size_t cap) {
  char path[CKPT_PATH_MAX], final[CKPT_PATH_MAX];
  sbuf_t sb = {0};
  fsdp_status_t st = ckpt_manifest_write(m, &sb);
  if (!st) st = ckpt_path(path, sizeof path, "%s/" CKPT_MANIFEST, tmp);
  if (!st) st = write_small(path, sb.buf, sb.len, fault_budget);
  sb_free(&sb);
  FSDP_TRY(st);
  FSDP_TRY(ckpt_fsync_dir(tmp));
  FSDP_TRY(ckpt_path(final, sizeof final, "%s/step-%" PRId64, save_dir, m->step));
  FSDP_TRY(publish(tmp, final));
  FSDP_TRY(ckpt_fsync_dir(save_dir));
  FSDP_TRY(point_latest(save_dir, m->step));
  if (path_out && cap) snprintf(path_out, cap, "%s", final);
  return FSDP_SUCCESS;
}
