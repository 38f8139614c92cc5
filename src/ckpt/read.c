/* src/ckpt/read.c — reading a checkpoint's shard files: opening them once,
 * checking headers, sizes and CRCs, and mapping a tensor's elements to the
 * byte ranges of whichever files hold them. Shared by the collective loader
 * and the offline tools. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"

fsdp_status_t ckpt_files_init(ckpt_files_t *f, const ckpt_manifest_t *m) {
  f->m = m;
  f->fds = malloc((size_t)m->world * sizeof *f->fds);
  if (!f->fds) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
  for (int r = 0; r < m->world; r++) f->fds[r] = -1;
  return FSDP_SUCCESS;
}

void ckpt_files_close(ckpt_files_t *f) {
  for (int r = 0; f->fds && r < f->m->world; r++)
    if (f->fds[r] >= 0) close(f->fds[r]);
  free(f->fds);
  f->fds = NULL;
}

static fsdp_status_t files_fd(ckpt_files_t *f, int r, int *fd) {
  if (f->fds[r] < 0) {
    char path[CKPT_PATH_MAX];
    ckpt_shard_path(f->m, r, path, sizeof path);
    f->fds[r] = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fds[r] < 0)
      return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s%s", path, strerror(errno),
                        errno == ENOENT ? " (a shard of the checkpoint is missing)" : "");
  }
  *fd = f->fds[r];
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_check_file(ckpt_files_t *f, int r, int crc) {
  const ckpt_manifest_t *m = f->m;
  char path[CKPT_PATH_MAX];
  ckpt_shard_path(m, r, path, sizeof path);
  int fd = -1;
  FSDP_TRY(files_fd(f, r, &fd));
  struct stat sb;
  if (fstat(fd, &sb) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
  uint8_t head[CKPT_HEADER_BYTES];
  if ((uint64_t)sb.st_size >= CKPT_HEADER_BYTES) {
    FSDP_TRY(ckpt_pread(fd, path, head, sizeof head, 0));
    FSDP_TRY(ckpt_header_check(m, r, path, head));
  }
  if ((uint64_t)sb.st_size != m->files[r].bytes)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: is %lld bytes, the manifest says %" PRIu64 " (%s)",
                      path, (long long)sb.st_size, m->files[r].bytes,
                      (uint64_t)sb.st_size < m->files[r].bytes ? "truncated" : "extra bytes");
  if (!crc) return FSDP_SUCCESS;
  uint32_t got;
  FSDP_TRY(ckpt_file_crc(fd, path, m->files[r].bytes, &got));
  if (got != m->files[r].crc)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: CRC-32 is %08" PRIx32 ", the manifest says %08" PRIx32
                      ": the file is corrupt", path, got, m->files[r].crc);
  return FSDP_SUCCESS;
}

/* The rank whose range of unit u holds flat element p (ranges partition the
 * unit in rank order, so a binary search finds it; empty ranges are skipped). */
static int owner(const ckpt_unit_t *u, int world, size_t p) {
  int lo = 0, hi = world - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (u->ranges[mid].end <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

fsdp_status_t ckpt_read_unit(ckpt_files_t *f, int unit, int s, size_t first, size_t count,
                             float *out) {
  const ckpt_manifest_t *m = f->m;
  const ckpt_unit_t *u = &m->units[unit];
  size_t p = first, end = first + count;
  while (p < end) {
    int r = owner(u, m->world, p);
    const ckpt_range_t *g = &u->ranges[r];
    size_t n = (g->end < end ? g->end : end) - p, len = g->end - g->begin;
    uint64_t off = m->section[(size_t)r * (size_t)m->n_units + (size_t)unit] +
                   ((uint64_t)s * len + (p - g->begin)) * sizeof(float);
    int fd = -1;
    char path[CKPT_PATH_MAX];
    ckpt_shard_path(m, r, path, sizeof path);
    FSDP_TRY(files_fd(f, r, &fd));
    FSDP_TRY(ckpt_pread(fd, path, out, n * sizeof(float), off));
    out += n;
    p += n;
  }
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_read_elems(ckpt_files_t *f, int t, int s, size_t first, size_t count,
                              float *out) {
  const ckpt_manifest_t *m = f->m;
  const ckpt_tensor_t *ts = &m->tensors[t];
  if (s < 0 || s >= m->n_states || first > ts->numel || count > ts->numel - first)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: tensor '%s' state %d has no elements "
                      "[%zu, %zu)", m->dir, ts->name, s, first, first + count);
  return ckpt_read_unit(f, ts->unit, s, ts->offset + first, count, out);
}
