/* tests/unit/test_data.c — IDX and text readers (every error names its file),
 * text windows and the world-size independent sampler (src/data). Files are
 * written into a fresh mkdtemp directory that main removes. */
#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/check_run.h"
#include "fsdp/data.h"

static char tmp_dir[64];

/* ---- helpers --------------------------------------------------------------- */

static const char *tmp_path(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/%s", tmp_dir, name);
  return buf;
}

static void write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot create %s: %s", path, strerror(errno));
  ck_assert_uint_eq(fwrite(data, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
}

static void write_text(const char *path, const char *text) { write_file(path, text, strlen(text)); }

/* Writes an IDX u8 file: header (magic, dims), `bytes` data bytes (value
 * i * 7 + 3), `extra` trailing bytes; gzip-compressed if gz; then cuts `cut`
 * bytes off the end of the file as stored. */
static void write_idx(const char *path, int gz, uint32_t magic, int ndims, const uint32_t *dims,
                      size_t extra, size_t cut) {
  double size = 1;
  for (int d = 0; d < ndims; d++) size *= dims[d];
  size_t bytes = size > 1 << 20 ? 0 : (size_t)size; /* an absurd header: write no data */
  size_t head = 4 * (size_t)(1 + ndims), len = head + bytes + extra;
  uint8_t *buf = malloc(len);
  ck_assert_ptr_nonnull(buf);
  for (int w = 0; w <= ndims; w++) {
    uint32_t v = w == 0 ? magic : dims[w - 1];
    for (int b = 0; b < 4; b++) buf[4 * w + b] = (uint8_t)(v >> (24 - 8 * b));
  }
  for (size_t i = 0; i < bytes + extra; i++) buf[head + i] = (uint8_t)(i * 7 + 3);
  if (gz) {
    gzFile f = gzopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(gzwrite(f, buf, (unsigned)len), (int)len);
    ck_assert_int_eq(gzclose(f), Z_OK);
  } else {
    write_file(path, buf, len);
  }
  free(buf);
  if (cut) {
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_ge(sb.st_size, (off_t)cut);
    ck_assert_int_eq(truncate(path, sb.st_size - (off_t)cut), 0);
  }
}

static void assert_error_names(const char *file) {
  const char *msg = fsdp_last_error();
  const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
  ck_assert_msg(strstr(msg, base) != NULL, "error \"%s\" does not name %s", msg, base);
}

/* ---- IDX ------------------------------------------------------------------- */

enum { MISSING_NONE, MISSING_IMAGES, MISSING_LABELS };

/* Each case writes an images file (magic, dims, trailing bytes, bytes cut off
 * the end as stored) and a labels file (magic, count, trailing, cut). */
// clang-format off
static const struct {
  const char *name;
  int gz;
  uint32_t im_magic, im_dims[3];
  size_t im_extra, im_cut;
  uint32_t lb_magic, lb_n;
  size_t lb_extra, lb_cut;
  int missing;
  fsdp_status_t want;
  int blame_labels; /* the message names the labels file (else the images file) */
  const char *want_text;
} idx_cases[] = {
  {"ok-plain", 0, 0x803, {7, 5, 4}, 0, 0, 0x801, 7, 0, 0, MISSING_NONE, FSDP_SUCCESS, 0, ""},
  {"ok-gz", 1, 0x803, {7, 5, 4}, 0, 0, 0x801, 7, 0, 0, MISSING_NONE, FSDP_SUCCESS, 0, ""},
  {"ok-one", 1, 0x803, {1, 1, 1}, 0, 0, 0x801, 1, 0, 0, MISSING_NONE, FSDP_SUCCESS, 0, ""},
  {"missing-images", 1, 0x803, {7, 5, 4}, 0, 0, 0x801, 7, 0, 0, MISSING_IMAGES, FSDP_ERR_IO, 0,
   "No such file"},
  {"missing-labels", 0, 0x803, {7, 5, 4}, 0, 0, 0x801, 7, 0, 0, MISSING_LABELS, FSDP_ERR_IO, 1,
   "No such file"},
  {"images-cut1-plain", 0, 0x803, {7, 5, 4}, 0, 1, 0x801, 7, 0, 0, MISSING_NONE, FSDP_ERR_IO, 0,
   "truncated: header says 7 images of 5x4 (140 bytes) but the file ends after 139"},
  {"images-cut1-gz", 1, 0x803, {7, 5, 4}, 0, 1, 0x801, 7, 0, 0, MISSING_NONE, FSDP_ERR_IO, 0,
   "truncated: all 7 images of 5x4 (140 bytes) arrived but the gzip stream ends before"},
  {"images-cut12-gz", 1, 0x803, {7, 5, 4}, 0, 12, 0x801, 7, 0, 0, MISSING_NONE, FSDP_ERR_IO, 0,
   "truncated: header says 7 images of 5x4 (140 bytes) but the file ends after"},
  {"labels-cut1-plain", 0, 0x803, {7, 5, 4}, 0, 0, 0x801, 7, 0, 1, MISSING_NONE, FSDP_ERR_IO, 1,
   "truncated: header says 7 labels (7 bytes) but the file ends after 6"},
  {"labels-cut1-gz", 1, 0x803, {7, 5, 4}, 0, 0, 0x801, 7, 0, 1, MISSING_NONE, FSDP_ERR_IO, 1,
   "truncated"},
  {"images-header-cut", 0, 0x803, {1, 2, 2}, 0, 10, 0x801, 1, 0, 0, MISSING_NONE, FSDP_ERR_IO, 0,
   "inside the 16-byte IDX header"},
  {"images-bad-magic", 0, 0x802, {7, 5, 4}, 0, 0, 0x801, 7, 0, 0, MISSING_NONE, FSDP_ERR_FORMAT, 0,
   "bad magic 0x00000802, expected 0x00000803 (IDX u8 images)"},
  {"images-as-labels", 1, 0x801, {7, 5, 4}, 0, 0, 0x801, 7, 0, 0, MISSING_NONE, FSDP_ERR_FORMAT, 0,
   "that is the magic of IDX u8 labels"},
  {"labels-bad-magic", 1, 0x803, {7, 5, 4}, 0, 0, 0x80108, 7, 0, 0, MISSING_NONE, FSDP_ERR_FORMAT,
   1, "bad magic 0x00080108, expected 0x00000801 (IDX u8 labels)"},
  {"count-mismatch", 1, 0x803, {7, 5, 4}, 0, 0, 0x801, 6, 0, 0, MISSING_NONE, FSDP_ERR_FORMAT, 1,
   "7 images but 6 labels in"},
  {"images-trailing", 0, 0x803, {7, 5, 4}, 1, 0, 0x801, 7, 0, 0, MISSING_NONE, FSDP_ERR_FORMAT, 0,
   "trailing bytes"},
  {"images-trail-gz", 1, 0x803, {7, 5, 4}, 3, 0, 0x801, 7, 0, 0, MISSING_NONE, FSDP_ERR_FORMAT, 0,
   "trailing bytes"},
  {"labels-trail-gz", 1, 0x803, {7, 5, 4}, 0, 0, 0x801, 7, 2, 0, MISSING_NONE, FSDP_ERR_FORMAT, 1,
   "trailing bytes"},
  {"images-absurd", 0, 0x803, {60000, 60000, 60000}, 0, 0, 0x801, 60000, 0, 0, MISSING_NONE,
   FSDP_ERR_FORMAT, 0, "more than the 2147483647 bytes"},
  {"images-max-dims", 0, 0x803, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, 0, 0, 0x801, 1, 0, 0,
   MISSING_NONE, FSDP_ERR_FORMAT, 0, "header is corrupt"},
  {"images-zero", 0, 0x803, {0, 28, 28}, 0, 0, 0x801, 0, 0, 0, MISSING_NONE, FSDP_ERR_FORMAT, 0,
   "holds no data"},
};
// clang-format on

START_TEST(idx_load_cases) {
  char images[256], labels[256], name[128];
  snprintf(name, sizeof name, "%s-images-idx3-ubyte%s", idx_cases[_i].name,
           idx_cases[_i].gz ? ".gz" : "");
  tmp_path(images, sizeof images, name);
  snprintf(name, sizeof name, "%s-labels-idx1-ubyte%s", idx_cases[_i].name,
           idx_cases[_i].gz ? ".gz" : "");
  tmp_path(labels, sizeof labels, name);
  if (idx_cases[_i].missing != MISSING_IMAGES)
    write_idx(images, idx_cases[_i].gz, idx_cases[_i].im_magic, 3, idx_cases[_i].im_dims,
              idx_cases[_i].im_extra, idx_cases[_i].im_cut);
  if (idx_cases[_i].missing != MISSING_LABELS)
    write_idx(labels, idx_cases[_i].gz, idx_cases[_i].lb_magic, 1, &idx_cases[_i].lb_n,
              idx_cases[_i].lb_extra, idx_cases[_i].lb_cut);

  fsdp_idx_dataset_t ds, before;
  memset(&ds, 0xA5, sizeof ds);
  before = ds;
  fsdp_status_t st = fsdp_idx_load(images, labels, &ds);
  ck_assert_msg(st == idx_cases[_i].want, "%s: status %d, want %d (%s)", idx_cases[_i].name, st,
                idx_cases[_i].want, fsdp_last_error());
  if (st != FSDP_SUCCESS) {
    ck_assert_mem_eq(&ds, &before, sizeof ds); /* outputs untouched */
    assert_error_names(idx_cases[_i].blame_labels ? labels : images);
    ck_assert_msg(strstr(fsdp_last_error(), idx_cases[_i].want_text) != NULL,
                  "error \"%s\" lacks \"%s\"", fsdp_last_error(), idx_cases[_i].want_text);
    return;
  }
  const uint32_t *d = idx_cases[_i].im_dims;
  ck_assert_int_eq(ds.n, (int)d[0]);
  ck_assert_int_eq(ds.rows, (int)d[1]);
  ck_assert_int_eq(ds.cols, (int)d[2]);
  for (size_t i = 0; i < (size_t)d[0] * d[1] * d[2]; i++)
    ck_assert_uint_eq(ds.images[i], (uint8_t)(i * 7 + 3));
  for (size_t i = 0; i < d[0]; i++) ck_assert_uint_eq(ds.labels[i], (uint8_t)(i * 7 + 3));
  fsdp_idx_free(&ds);
  ck_assert_ptr_null(ds.images);
  ck_assert_ptr_null(ds.labels);
  fsdp_idx_free(&ds); /* freeing twice is harmless */
}
END_TEST

START_TEST(idx_rejects_a_directory) {
  char labels[256];
  uint32_t n = 1;
  write_idx(tmp_path(labels, sizeof labels, "dir-labels"), 0, 0x801, 1, &n, 0, 0);
  fsdp_idx_dataset_t ds = {0, 0, 0, NULL, NULL};
  ck_assert_int_eq(fsdp_idx_load(tmp_dir, labels, &ds), FSDP_ERR_IO);
  assert_error_names(tmp_dir);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "directory"));
  ck_assert_int_eq(fsdp_idx_load(NULL, labels, &ds), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_idx_load(labels, labels, NULL), FSDP_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(fashion_mnist_paths_and_split) {
  char dir[256], path[512];
  tmp_path(dir, sizeof dir, "fmnist");
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  uint32_t im[3] = {3, 28, 28}, n = 3;
  snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte.gz", dir);
  write_idx(path, 1, 0x803, 3, im, 0, 0);
  snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte.gz", dir);
  write_idx(path, 1, 0x801, 1, &n, 0, 0);
  fsdp_idx_dataset_t ds = {0, 0, 0, NULL, NULL};
  ck_assert_int_eq(fsdp_fashion_mnist_load(dir, "t10k", &ds), FSDP_SUCCESS);
  ck_assert_int_eq(ds.n, 3);
  ck_assert_int_eq(ds.rows, 28);
  fsdp_idx_free(&ds);
  ck_assert_int_eq(fsdp_fashion_mnist_load(dir, "train", &ds), FSDP_ERR_IO);
  assert_error_names("train-images-idx3-ubyte.gz");
  ck_assert_int_eq(fsdp_fashion_mnist_load(dir, "test", &ds), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "\"test\""));
}
END_TEST

#define FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

START_TEST(fashion_mnist_real_t10k) {
  struct stat sb;
  if (stat(FASHION_MNIST_DIR, &sb) != 0) {
    printf("note: %s not installed (apt-get install dataset-fashion-mnist); real-data check "
           "skipped\n",
           FASHION_MNIST_DIR);
    return;
  }
  fsdp_idx_dataset_t ds = {0, 0, 0, NULL, NULL};
  ck_assert_msg(fsdp_fashion_mnist_load(FASHION_MNIST_DIR, "t10k", &ds) == FSDP_SUCCESS, "%s",
                fsdp_last_error());
  ck_assert_int_eq(ds.n, 10000);
  ck_assert_int_eq(ds.rows, 28);
  ck_assert_int_eq(ds.cols, 28);
  int per_class[10] = {0};
  for (int i = 0; i < ds.n; i++) {
    ck_assert_uint_lt(ds.labels[i], 10);
    per_class[ds.labels[i]]++;
  }
  for (int c = 0; c < 10; c++) ck_assert_int_eq(per_class[c], 1000); /* t10k is balanced */
  fsdp_idx_free(&ds);
}
END_TEST

/* ---- text ------------------------------------------------------------------ */

START_TEST(text_load_file_and_split) {
  static const struct {
    size_t n;
    double val;
    size_t n_train;
  } cases[] = {{1000, 0.0, 1000}, {1000, 0.1, 900}, {1000, 0.5, 500}, {7, 0.1, 7}, {7, 0.5, 4}};
  char path[256], name[64];
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    snprintf(name, sizeof name, "split-%zu.txt", c);
    char *buf = malloc(cases[c].n);
    for (size_t i = 0; i < cases[c].n; i++) buf[i] = (char)('a' + i % 26);
    write_file(tmp_path(path, sizeof path, name), buf, cases[c].n);
    fsdp_text_t text;
    ck_assert_int_eq(fsdp_text_load(path, cases[c].val, &text), FSDP_SUCCESS);
    ck_assert_uint_eq(text.n, cases[c].n);
    ck_assert_uint_eq(text.n_train, cases[c].n_train);
    ck_assert_mem_eq(text.bytes, buf, cases[c].n);
    fsdp_text_free(&text);
    ck_assert_ptr_null(text.bytes);
    free(buf);
  }
}
END_TEST

START_TEST(text_load_directory_in_name_order) {
  char dir[256], path[512];
  tmp_path(dir, sizeof dir, "corpus");
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  static const struct {
    const char *name, *text;
  } files[] = {
      {"b9", "nine\n"},  {"b10", "ten"},    {"a", "first"}, {"a.dat", "index"},
      {"a.u8", "alias"}, {".hidden", "no"}, {"Z", "upper"},
  };
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
    write_text(path, files[i].text);
  }
  snprintf(path, sizeof path, "%s/link", dir);
  ck_assert_int_eq(symlink("a", path), 0);
  snprintf(path, sizeof path, "%s/sub", dir);
  ck_assert_int_eq(mkdir(path, 0700), 0);
  snprintf(path, sizeof path, "%s/sub/inner", dir);
  write_text(path, "inner");

  fsdp_text_t text;
  ck_assert_msg(fsdp_text_load(dir, 0.0, &text) == FSDP_SUCCESS, "%s", fsdp_last_error());
  const char *want = "upper\nfirst\nten\nnine\n"; /* Z, a, b10, b9: strcmp order */
  ck_assert_uint_eq(text.n, strlen(want));
  ck_assert_mem_eq(text.bytes, want, text.n);
  ck_assert_uint_eq(text.n_train, text.n);
  fsdp_text_free(&text);
}
END_TEST

enum { TEXT_MISSING, TEXT_EMPTY_DIR, TEXT_ONLY_DAT, TEXT_EMPTY_FILE, TEXT_EMPTY_FILES };

static const struct {
  const char *name;
  int kind;
  double val;
  fsdp_status_t want;
  const char *want_text;
} text_errors[] = {
    {"no-such-corpus", TEXT_MISSING, 0.1, FSDP_ERR_IO, "No such file"},
    {"empty-dir", TEXT_EMPTY_DIR, 0.1, FSDP_ERR_FORMAT, "no text"},
    {"only-dat", TEXT_ONLY_DAT, 0.1, FSDP_ERR_FORMAT, "no regular files"},
    {"empty-file", TEXT_EMPTY_FILE, 0.1, FSDP_ERR_FORMAT, "the file is empty"},
    {"empty-files", TEXT_EMPTY_FILES, 0.1, FSDP_ERR_FORMAT, "all 2 of its files are empty"},
    {"val-negative", TEXT_EMPTY_FILE, -0.01, FSDP_ERR_INVALID_ARGUMENT, "outside [0, 0.5]"},
    {"val-too-big", TEXT_EMPTY_FILE, 0.51, FSDP_ERR_INVALID_ARGUMENT, "outside [0, 0.5]"},
    {"val-nan", TEXT_EMPTY_FILE, NAN, FSDP_ERR_INVALID_ARGUMENT, "outside [0, 0.5]"},
};

START_TEST(text_load_errors) {
  char path[256], file[512];
  tmp_path(path, sizeof path, text_errors[_i].name);
  switch (text_errors[_i].kind) {
  case TEXT_MISSING:
    break;
  case TEXT_EMPTY_DIR:
    ck_assert_int_eq(mkdir(path, 0700), 0);
    break;
  case TEXT_ONLY_DAT:
  case TEXT_EMPTY_FILES:
    ck_assert_int_eq(mkdir(path, 0700), 0);
    for (int k = 0; k < 2; k++) {
      snprintf(file, sizeof file, "%s/f%d%s", path, k,
               text_errors[_i].kind == TEXT_ONLY_DAT ? ".dat" : "");
      write_text(file, text_errors[_i].kind == TEXT_ONLY_DAT ? "x" : "");
    }
    break;
  case TEXT_EMPTY_FILE:
    write_text(path, "");
    break;
  }
  fsdp_text_t text, before;
  memset(&text, 0x5A, sizeof text);
  before = text;
  ck_assert_int_eq(fsdp_text_load(path, text_errors[_i].val, &text), text_errors[_i].want);
  ck_assert_mem_eq(&text, &before, sizeof text);
  assert_error_names(path);
  ck_assert_msg(strstr(fsdp_last_error(), text_errors[_i].want_text) != NULL,
                "error \"%s\" lacks \"%s\"", fsdp_last_error(), text_errors[_i].want_text);
}
END_TEST

/* 200 bytes valued 0..199, so a token tells where its window starts. */
static void ramp_text(fsdp_text_t *text, uint8_t *bytes, size_t n, double val) {
  for (size_t i = 0; i < n; i++) bytes[i] = (uint8_t)i;
  text->bytes = bytes;
  text->n = n;
  text->n_train = n - (size_t)((double)n * val);
}

START_TEST(text_windows_lie_inside_the_split) {
  enum { N = 200, T = 8, COUNT = 3000 };
  uint8_t bytes[N];
  fsdp_text_t text;
  ramp_text(&text, bytes, N, 0.25); /* train [0, 150), validation [150, 200) */
  static int tokens[COUNT * T], targets[COUNT * T];
  for (int validation = 0; validation <= 1; validation++) {
    int lo = validation ? 150 : 0, hi = validation ? 200 : 150;
    int seen[N] = {0};
    ck_assert_int_eq(fsdp_text_windows(&text, validation, 42, 5, 0, COUNT, T, tokens, targets),
                     FSDP_SUCCESS);
    for (int i = 0; i < COUNT; i++) {
      int start = tokens[i * T];
      ck_assert_int_ge(start, lo);
      ck_assert_int_le(start, hi - T - 1);
      seen[start]++;
      for (int t = 0; t < T; t++) {
        ck_assert_int_eq(tokens[i * T + t], start + t);
        ck_assert_int_eq(targets[i * T + t], start + t + 1);
        if (t + 1 < T) ck_assert_int_eq(tokens[i * T + t + 1], targets[i * T + t]);
      }
    }
    /* Every start, the first and the last included, is drawn. */
    for (int s = lo; s <= hi - T - 1; s++) ck_assert_msg(seen[s] > 0, "start %d never drawn", s);
  }
}
END_TEST

START_TEST(text_windows_are_deterministic_per_sample) {
  enum { N = 200, T = 6, COUNT = 16 };
  uint8_t bytes[N];
  fsdp_text_t text;
  ramp_text(&text, bytes, N, 0.1);
  int a[COUNT * T], b[COUNT * T], ta[COUNT * T], tb[COUNT * T];
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 7, 3, 0, COUNT, T, a, ta), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 7, 3, 0, COUNT, T, b, tb), FSDP_SUCCESS);
  ck_assert_mem_eq(a, b, sizeof a);
  ck_assert_mem_eq(ta, tb, sizeof ta);
  /* A rank asking for samples [5, 16) gets rows 5.. of the whole batch. */
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 7, 3, 5, COUNT - 5, T, b, tb), FSDP_SUCCESS);
  ck_assert_mem_eq(a + 5 * T, b, sizeof(int) * (COUNT - 5) * T);
  /* Another step or seed draws other windows. */
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 7, 4, 0, COUNT, T, b, tb), FSDP_SUCCESS);
  ck_assert_int_ne(memcmp(a, b, sizeof a), 0);
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 8, 3, 0, COUNT, T, b, tb), FSDP_SUCCESS);
  ck_assert_int_ne(memcmp(a, b, sizeof a), 0);
}
END_TEST

START_TEST(text_windows_errors) {
  enum { N = 100, T = 10 };
  uint8_t bytes[N];
  fsdp_text_t text;
  int tok[4 * 100], tgt[4 * 100];
  ramp_text(&text, bytes, N, 0.0); /* empty validation split */
  ck_assert_int_eq(fsdp_text_windows(&text, 1, 1, 0, 0, 4, T, tok, tgt), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "validation split has 0 bytes"));
  /* A train split of exactly T + 1 bytes has one window; T + 1 more is too long. */
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 1, 0, 0, 4, N - 1, tok, tgt), FSDP_SUCCESS);
  ck_assert_int_eq(tok[0], 0);
  ck_assert_int_eq(tgt[N - 2], N - 1);
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 1, 0, 0, 4, N, tok, tgt), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "train split has 100 bytes"));
  ck_assert_int_eq(fsdp_text_windows(&text, 2, 1, 0, 0, 4, T, tok, tgt), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 1, 0, 0, 0, T, tok, tgt), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 1, 0, -1, 4, T, tok, tgt),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 1, 0, 0, 4, 0, tok, tgt), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_text_windows(&text, 0, 1, 0, 0, 4, T, NULL, tgt),
                   FSDP_ERR_INVALID_ARGUMENT);
}
END_TEST

/* ---- sampler --------------------------------------------------------------- */

START_TEST(sampler_init_checks) {
  static const struct {
    size_t n;
    int64_t gb;
    fsdp_status_t want;
    int64_t batches;
  } cases[] = {
      {10, 3, FSDP_SUCCESS, 3},
      {12, 4, FSDP_SUCCESS, 3},
      {5, 5, FSDP_SUCCESS, 1},
      {1, 1, FSDP_SUCCESS, 1},
      {0, 1, FSDP_ERR_INVALID_ARGUMENT, 0},
      {10, 0, FSDP_ERR_INVALID_ARGUMENT, 0},
      {10, -2, FSDP_ERR_INVALID_ARGUMENT, 0},
      {10, 11, FSDP_ERR_INVALID_ARGUMENT, 0},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    fsdp_sampler_t s;
    ck_assert_int_eq(fsdp_sampler_init(&s, cases[c].n, cases[c].gb, 1), cases[c].want);
    if (cases[c].want != FSDP_SUCCESS) continue;
    ck_assert_int_eq(s.batches_per_epoch, cases[c].batches);
    ck_assert_int_eq(s.epoch, -1);
    fsdp_sampler_free(&s);
  }
  ck_assert_int_eq(fsdp_sampler_init(NULL, 10, 2, 1), FSDP_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(sampler_batch_checks) {
  fsdp_sampler_t s;
  ck_assert_int_eq(fsdp_sampler_init(&s, 10, 4, 1), FSDP_SUCCESS); /* 2 batches */
  uint32_t idx[4];
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, 1, 0, 4, idx), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, 2, 0, 4, idx), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "batch 2 outside [0, 2)"));
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, -1, 0, 4, idx), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_sampler_batch(&s, -1, 0, 0, 4, idx), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, 0, 1, 4, idx), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, 0, 3, 2, idx), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, 0, 0, 0, idx), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, 0, -1, 1, idx), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, 0, 4, 1, idx), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, 0, 0, 4, NULL), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, 0, 3, 1, idx), FSDP_SUCCESS);
  fsdp_sampler_free(&s);
  ck_assert_int_eq(fsdp_sampler_batch(&s, 0, 0, 0, 1, idx), FSDP_ERR_INVALID_ARGUMENT);
}
END_TEST

/* Each epoch visits every sample at most once, every one when gb divides n,
 * and two epochs order them differently. */
START_TEST(sampler_epochs_are_permutations) {
  static const struct {
    size_t n;
    int64_t gb;
  } cases[] = {{60, 12}, {61, 12}, {100, 1}, {7, 7}, {1000, 32}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    fsdp_sampler_t s;
    size_t n = cases[c].n;
    int64_t gb = cases[c].gb;
    ck_assert_int_eq(fsdp_sampler_init(&s, n, gb, 2024), FSDP_SUCCESS);
    uint32_t *order[2], *idx = malloc(gb * sizeof *idx);
    int *seen = malloc(n * sizeof *seen);
    for (int e = 0; e < 2; e++) {
      order[e] = malloc(n * sizeof **order);
      memset(seen, 0, n * sizeof *seen);
      for (int64_t b = 0; b < s.batches_per_epoch; b++) {
        ck_assert_int_eq(fsdp_sampler_batch(&s, e, b, 0, gb, idx), FSDP_SUCCESS);
        for (int64_t k = 0; k < gb; k++) {
          ck_assert_uint_lt(idx[k], n);
          seen[idx[k]]++;
          order[e][b * gb + k] = idx[k];
        }
      }
      size_t once = 0;
      for (size_t i = 0; i < n; i++) {
        ck_assert_int_le(seen[i], 1);
        once += (size_t)seen[i];
      }
      ck_assert_uint_eq(once, (size_t)(s.batches_per_epoch * gb));
    }
    if (n > 1)
      ck_assert_int_ne(
          memcmp(order[0], order[1], (size_t)(s.batches_per_epoch * gb) * sizeof **order), 0);
    free(order[0]);
    free(order[1]);
    free(seen);
    free(idx);
    fsdp_sampler_free(&s);
  }
}
END_TEST

/* Rank r of N takes samples [r*gb/N, (r+1)*gb/N) of each global batch from its
 * own sampler; joined, the shares are the one-rank batch. */
START_TEST(sampler_is_independent_of_world_size) {
  enum { N_SAMPLES = 96, GB = 12, EPOCHS = 3 };
  fsdp_sampler_t one;
  ck_assert_int_eq(fsdp_sampler_init(&one, N_SAMPLES, GB, 99), FSDP_SUCCESS);
  for (int world = 1; world <= 4; world++) {
    fsdp_sampler_t ranks[4];
    for (int r = 0; r < world; r++)
      ck_assert_int_eq(fsdp_sampler_init(&ranks[r], N_SAMPLES, GB, 99), FSDP_SUCCESS);
    for (int e = 0; e < EPOCHS; e++) {
      for (int64_t b = 0; b < one.batches_per_epoch; b++) {
        uint32_t want[GB], got[GB];
        ck_assert_int_eq(fsdp_sampler_batch(&one, e, b, 0, GB, want), FSDP_SUCCESS);
        for (int r = 0; r < world; r++) {
          int64_t first = (int64_t)r * GB / world, count = GB / world;
          ck_assert_int_eq(fsdp_sampler_batch(&ranks[r], e, b, first, count, got + first),
                           FSDP_SUCCESS);
        }
        ck_assert_mem_eq(got, want, sizeof want);
      }
    }
    for (int r = 0; r < world; r++) fsdp_sampler_free(&ranks[r]);
  }
  fsdp_sampler_free(&one);
}
END_TEST

/* The cache holds one epoch: going back and forth gives what a fresh sampler
 * gives, and another seed gives another order. */
START_TEST(sampler_is_deterministic) {
  fsdp_sampler_t a, b, c;
  ck_assert_int_eq(fsdp_sampler_init(&a, 50, 10, 5), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_sampler_init(&b, 50, 10, 5), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_sampler_init(&c, 50, 10, 6), FSDP_SUCCESS);
  uint32_t x[10], y[10], z[10];
  static const int64_t epochs[] = {1, 0, 1, 7, 1};
  for (size_t k = 0; k < sizeof epochs / sizeof epochs[0]; k++) {
    ck_assert_int_eq(fsdp_sampler_batch(&a, epochs[k], 2, 0, 10, x), FSDP_SUCCESS);
    fsdp_sampler_free(&b); /* a fresh instance each time */
    ck_assert_int_eq(fsdp_sampler_init(&b, 50, 10, 5), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_sampler_batch(&b, epochs[k], 2, 0, 10, y), FSDP_SUCCESS);
    ck_assert_mem_eq(x, y, sizeof x);
    ck_assert_int_eq(fsdp_sampler_batch(&c, epochs[k], 2, 0, 10, z), FSDP_SUCCESS);
    ck_assert_int_ne(memcmp(x, z, sizeof x), 0);
  }
  fsdp_sampler_free(&a);
  fsdp_sampler_free(&b);
  fsdp_sampler_free(&c);
}
END_TEST

/* Over many epochs each of 4 samples leads the permutation about equally often. */
START_TEST(sampler_shuffle_is_uniform) {
  enum { EPOCHS = 4000 };
  fsdp_sampler_t s;
  ck_assert_int_eq(fsdp_sampler_init(&s, 4, 1, 3), FSDP_SUCCESS);
  int lead[4] = {0}, last[4] = {0};
  for (int e = 0; e < EPOCHS; e++) {
    uint32_t i;
    ck_assert_int_eq(fsdp_sampler_batch(&s, e, 0, 0, 1, &i), FSDP_SUCCESS);
    lead[i]++;
    ck_assert_int_eq(fsdp_sampler_batch(&s, e, 3, 0, 1, &i), FSDP_SUCCESS);
    last[i]++;
  }
  /* Expected 1000 each, sd ~27: 150 is over five sd. */
  for (int k = 0; k < 4; k++) {
    ck_assert_int_lt(abs(lead[k] - EPOCHS / 4), 150);
    ck_assert_int_lt(abs(last[k] - EPOCHS / 4), 150);
  }
  fsdp_sampler_free(&s);
}
END_TEST

/* ---- main ------------------------------------------------------------------ */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static Suite *data_suite(void) {
  Suite *s = suite_create("data");
  TCase *idx = tcase_create("idx");
  tcase_add_loop_test(idx, idx_load_cases, 0, sizeof idx_cases / sizeof idx_cases[0]);
  tcase_add_test(idx, idx_rejects_a_directory);
  tcase_add_test(idx, fashion_mnist_paths_and_split);
  tcase_add_test(idx, fashion_mnist_real_t10k);
  tcase_set_timeout(idx, 60); /* the real t10k file under valgrind */
  suite_add_tcase(s, idx);
  TCase *text = tcase_create("text");
  tcase_add_test(text, text_load_file_and_split);
  tcase_add_test(text, text_load_directory_in_name_order);
  tcase_add_loop_test(text, text_load_errors, 0, sizeof text_errors / sizeof text_errors[0]);
  tcase_add_test(text, text_windows_lie_inside_the_split);
  tcase_add_test(text, text_windows_are_deterministic_per_sample);
  tcase_add_test(text, text_windows_errors);
  suite_add_tcase(s, text);
  TCase *sampler = tcase_create("sampler");
  tcase_add_test(sampler, sampler_init_checks);
  tcase_add_test(sampler, sampler_batch_checks);
  tcase_add_test(sampler, sampler_epochs_are_permutations);
  tcase_add_test(sampler, sampler_is_independent_of_world_size);
  tcase_add_test(sampler, sampler_is_deterministic);
  tcase_add_test(sampler, sampler_shuffle_is_uniform);
  suite_add_tcase(s, sampler);
  return s;
}

int main(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(tmp_dir, sizeof tmp_dir, "%s/fsdp-test-data-XXXXXX", base);
  if (strlen(base) > 30 || !mkdtemp(tmp_dir)) {
    fprintf(stderr, "test_data: cannot create a temporary directory under %s\n", base);
    return EXIT_FAILURE;
  }
  const int rc = check_run(data_suite());
  nftw(tmp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}
