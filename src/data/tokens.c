/* src/data/tokens.c — llm.c's token files (GPT-2's uint16, Llama 3's uint32):
 * reading one or a directory of them into memory at their width, checking
 * them against a model's vocabulary, the random training windows over them,
 * and writing one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "data/data_internal.h"
#include "fsdp/data.h"

/* The two formats: magic, version, bytes a token, name in messages. */
typedef struct {
  int32_t magic, version;
  int width;
  const char *name;
} format_t;

static const format_t formats[] = {
    {FSDP_TOKEN_FILE_MAGIC, FSDP_TOKEN_FILE_VERSION, 2, "GPT-2 (uint16 tokens)"},
    {FSDP_TOKEN_FILE_MAGIC_LLAMA3, FSDP_TOKEN_FILE_VERSION_LLAMA3, 4, "Llama 3 (uint32 tokens)"},
};

static const format_t *format_of_magic(int32_t magic) {
  for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
    if (formats[i].magic == magic) return &formats[i];
  return NULL;
}

static const format_t *format_of_width(int width) {
  return width == 4 ? &formats[1] : &formats[0];
}

static int ends_with_bin(const char *name) {
  size_t n = strlen(name);
  return n > 4 && !strcmp(name + n - 4, ".bin");
}

static int32_t le32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                   (uint32_t)p[3] << 24);
}

int fsdp_tokens_probe(const char *path) {
  struct stat sb;
  if (!path || stat(path, &sb) != 0) return 0;
  if (S_ISREG(sb.st_mode)) {
    unsigned char head[4] = {0};
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(head, 1, 4, f) : 0;
    if (f) fclose(f);
    return ends_with_bin(path) || (got == 4 && format_of_magic(le32(head)));
  }
  DIR *d = S_ISDIR(sb.st_mode) ? opendir(path) : NULL;
  struct dirent *e;
  int found = 0;
  while (d && !found && (e = readdir(d)) != NULL) found = e->d_name[0] != '.' && ends_with_bin(e->d_name);
  if (d) closedir(d);
  return found;
}

/* Reads and checks path's header: *count tokens of format *fmt follow it. */
static fsdp_status_t read_header(int fd, const char *path, size_t size, size_t *count,
                                 const format_t **fmt) {
  unsigned char h[FSDP_TOKEN_FILE_HEADER];
  if (size < sizeof h)
    return fsdp_error(FSDP_ERR_IO, "%s: truncated: %zu bytes, shorter than the %d-byte header of "
                      "a token file", path, size, FSDP_TOKEN_FILE_HEADER);
  if (pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot read the header: %s", path, strerror(errno));
  int32_t magic = le32(h), version = le32(h + 4), n = le32(h + 8);
  const format_t *f = format_of_magic(magic);
  if (!f)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: wrong magic %d (0x%08x): not a token file (llm.c's "
                      "token files start with %d, GPT-2's, or %d, Llama 3's)", path, magic,
                      (unsigned)magic, FSDP_TOKEN_FILE_MAGIC, FSDP_TOKEN_FILE_MAGIC_LLAMA3);
  if (version != f->version)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: a %s token file of version %d; this reader knows "
                      "version %d", path, f->name, version, f->version);
  if (n < 0)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: the header's token count is %d", path, n);
  size_t want = sizeof h + (size_t)f->width * (size_t)n;
  if (size != want)
    return fsdp_error(size < want ? FSDP_ERR_IO : FSDP_ERR_FORMAT, "%s: the header says %d %s "
                      "(%zu bytes with the header) but the file has %zu bytes: %s", path, n,
                      f->width == 2 ? "uint16 tokens" : "uint32 tokens", want, size,
                      size < want ? "truncated" : "trailing bytes or a wrong count");
  *count = (size_t)n;
  *fmt = f;
  return FSDP_SUCCESS;
}

/* The regular *.bin files of a directory (or path itself), in name order. */
static fsdp_status_t list_files(const char *path, fsdp_tokens_t *out) {
  struct stat sb;
  if (stat(path, &sb) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot open token data: %s", path, strerror(errno));
  if (!S_ISDIR(sb.st_mode)) {
    if (!(out->files = malloc(sizeof *out->files)) || !(out->files[0] = fsdp_strdup(path)))
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    out->n_files = 1;
    return FSDP_SUCCESS;
  }
  struct dirent **names;
  int n = scandir(path, &names, NULL, alphasort);
  if (n < 0) return fsdp_error(FSDP_ERR_IO, "%s: cannot list: %s", path, strerror(errno));
  out->files = calloc((size_t)n + 1, sizeof *out->files);
  fsdp_status_t st = out->files ? FSDP_SUCCESS : FSDP_ERR_OUT_OF_MEMORY;
  for (int i = 0; i < n; i++) {
    char full[4096];
    struct stat fb;
    snprintf(full, sizeof full, "%s/%s", path, names[i]->d_name);
    if (!st && names[i]->d_name[0] != '.' && ends_with_bin(names[i]->d_name) &&
        lstat(full, &fb) == 0 && S_ISREG(fb.st_mode)) {
      if (!(out->files[out->n_files] = fsdp_strdup(full))) st = FSDP_ERR_OUT_OF_MEMORY;
      else out->n_files++;
    }
    free(names[i]);
  }
  free(names);
  if (st) return fsdp_error(st, "%s: out of memory listing it", path);
  if (out->n_files == 0)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: no token files (*.bin) in this directory", path);
  return FSDP_SUCCESS;
}

static fsdp_status_t read_tokens(int fd, const char *path, char *dst, size_t want) {
  size_t done = 0;
  while (done < want) {
    ssize_t r = pread(fd, dst + done, want - done, FSDP_TOKEN_FILE_HEADER + (off_t)done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return fsdp_error(FSDP_ERR_IO, "%s: read failed after %zu of %zu token bytes: %s", path,
                        done, want, r < 0 ? strerror(errno) : "the file shrank");
    done += (size_t)r;
  }
  /* The format is little-endian, as are the hosts fsdp runs on (see ckpt.h). */
  return FSDP_SUCCESS;
}

/* Opens every file and checks its header and that all share one format
 * (all before reading any tokens), then reads them end to end. */
static fsdp_status_t load_files(fsdp_tokens_t *out) {
  int *fds = malloc((size_t)out->n_files * sizeof *fds);
  out->file_start = calloc((size_t)out->n_files + 1, sizeof *out->file_start);
  if (!fds || !out->file_start)
    return free(fds), fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "token data: out of memory");
  fsdp_status_t st = FSDP_SUCCESS;
  const format_t *first = NULL;
  int opened = 0;
  for (; opened < out->n_files && !st; opened++) {
    const char *p = out->files[opened];
    const format_t *f = NULL;
    struct stat sb;
    size_t count = 0;
    fds[opened] = open(p, O_RDONLY | O_CLOEXEC);
    if (fds[opened] < 0 || fstat(fds[opened], &sb) != 0)
      st = fsdp_error(FSDP_ERR_IO, "%s: cannot open: %s", p, strerror(errno));
    else
      st = read_header(fds[opened], p, (size_t)sb.st_size, &count, &f);
    if (!st && first && f != first)
      st = fsdp_error(FSDP_ERR_FORMAT, "%s: a %s token file, but %s is a %s one: the files of "
                      "one dataset share one format (one tokenizer)", p, f->name, out->files[0],
                      first->name);
    if (!st) first = f;
    out->file_start[opened + 1] = out->file_start[opened] + count;
  }
  out->n = out->file_start[out->n_files];
  out->width = first ? first->width : 2;
  if (!st && out->n == 0)
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: no tokens: the token file%s empty", out->files[0],
                    out->n_files > 1 ? "s are all" : " is");
  if (!st && !(out->tokens = fsdp_alloc((size_t)out->width * out->n)))
    st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "token data: cannot allocate %zu tokens", out->n);
  for (int f = 0; f < out->n_files && !st; f++)
    st = read_tokens(fds[f], out->files[f],
                     (char *)out->tokens + (size_t)out->width * out->file_start[f],
                     (size_t)out->width * (out->file_start[f + 1] - out->file_start[f]));
  for (int f = 0; f < opened; f++)
    if (fds[f] >= 0) close(fds[f]);
  free(fds);
  return st;
}

/* The file token i lies in. */
static int file_of(const fsdp_tokens_t *t, size_t i) {
  int f = 0;
  while (t->file_start[f + 1] <= i) f++;
  return f;
}

/* max_token, refusing uint32 tokens an int cannot hold (no vocabulary has them). */
static fsdp_status_t find_max(fsdp_tokens_t *t) {
  if (t->width == 2) {
    const uint16_t *v = t->tokens;
    for (size_t i = 0; i < t->n; i++) t->max_token = v[i] > t->max_token ? v[i] : t->max_token;
    return FSDP_SUCCESS;
  }
  const uint32_t *v = t->tokens;
  uint32_t max = 0;
  for (size_t i = 0; i < t->n; i++) max = v[i] > max ? v[i] : max;
  if (max > INT32_MAX) {
    size_t i = 0;
    while (v[i] <= INT32_MAX) i++;
    int f = file_of(t, i);
    return fsdp_error(FSDP_ERR_FORMAT, "%s: token %zu is %u, beyond any vocabulary (ids are "
                      "below 2^31)", t->files[f], i - t->file_start[f], v[i]);
  }
  t->max_token = (int)max;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_tokens_load(const char *path, double val_fraction, fsdp_tokens_t *out) {
  if (!path || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tokens load: path and out must not be NULL");
  if (!(val_fraction >= 0.0 && val_fraction <= 0.5))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "tokens load: val_fraction %g for %s is outside [0, 0.5]", val_fraction, path);
  fsdp_tokens_t t = {0};
  fsdp_status_t st = list_files(path, &t);
  if (!st) st = load_files(&t);
  if (!st) st = find_max(&t);
  if (st) {
    fsdp_tokens_free(&t);
    return st;
  }
  t.n_train = t.n - (size_t)((double)t.n * val_fraction);
  *out = t;
  return FSDP_SUCCESS;
}

void fsdp_tokens_free(fsdp_tokens_t *t) {
  if (!t) return;
  fsdp_free(t->tokens);
  for (int f = 0; t->files && f < t->n_files; f++) fsdp_free(t->files[f]);
  free(t->files);
  free(t->file_start);
  memset(t, 0, sizeof *t);
}

fsdp_status_t fsdp_tokens_check_vocab(const fsdp_tokens_t *t, int vocab_size) {
  if (!t || !t->tokens)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "tokens check: no token data loaded");
  if (t->max_token < vocab_size) return FSDP_SUCCESS;
  size_t i = 0;
  while (fsdp_tokens_at(t, i) < vocab_size) i++;
  int f = file_of(t, i);
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: token %zu is %d, outside the model's "
                    "vocabulary of %d (the data's largest token is %d)", t->files[f],
                    i - t->file_start[f], fsdp_tokens_at(t, i), vocab_size, t->max_token);
}

fsdp_status_t fsdp_tokens_windows(const fsdp_tokens_t *t, int validation, uint64_t seed,
                                  int64_t step, int64_t first, int64_t count, int T, int *ids,
                                  int *targets) {
  if (!t || !t->tokens || !ids || !targets)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "tokens windows: tokens (loaded), ids and targets must not be NULL");
  size_t lo = validation ? t->n_train : 0, hi = validation ? t->n : t->n_train;
  uint64_t key, starts;
  FSDP_TRY(data_windows_check("tokens", validation, lo, hi, seed, step, first, count, T, &key,
                              &starts));
  for (int64_t i = 0; i < count; i++) {
    size_t at = data_window_start(key, first + i, lo, starts);
    int *tok = ids + i * T, *tgt = targets + i * T;
    if (t->width == 4) {
      const uint32_t *src = (const uint32_t *)t->tokens + at;
      for (int k = 0; k < T; k++) tok[k] = (int)src[k], tgt[k] = (int)src[k + 1];
    } else {
      const uint16_t *src = (const uint16_t *)t->tokens + at;
      for (int k = 0; k < T; k++) tok[k] = src[k], tgt[k] = src[k + 1];
    }
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t write_all(FILE *f, const char *path, const void *p, size_t n) {
  if (fwrite(p, 1, n, f) != n)
    return fsdp_error(FSDP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
  return FSDP_SUCCESS;
}

static fsdp_status_t write_body(FILE *f, const char *tmp, const int *ids, size_t n,
                                const format_t *fmt) {
  unsigned char h[FSDP_TOKEN_FILE_HEADER] = {0};
  int32_t fields[3] = {fmt->magic, fmt->version, (int32_t)n};
  for (int k = 0; k < 3; k++)
    for (int b = 0; b < 4; b++) h[4 * k + b] = (unsigned char)((uint32_t)fields[k] >> (8 * b));
  FSDP_TRY(write_all(f, tmp, h, sizeof h));
  unsigned char chunk[4 * 4096];
  for (size_t at = 0; at < n;) {
    size_t k = 0;
    for (; k < 4096 && at < n; k++, at++)
      for (int b = 0; b < fmt->width; b++)
        chunk[fmt->width * k + b] = (unsigned char)((uint32_t)ids[at] >> (8 * b));
    FSDP_TRY(write_all(f, tmp, chunk, (size_t)fmt->width * k));
  }
  if (fflush(f) != 0 || fsync(fileno(f)) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
  return FSDP_SUCCESS;
}

int fsdp_token_file_width(int vocab_size) { return vocab_size > 65536 ? 4 : 2; }

fsdp_status_t fsdp_token_file_write(const char *path, const int *ids, size_t n, int width,
                                    int overwrite) {
  if (!path || (!ids && n))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "token file write: path and ids must not be NULL");
  if (width != 2 && width != 4)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: token width %d; token files hold 2-byte "
                      "(GPT-2's) or 4-byte (Llama 3's) tokens", path, width);
  const format_t *fmt = format_of_width(width);
  if (n > INT32_MAX)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: %zu tokens; a token file holds at most %d",
                      path, n, INT32_MAX);
  int max = width == 2 ? 65535 : INT32_MAX;
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] > max)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: token %zu is %d; %s token files hold "
                        "0 .. %d", path, i, ids[i], fmt->name, max);
  struct stat sb;
  if (!overwrite && stat(path, &sb) == 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s already exists: remove it or pass overwrite "
                      "(fsdp-tokenize: --overwrite)", path);
  char tmp[4096];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: path too long", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return fsdp_error(FSDP_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
  fsdp_status_t st = write_body(f, tmp, ids, n, fmt);
  if (fclose(f) != 0 && !st) st = fsdp_error(FSDP_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
  if (!st && rename(tmp, path) != 0)
    st = fsdp_error(FSDP_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
  if (st) unlink(tmp);
  return st;
}
