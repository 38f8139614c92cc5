/* src/ckpt/lock.c — the save directory's lock file (<save_dir>/lock), whose
 * byte-range locks are the run lock (fsdp_ckpt_lock) and the per-save guards
 * that commit.c takes while a save lives. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"

struct fsdp_ckpt_lock {
  int fd; /* holds byte 0 of the lock file; -1 on ranks that hold nothing */
};

/* ---- locks ---------------------------------------------------------------------- */

static fsdp_status_t lock_open(const char *save_dir, char *path, size_t cap, int *fd) {
  FSDP_TRY(ckpt_path(path, cap, "%s/" CKPT_LOCK_FILE, save_dir));
  *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (*fd < 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot open the save directory's lock file: %s (the "
                      "save directory must be writable)", path, strerror(errno));
  return FSDP_SUCCESS;
}

/* Non-blocking: 0, or -1 with errno (EAGAIN/EACCES: another open file holds it). */
static int lock_byte(int fd, off_t at, short type) {
  struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
  return fcntl(fd, F_OFD_SETLK, &fl);
}

static int held_elsewhere(int err) { return err == EAGAIN || err == EACCES; }

fsdp_status_t ckpt_guard_take(const char *save_dir, uint64_t id, int *fd) {
  char path[CKPT_PATH_MAX];
  *fd = -1;
  FSDP_TRY(lock_open(save_dir, path, sizeof path, fd));
  if (lock_byte(*fd, (off_t)(1 + (id & 0xffffffffffull)), F_WRLCK) == 0) return FSDP_SUCCESS;
  int err = errno;
  close(*fd);
  *fd = -1;
  if (held_elsewhere(err))
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s: the save %016" PRIx64 " is in progress", path,
                      id);
  return fsdp_error(FSDP_ERR_IO, "%s: cannot lock: %s", path, strerror(err));
}

void ckpt_guard_release(int fd) {
  if (fd >= 0) close(fd);
}

/* "fsdp-train pid 12 on host h, run <id>, started <UTC time>, 2 ranks". */
static void holder_text(int world, char *out, size_t cap) {
  char host[256] = "unknown", when[32] = "unknown";
  gethostname(host, sizeof host - 1);
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  snprintf(out, cap, "%s pid %d on host %s, run %016" PRIx64 ", started %s, %d rank%s\n",
           program_invocation_short_name, (int)getpid(), host, ckpt_random_id(), when, world,
           world == 1 ? "" : "s");
}

static fsdp_status_t refuse_held(int fd, const char *path) {
  char holder[512] = {0};
  ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
  holder[n > 0 ? n : 0] = '\0';
  char *nl = strchr(holder, '\n');
  if (nl) *nl = '\0';
  return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s: the save directory is in use by another run "
                    "(%s): two runs must not save into one directory; wait for it to end or "
                    "save elsewhere", path, holder[0] ? holder : "its holder is not recorded yet");
}

/* Rank 0's part: the directory, the lock, the holder record. */
static fsdp_status_t lock_local(const char *save_dir, int world, int *fd) {
  char path[CKPT_PATH_MAX], holder[512];
  *fd = -1;
  FSDP_TRY(ckpt_make_dirs(save_dir));
  FSDP_TRY(lock_open(save_dir, path, sizeof path, fd));
  fsdp_status_t st = FSDP_SUCCESS;
  if (lock_byte(*fd, 0, F_WRLCK) != 0)
    st = held_elsewhere(errno) ? refuse_held(*fd, path)
                               : fsdp_error(FSDP_ERR_IO, "%s: cannot lock: %s", path,
                                            strerror(errno));
  if (!st) holder_text(world, holder, sizeof holder);
  size_t n = st ? 0 : strlen(holder);
  if (!st && (ftruncate(*fd, 0) != 0 || pwrite(*fd, holder, n, 0) != (ssize_t)n || fsync(*fd)))
    st = fsdp_error(FSDP_ERR_IO, "%s: cannot record the lock's holder: %s", path, strerror(errno));
  if (st) close(*fd), *fd = -1;
  return st;
}

fsdp_status_t fsdp_ckpt_lock(fsdp_engine_t e, const char *save_dir, fsdp_ckpt_lock_t *lock) {
  if (!lock) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_lock: lock is NULL");
  *lock = NULL;
  int fd = -1;
  fsdp_status_t st = FSDP_SUCCESS;
  if (!save_dir || !save_dir[0])
    st = fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_lock: no save directory given");
  else if (ckpt_engine_rank(e) == 0)
    st = lock_local(save_dir, e ? fsdp_comm_size(fsdp_engine_comm(e)) : 1, &fd);
  struct fsdp_ckpt_lock *l = st ? NULL : malloc(sizeof *l);
  if (!st && !l) st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_ckpt_lock: out of memory");
  st = ckpt_engine_agree(e, st);
  if (st) {
    if (fd >= 0) close(fd);
    free(l);
    return st;
  }
  l->fd = fd;
  *lock = l;
  return FSDP_SUCCESS;
}

void fsdp_ckpt_unlock(fsdp_ckpt_lock_t lock) {
  if (!lock) return;
  /* Emptied, never unlinked: a run that opened the file before an unlink
   * would lock the orphan while a third locks a new file. */
  if (lock->fd >= 0 && ftruncate(lock->fd, 0) != 0)
    fsdp_log(FSDP_LOG_WARN, "cannot clear the lock's holder record: %s", strerror(errno));
  if (lock->fd >= 0) close(lock->fd);
  free(lock);
}

