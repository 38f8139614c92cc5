/* src/data/text.c — byte-level text corpora (one file, or a directory of files
 * such as /usr/share/games/fortunes) and the random windows a language model
 * trains on. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "data/data_internal.h"
#include "fsdp/data.h"

/* Reads exactly len bytes of fd; `path` and `name` ("" for none) name the file. */
static fsdp_status_t read_exact(int fd, const char *path, const char *name, uint8_t *dst,
                                size_t len) {
  const char *sep = name[0] ? "/" : "";
  size_t done = 0;
  while (done < len) {
    ssize_t r = read(fd, dst + done, len - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return fsdp_error(FSDP_ERR_IO, "%s%s%s: read failed: %s", path, sep, name, strerror(errno));
    if (r == 0)
      return fsdp_error(FSDP_ERR_IO,
                        "%s%s%s: ends after %zu of its %zu bytes; did it change while loading?",
                        path, sep, name, done, len);
    done += (size_t)r;
  }
  return FSDP_SUCCESS;
}

typedef struct {
  char *name;
  size_t size;
} text_file_t;

static int text_file_cmp(const void *a, const void *b) {
  return strcmp(((const text_file_t *)a)->name, ((const text_file_t *)b)->name);
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The files of a directory that hold text: regular (symlinks are not
 * followed: fortune directories link "x.u8" to "x" and into "off/"), not
 * hidden, not a ".dat" index or a ".u8" alias. */
static fsdp_status_t text_list_dir(DIR *dir, const char *path, text_file_t **files, size_t *count) {
  text_file_t *list = NULL;
  size_t n = 0, cap = 0;
  fsdp_status_t st = FSDP_SUCCESS;
  struct dirent *e;
  errno = 0;
  while ((e = readdir(dir)) != NULL) {
    const char *name = e->d_name;
    if (name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
    struct stat sb;
    if (fstatat(dirfd(dir), name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
      st = fsdp_error(FSDP_ERR_IO, "%s/%s: cannot stat: %s", path, name, strerror(errno));
      goto fail;
    }
    if (!S_ISREG(sb.st_mode)) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      text_file_t *grown = realloc(list, cap * sizeof *list);
      if (!grown) goto oom;
      list = grown;
    }
    list[n].name = fsdp_strdup(name);
    if (!list[n].name) goto oom;
    list[n++].size = (size_t)sb.st_size;
    errno = 0;
  }
  if (errno != 0) {
    st = fsdp_error(FSDP_ERR_IO, "%s: cannot list directory: %s", path, strerror(errno));
    goto fail;
  }
  if (n > 1) qsort(list, n, sizeof *list, text_file_cmp);
  *files = list;
  *count = n;
  return FSDP_SUCCESS;
oom:
  st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory listing the directory", path);
fail:
  for (size_t i = 0; i < n; i++) fsdp_free(list[i].name);
  free(list);
  return st;
}

static fsdp_status_t text_read_files(DIR *dir, const char *path, const text_file_t *files,
                                     size_t count, uint8_t **bytes, size_t *n) {
  size_t content = 0;
  for (size_t i = 0; i < count; i++) {
    if (files[i].size > SIZE_MAX / 2 - content)
      return fsdp_error(FSDP_ERR_IO, "%s: the files add up to more bytes than memory can address",
                        path);
    content += files[i].size;
  }
  if (count == 0)
    return fsdp_error(FSDP_ERR_FORMAT,
                      "%s: no text: the directory has no regular files (hidden files, symlinks, "
                      "subdirectories and names ending in .dat or .u8 are skipped)",
                      path);
  if (content == 0)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: no text: all %zu of its files are empty", path, count);
  size_t total = content + count - 1; /* a newline between files */
  uint8_t *buf = fsdp_alloc(total);
  if (!buf)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes for the text", path,
                      total);
  fsdp_status_t st = FSDP_SUCCESS;
  size_t at = 0;
  for (size_t i = 0; i < count && st == FSDP_SUCCESS; i++) {
    if (i > 0) buf[at++] = '\n';
    int fd = openat(dirfd(dir), files[i].name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      st = fsdp_error(FSDP_ERR_IO, "%s/%s: cannot open: %s", path, files[i].name, strerror(errno));
      break;
    }
    st = read_exact(fd, path, files[i].name, buf + at, files[i].size);
    close(fd);
    at += files[i].size;
  }
  if (st != FSDP_SUCCESS) {
    fsdp_free(buf);
    return st;
  }
  *bytes = buf;
  *n = total;
  return FSDP_SUCCESS;
}

/* Takes ownership of fd, an open directory. */
static fsdp_status_t text_load_dir(int fd, const char *path, uint8_t **bytes, size_t *n) {
  DIR *dir = fdopendir(fd);
  if (!dir) {
    int err = errno;
    close(fd);
    return fsdp_error(FSDP_ERR_IO, "%s: cannot open directory: %s", path, strerror(err));
  }
  text_file_t *files = NULL;
  size_t count = 0;
  fsdp_status_t st = text_list_dir(dir, path, &files, &count);
  if (st == FSDP_SUCCESS) st = text_read_files(dir, path, files, count, bytes, n);
  for (size_t i = 0; i < count; i++) fsdp_free(files[i].name);
  free(files);
  closedir(dir);
  return st;
}

fsdp_status_t data_text_files(const char *path, char ***paths, size_t *count) {
  struct stat sb;
  if (stat(path, &sb) != 0) return fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  size_t n = 1;
  text_file_t *files = NULL;
  DIR *dir = NULL;
  if (S_ISDIR(sb.st_mode)) {
    if (!(dir = opendir(path)))
      return fsdp_error(FSDP_ERR_IO, "%s: cannot open directory: %s", path, strerror(errno));
    fsdp_status_t st = text_list_dir(dir, path, &files, &n);
    closedir(dir);
    if (st) return st;
    if (n == 0) return free(files), fsdp_error(FSDP_ERR_FORMAT, "%s: no text files in it", path);
  } else if (!S_ISREG(sb.st_mode)) {
    return fsdp_error(FSDP_ERR_IO, "%s: not a regular file or a directory", path);
  }
  char **out = calloc(n, sizeof *out);
  fsdp_status_t st = out ? FSDP_SUCCESS : FSDP_ERR_OUT_OF_MEMORY;
  for (size_t i = 0; i < n && out; i++) {
    size_t len = strlen(path) + (files ? strlen(files[i].name) + 2 : 1);
    if (!(out[i] = malloc(len))) {
      st = FSDP_ERR_OUT_OF_MEMORY;
      break;
    }
    if (files) snprintf(out[i], len, "%s/%s", path, files[i].name);
    else memcpy(out[i], path, len);
  }
  for (size_t i = 0; files && i < n; i++) fsdp_free(files[i].name);
  free(files);
  if (st) {
    data_text_files_free(out, n);
    return fsdp_error(st, "%s: out of memory listing its files", path);
  }
  *paths = out;
  *count = n;
  return FSDP_SUCCESS;
}

void data_text_files_free(char **paths, size_t count) {
  for (size_t i = 0; paths && i < count; i++) free(paths[i]);
  free(paths);
}

static fsdp_status_t text_load_file(int fd, const char *path, size_t size, uint8_t **bytes,
                                    size_t *n) {
  if (size == 0) return fsdp_error(FSDP_ERR_FORMAT, "%s: no text: the file is empty", path);
  uint8_t *buf = fsdp_alloc(size);
  if (!buf)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes for the text", path,
                      size);
  fsdp_status_t st = read_exact(fd, path, "", buf, size);
  if (st != FSDP_SUCCESS) {
    fsdp_free(buf);
    return st;
  }
  *bytes = buf;
  *n = size;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_text_load(const char *path, double val_fraction, fsdp_text_t *out) {
  if (!path || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "text load: path and out must not be NULL");
  if (!(val_fraction >= 0.0 && val_fraction <= 0.5))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "text load: val_fraction %g for %s is outside [0, 0.5]", val_fraction, path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fsdp_error(FSDP_ERR_IO, "%s: cannot open text: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int err = errno;
    close(fd);
    return fsdp_error(FSDP_ERR_IO, "%s: cannot stat: %s", path, strerror(err));
  }
  uint8_t *bytes = NULL;
  size_t n = 0;
  fsdp_status_t st;
  if (S_ISDIR(sb.st_mode)) {
    st = text_load_dir(fd, path, &bytes, &n);
  } else if (S_ISREG(sb.st_mode)) {
    st = text_load_file(fd, path, (size_t)sb.st_size, &bytes, &n);
    close(fd);
  } else {
    close(fd);
    st = fsdp_error(FSDP_ERR_IO, "%s: not a regular file or a directory", path);
  }
  if (st != FSDP_SUCCESS) return st;
  out->bytes = bytes;
  out->n = n;
  out->n_train = n - (size_t)((double)n * val_fraction);
  return FSDP_SUCCESS;
}

void fsdp_text_free(fsdp_text_t *text) {
  if (!text) return;
  fsdp_free(text->bytes);
  memset(text, 0, sizeof *text);
}

fsdp_status_t data_windows_check(const char *unit, int validation, size_t lo, size_t hi,
                                 uint64_t seed, int64_t step, int64_t first, int64_t count, int T,
                                 uint64_t *key, uint64_t *starts) {
  if (validation != 0 && validation != 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "%s windows: validation is %d; pass 0 (train) or 1 (validation)", unit,
                      validation);
  if (T < 1 || first < 0 || count < 1 || step < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "%s windows: need T >= 1, step >= 0, first >= 0 and count >= 1; got T %d, "
                      "step %lld, first %lld, count %lld",
                      unit, T, (long long)step, (long long)first, (long long)count);
  if (first > INT64_MAX - count)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "%s windows: samples [%lld, %lld + %lld) overflow int64", unit,
                      (long long)first, (long long)first, (long long)count);
  size_t len = hi - lo;
  if (len < (size_t)T + 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "%s windows: the %s split has %zu %s but a window of T = %d needs "
                      "T + 1 = %d (inputs plus the next one)",
                      unit, validation ? "validation" : "train", len, unit, T, T + 1);
  /* Starts lie in [lo, hi - T - 1]: the target of the last token is hi - 1. */
  *starts = (uint64_t)(len - (size_t)T);
  *key = fsdp_data_key(seed, (uint64_t)step);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_text_windows(const fsdp_text_t *text, int validation, uint64_t seed,
                                int64_t step, int64_t first, int64_t count, int T, int *tokens,
                                int *targets) {
  if (!text || !text->bytes || !tokens || !targets)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "text windows: text (loaded), tokens and targets must not be NULL");
  size_t lo = validation ? text->n_train : 0, hi = validation ? text->n : text->n_train;
  uint64_t key, starts;
  FSDP_TRY(data_windows_check("bytes", validation, lo, hi, seed, step, first, count, T, &key,
                              &starts));
  for (int64_t i = 0; i < count; i++) {
    size_t at = data_window_start(key, first + i, lo, starts);
    int *tok = tokens + i * T, *tgt = targets + i * T;
    for (int t = 0; t < T; t++) {
      tok[t] = text->bytes[at + (size_t)t];
      tgt[t] = text->bytes[at + (size_t)t + 1];
    }
  }
  return FSDP_SUCCESS;
}
