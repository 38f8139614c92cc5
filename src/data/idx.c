/* src/data/idx.c — IDX u8 images and labels (the MNIST family's format), plain
 * or gzip-compressed: zlib reads both, passing uncompressed files through. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/internal.h"
#include "fsdp/data.h"

/* The largest array this reader accepts: Fashion-MNIST's train images are
 * 47 MB, so a header asking for 2 GiB or more is corrupt, not big. Keeping
 * under INT_MAX also lets every dimension fit the dataset's int fields. */
#define IDX_MAX_BYTES ((uint64_t)INT32_MAX)

typedef struct {
  const char *what; /* "images" or "labels" */
  uint32_t magic;   /* 0x00 0x00, type 0x08 (u8), number of dimensions */
  int ndims;
} idx_kind_t;

static const idx_kind_t idx_images = {"images", 0x00000803u, 3};
static const idx_kind_t idx_labels = {"labels", 0x00000801u, 1};

typedef struct {
  uint32_t dims[3];
  size_t bytes;
  uint8_t *data; /* (dims[0], ..., dims[ndims-1]) */
} idx_array_t;

/* Reads up to len bytes into dst, setting *got. A clean end of file and a gzip
 * stream cut short both succeed with *got < len, so the caller can say how much
 * arrived; read errors and corrupt compressed data fail here. */
static fsdp_status_t gz_read_bytes(gzFile f, const char *path, uint8_t *dst, size_t len,
                                   size_t *got) {
  size_t done = 0;
  while (done < len) {
    /* gzread takes an unsigned count and returns an int. */
    size_t left = len - done;
    unsigned chunk = left > (1u << 30) ? 1u << 30 : (unsigned)left;
    int r = gzread(f, dst + done, chunk);
    if (r <= 0) break;
    done += (size_t)r;
  }
  *got = done;
  int errnum = Z_OK;
  const char *msg = gzerror(f, &errnum);
  switch (errnum) {
  case Z_OK:
  case Z_BUF_ERROR: /* "unexpected end of file": the caller reports truncation */
    return FSDP_SUCCESS;
  case Z_ERRNO:
    return fsdp_error(FSDP_ERR_IO, "%s: read failed: %s", path, strerror(errno));
  case Z_MEM_ERROR:
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: zlib ran out of memory decompressing", path);
  case Z_DATA_ERROR:
    return fsdp_error(FSDP_ERR_FORMAT, "%s: corrupt gzip data: %s", path, msg);
  default:
    return fsdp_error(FSDP_ERR_IO, "%s: zlib error %d: %s", path, errnum, msg);
  }
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* "60000 images of 28x28 (47040000 bytes)" or "60000 labels (60000 bytes)";
 * sizes over the limit may have saturated, so they are left out. */
static void idx_describe(char *buf, size_t size, const idx_kind_t *kind, const uint32_t *dims,
                         uint64_t bytes) {
  char sz[40] = "";
  if (bytes <= IDX_MAX_BYTES) snprintf(sz, sizeof sz, " (%llu bytes)", (unsigned long long)bytes);
  if (kind->ndims == 3)
    snprintf(buf, size, "%u images of %ux%u%s", dims[0], dims[1], dims[2], sz);
  else
    snprintf(buf, size, "%u labels%s", dims[0], sz);
}

static fsdp_status_t idx_read_header(gzFile f, const char *path, const idx_kind_t *kind,
                                     uint32_t *dims, uint64_t *bytes) {
  uint8_t head[16];
  size_t head_bytes = 4 * (size_t)(1 + kind->ndims), got;
  FSDP_TRY(gz_read_bytes(f, path, head, 4, &got));
  if (got < 4)
    return fsdp_error(
        FSDP_ERR_IO, "%s: truncated: the file ends after %zu bytes, inside the %zu-byte IDX header",
        path, got, head_bytes);
  uint32_t magic = be32(head);
  if (magic != kind->magic) {
    const idx_kind_t *other = kind == &idx_images ? &idx_labels : &idx_images;
    return fsdp_error(FSDP_ERR_FORMAT, "%s: bad magic 0x%08x, expected 0x%08x (IDX u8 %s)%s%s",
                      path, magic, kind->magic, kind->what,
                      magic == other->magic ? "; that is the magic of IDX u8 " : "",
                      magic == other->magic ? other->what : "");
  }
  FSDP_TRY(gz_read_bytes(f, path, head + 4, head_bytes - 4, &got));
  if (got < head_bytes - 4)
    return fsdp_error(
        FSDP_ERR_IO, "%s: truncated: the file ends after %zu bytes, inside the %zu-byte IDX header",
        path, 4 + got, head_bytes);
  uint64_t total = 1;
  for (int d = 0; d < kind->ndims; d++) {
    dims[d] = be32(head + 4 + 4 * d);
    if (dims[d] == 0)
      return fsdp_error(FSDP_ERR_FORMAT,
                        "%s: header says 0 for dimension %d of the %s; the file holds no data",
                        path, d, kind->what);
    /* Saturate instead of overflowing; the limit check below rejects it. */
    total = total > IDX_MAX_BYTES ? total : total * dims[d];
  }
  if (total > IDX_MAX_BYTES) {
    char desc[128];
    idx_describe(desc, sizeof desc, kind, dims, total);
    return fsdp_error(FSDP_ERR_FORMAT,
                      "%s: header says %s, more than the %llu bytes this reader accepts; the "
                      "header is corrupt",
                      path, desc, (unsigned long long)IDX_MAX_BYTES);
  }
  *bytes = total;
  return FSDP_SUCCESS;
}

/* Header and data of one IDX file, which must end exactly where the data does. */
static fsdp_status_t idx_read_stream(gzFile f, const char *path, const idx_kind_t *kind,
                                     idx_array_t *out) {
  uint32_t dims[3] = {0, 0, 0};
  uint64_t bytes = 0;
  FSDP_TRY(idx_read_header(f, path, kind, dims, &bytes));
  char desc[128];
  idx_describe(desc, sizeof desc, kind, dims, bytes);

  uint8_t *data = fsdp_alloc((size_t)bytes);
  if (!data)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: cannot allocate %llu bytes for %s", path,
                      (unsigned long long)bytes, desc);
  fsdp_status_t st;
  size_t got;
  uint8_t extra;
  FSDP_TRYG(st, gz_read_bytes(f, path, data, (size_t)bytes, &got), fail);
  if (got < bytes) {
    st =
        fsdp_error(FSDP_ERR_IO, "%s: truncated: header says %s but the file ends after %zu of "
                   "those %llu bytes", path, desc, got, (unsigned long long)bytes);
    goto fail;
  }
  /* Reading past the data also makes zlib check the gzip trailer. */
  FSDP_TRYG(st, gz_read_bytes(f, path, &extra, 1, &got), fail);
  if (got > 0) {
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: trailing bytes: header says %s but more data follows it",
                    path, desc);
    goto fail;
  }
  int errnum = Z_OK;
  gzerror(f, &errnum);
  if (errnum == Z_BUF_ERROR) {
    st = fsdp_error(FSDP_ERR_IO,
                    "%s: truncated: all %s arrived but the gzip stream ends before its trailer",
                    path, desc);
    goto fail;
  }
  memcpy(out->dims, dims, sizeof dims);
  out->bytes = (size_t)bytes;
  out->data = data;
  return FSDP_SUCCESS;
fail:
  fsdp_free(data);
  return st;
}

static fsdp_status_t idx_read(const char *path, const idx_kind_t *kind, idx_array_t *out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot open IDX %s file: %s", path, kind->what,
                      strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int err = errno;
    close(fd);
    return fsdp_error(FSDP_ERR_IO, "%s: cannot stat IDX %s file: %s", path, kind->what,
                      strerror(err));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return fsdp_error(FSDP_ERR_IO, "%s: expected an IDX %s file but it is %s", path, kind->what,
                      S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file");
  }
  gzFile f = gzdopen(fd, "rb");
  if (!f) {
    close(fd);
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: zlib could not set up a reader", path);
  }
  fsdp_status_t st = idx_read_stream(f, path, kind, out);
  gzclose(f);
  return st;
}

fsdp_status_t fsdp_idx_load(const char *images_path, const char *labels_path,
                            fsdp_idx_dataset_t *out) {
  if (!images_path || !labels_path || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "idx load: images_path, labels_path and out must not be NULL");
  idx_array_t images = {{0}, 0, NULL}, labels = {{0}, 0, NULL};
  fsdp_status_t st;
  FSDP_TRYG(st, idx_read(images_path, &idx_images, &images), done);
  FSDP_TRYG(st, idx_read(labels_path, &idx_labels, &labels), done);
  if (labels.dims[0] != images.dims[0]) {
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: %u images but %u labels in %s", images_path,
                    images.dims[0], labels.dims[0], labels_path);
    goto done;
  }
  /* The header check bounds the product of the dimensions by INT32_MAX. */
  out->n = (int)images.dims[0];
  out->rows = (int)images.dims[1];
  out->cols = (int)images.dims[2];
  out->images = images.data;
  out->labels = labels.data;
  images.data = labels.data = NULL;
done:
  fsdp_free(labels.data);
  fsdp_free(images.data);
  return st;
}

void fsdp_idx_free(fsdp_idx_dataset_t *ds) {
  if (!ds) return;
  fsdp_free(ds->images);
  fsdp_free(ds->labels);
  memset(ds, 0, sizeof *ds);
}

fsdp_status_t fsdp_fashion_mnist_load(const char *dir, const char *split, fsdp_idx_dataset_t *out) {
  if (!dir || !split || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fashion-mnist load: dir, split and out must not be NULL");
  if (strcmp(split, "train") != 0 && strcmp(split, "t10k") != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fashion-mnist load: split \"%s\" is neither \"train\" nor \"t10k\"", split);
  size_t len = strlen(dir) + strlen(split) + sizeof "/-images-idx3-ubyte.gz";
  char *images = fsdp_alloc(len), *labels = fsdp_alloc(len);
  fsdp_status_t st;
  if (!images || !labels) {
    st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fashion-mnist load: cannot allocate paths under %s",
                    dir);
  } else {
    snprintf(images, len, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(labels, len, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    st = fsdp_idx_load(images, labels, out);
  }
  fsdp_free(labels);
  fsdp_free(images);
  return st;
}
