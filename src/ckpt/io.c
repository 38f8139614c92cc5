/* src/ckpt/io.c — checkpoint file I/O: writers that checksum and fsync (or
 * compare against an existing file), positioned reads that name the file when
 * it is short, directory creation, fsync and removal, random ids, and the
 * FSDP_CKPT_FAULT test hook. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "ckpt/ckpt_internal.h"

#define CKPT_IO_CHUNK ((size_t)1 << 20)

fsdp_status_t ckpt_path(char *out, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out, cap, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= cap)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "checkpoint path is longer than %zu bytes: "
                      "%.100s...", cap - 1, out);
  return FSDP_SUCCESS;
}

uint32_t ckpt_crc(uint32_t crc, const void *buf, size_t n) {
  const Bytef *p = buf;
  uLong c = crc;
  while (n > 0) { /* zlib takes uInt lengths */
    uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
    c = crc32(c, p, k);
    p += k;
    n -= k;
  }
  return (uint32_t)c;
}

/* ---- the test hook ------------------------------------------------------------ */

/* kill or stop:rank=R:step=K:after_bytes=B; 0 when FSDP_CKPT_FAULT is not one. */
static int fault_signal(int *rank, long long *step, long long *bytes) {
  const char *s = getenv("FSDP_CKPT_FAULT");
  char action[8];
  if (!s || sscanf(s, "%7[a-z]:rank=%d:step=%lld:after_bytes=%lld", action, rank, step, bytes) != 4)
    return 0;
  return !strcmp(action, "kill") ? SIGKILL : !strcmp(action, "stop") ? SIGSTOP : 0;
}

int64_t ckpt_fault_budget(int rank, int64_t step) {
  int r;
  long long k, bytes;
  if (!fault_signal(&r, &k, &bytes)) return -1;
  return r == rank && k == step && bytes >= 0 ? bytes : -1;
}

int ckpt_fault_enospc(const char *file, int64_t step) {
  const char *s = getenv("FSDP_CKPT_FAULT");
  char what[16];
  long long k;
  return s && sscanf(s, "enospc:%15[a-z]:step=%lld", what, &k) == 2 && !strcmp(what, file) &&
         k == step;
}

static void fault_charge(ckpt_writer_t *w, size_t *n) {
  if (!w->fault_budget || *w->fault_budget < 0) return;
  if ((int64_t)*n < *w->fault_budget) {
    *w->fault_budget -= (int64_t)*n;
    return;
  }
  *n = (size_t)*w->fault_budget; /* write up to the budget, then die mid-file */
  *w->fault_budget = 0;
}

/* Fires once: a stopped process that is continued writes on normally. */
static void fault_fire(const ckpt_writer_t *w) {
  int r;
  long long k, bytes;
  if (!w->fault_budget || *w->fault_budget != 0) return;
  *w->fault_budget = -1;
  raise(fault_signal(&r, &k, &bytes));
}

/* ---- writers ------------------------------------------------------------------ */

static fsdp_status_t open_error(const char *path, int err) {
  return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s%s", path, strerror(err),
                    err == ENOENT ? " (the checkpoint is incomplete or the path is wrong)" : "");
}

fsdp_status_t ckpt_writer_open(ckpt_writer_t *w, const char *path, int64_t *fault_budget) {
  *w = (ckpt_writer_t){.fd = -1, .fault_budget = fault_budget};
  FSDP_TRY(ckpt_path(w->path, sizeof w->path, "%s", path));
  w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_writer_open_compare(ckpt_writer_t *w, const char *path) {
  *w = (ckpt_writer_t){.fd = -1, .compare = 1};
  FSDP_TRY(ckpt_path(w->path, sizeof w->path, "%s", path));
  w->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (w->fd < 0) return open_error(path, errno);
  w->scratch = malloc(CKPT_IO_CHUNK);
  if (!w->scratch) return ckpt_writer_abort(w), fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s", path);
  return FSDP_SUCCESS;
}

/* Compare mode: the next n bytes of the file must be buf's. */
static fsdp_status_t compare_chunk(ckpt_writer_t *w, const char *buf, size_t n) {
  FSDP_TRY(ckpt_pread(w->fd, w->path, w->scratch, n, w->bytes));
  for (size_t i = 0; i < n; i++)
    if (w->scratch[i] != buf[i])
      return fsdp_error(FSDP_ERR_FORMAT, "%s: byte %llu differs", w->path,
                        (unsigned long long)(w->bytes + i));
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_write(ckpt_writer_t *w, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    size_t k = n < CKPT_IO_CHUNK ? n : CKPT_IO_CHUNK;
    if (w->compare) FSDP_TRY(compare_chunk(w, p, k));
    fault_charge(w, &k);
    if (w->fail_errno) errno = w->fail_errno;
    ssize_t put = w->compare ? (ssize_t)k : w->fail_errno ? -1 : k ? write(w->fd, p, k) : 0;
    if (put < 0 && errno == EINTR) continue;
    if (put < 0)
      return fsdp_error(FSDP_ERR_IO, "%s: write failed after %llu bytes: %s", w->path,
                        (unsigned long long)w->bytes, strerror(errno));
    w->crc = ckpt_crc(w->crc, p, (size_t)put);
    w->bytes += (uint64_t)put;
    p += put;
    n -= (size_t)put;
    fault_fire(w);
  }
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_writer_close(ckpt_writer_t *w) {
  if (w->compare) {
    struct stat sb;
    int ok = fstat(w->fd, &sb) == 0 && (uint64_t)sb.st_size == w->bytes;
    ckpt_writer_abort(w);
    if (!ok)
      return fsdp_error(FSDP_ERR_FORMAT, "%s: longer than the %llu bytes expected", w->path,
                        (unsigned long long)w->bytes);
    return FSDP_SUCCESS;
  }
  int fd = w->fd;
  w->fd = -1;
  if (fsync(fd) != 0) {
    int err = errno;
    close(fd);
    return fsdp_error(FSDP_ERR_IO, "%s: fsync failed: %s", w->path, strerror(err));
  }
  if (close(fd) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
  return FSDP_SUCCESS;
}

void ckpt_writer_abort(ckpt_writer_t *w) {
  if (w->fd >= 0) close(w->fd);
  w->fd = -1;
  free(w->scratch);
  w->scratch = NULL;
}

/* ---- readers ------------------------------------------------------------------ */

fsdp_status_t ckpt_read_whole(const char *path, char **buf, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return open_error(path, errno);
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return fsdp_error(FSDP_ERR_IO, "%s: not a regular file", path);
  }
  char *b = malloc((size_t)sb.st_size + 1);
  if (!b) {
    close(fd);
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: %lld bytes", path, (long long)sb.st_size);
  }
  fsdp_status_t st = ckpt_pread(fd, path, b, (size_t)sb.st_size, 0);
  close(fd);
  if (st) return free(b), st;
  b[sb.st_size] = '\0';
  *buf = b;
  *len = (size_t)sb.st_size;
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_pread(int fd, const char *path, void *buf, size_t n, uint64_t off) {
  char *p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t got = pread(fd, p + done, n - done, (off_t)(off + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      return fsdp_error(FSDP_ERR_IO, "%s: read of %zu bytes at offset %llu failed: %s", path,
                        n, (unsigned long long)off, strerror(errno));
    if (got == 0)
      return fsdp_error(FSDP_ERR_IO, "%s: ends at byte %llu, expected at least %llu "
                        "(truncated)", path, (unsigned long long)(off + done),
                        (unsigned long long)(off + n));
    done += (size_t)got;
  }
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_file_crc(int fd, const char *path, uint64_t bytes, uint32_t *crc) {
  char *buf = malloc(CKPT_IO_CHUNK);
  if (!buf) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: CRC buffer", path);
  uint32_t c = 0;
  fsdp_status_t st = FSDP_SUCCESS;
  for (uint64_t off = 0; off < bytes && !st;) {
    size_t k = bytes - off < CKPT_IO_CHUNK ? (size_t)(bytes - off) : CKPT_IO_CHUNK;
    st = ckpt_pread(fd, path, buf, k, off);
    c = ckpt_crc(c, buf, k);
    off += k;
  }
  free(buf);
  if (!st) *crc = c;
  return st;
}

/* ---- directories -------------------------------------------------------------- */

fsdp_status_t ckpt_make_dirs(const char *dir) {
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

fsdp_status_t ckpt_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return fsdp_error(FSDP_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
  int rc = fsync(fd), err = errno;
  close(fd);
  if (rc != 0) return fsdp_error(FSDP_ERR_IO, "%s: fsync failed: %s", dir, strerror(err));
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return fsdp_error(FSDP_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
  struct dirent *ent;
  char path[CKPT_PATH_MAX];
  fsdp_status_t st = FSDP_SUCCESS;
  while (!st && (ent = readdir(d)) != NULL) {
    if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
    st = ckpt_path(path, sizeof path, "%s/%s", dir, ent->d_name);
    if (!st && unlink(path) != 0)
      st = fsdp_error(FSDP_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
  }
  closedir(d);
  if (!st && rmdir(dir) != 0)
    st = fsdp_error(FSDP_ERR_IO, "%s: cannot remove directory: %s", dir, strerror(errno));
  return st;
}

void ckpt_discard(const char *tmp) {
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", fsdp_last_error());
  ckpt_remove_dir(tmp);
  fsdp_error_set(keep);
}

uint64_t ckpt_random_id(void) {
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) {
    /* No entropy source: time and pid still make collisions unlikely. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    id = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 16);
  }
  return id ? id : 1;
}
