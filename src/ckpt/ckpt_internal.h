/* src/ckpt/ckpt_internal.h — what the checkpoint sources share: the parsed
 * manifest, the shard header, file I/O with CRCs and fsync, the commit
 * protocol, and element reads across shard files. Not installed. */
#ifndef FSDP_CKPT_INTERNAL_H
#define FSDP_CKPT_INTERNAL_H

#include <stdint.h>

#include "core/json.h"
#include "core/internal.h"
#include "fsdp/ckpt.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoints store little-endian fp32 as raw bytes: add byte swapping for this host"
#endif

#define CKPT_VERSION 1
#define CKPT_HEADER_BYTES 64
#define CKPT_MAX_STATES 3
#define CKPT_PATH_MAX 4096
#define CKPT_MANIFEST "manifest.json"
#define CKPT_CRC_KEY "\"manifest_crc32\": \""

typedef struct {
  size_t begin, end; /* real elements [begin, end) of the unit's flat buffer */
} ckpt_range_t;

typedef struct {
  char *name, *kind;
  size_t numel;
  ckpt_range_t *ranges; /* (world) a partition of [0, numel) in rank order */
} ckpt_unit_t;

typedef struct {
  char *name;
  int unit;
  size_t offset, numel;
  int ndim;
  int64_t shape[FSDP_MAX_DIMS];
} ckpt_tensor_t;

typedef struct {
  uint64_t bytes; /* header + payload */
  uint32_t crc;   /* CRC-32 of the whole file */
} ckpt_file_t;

typedef struct {
  char dir[CKPT_PATH_MAX]; /* the step directory */
  int64_t step;
  uint64_t id;
  int world;
  char strategy[16], optimizer[16], param_dtype[8];
  int n_states;                             /* 1 + optimizer states */
  const char *state_names[CKPT_MAX_STATES]; /* static strings */
  size_t align;
  fsdp_ckpt_meta_t meta;
  int n_units, n_tensors;
  ckpt_unit_t *units;
  ckpt_tensor_t *tensors;
  ckpt_file_t *files;  /* (world) */
  uint64_t *section;   /* (world * n_units) byte offset of unit u in rank r's file */
  /* Informational, written by save for people reading the manifest. */
  const fsdp_config_t *cfg;
  /* The engine's loss scaler (fsdp_engine_scaler_state), when it scales:
   * "loss_scaler" in the manifest, optional. */
  int has_scaler;
  double loss_scale;
  int64_t good_steps;
  /* The model, when its family records one: "model" in the manifest, written
   * only then (GPT-2 and MLP checkpoints have none; their tensors and trainer
   * state say what they hold). has_llama 1: a Llama of configuration llama. */
  int has_llama;
  fsdp_llama_config_t llama;
} ckpt_manifest_t;

/* ---- manifest (manifest.c) ------------------------------------------------ */

/* Static name of state s of an optimizer: "param", "exp_avg", ... */
const char *ckpt_state_name(const char *optimizer, int state);
/* Allocates the tables (zeroed) for world ranks, n_units and n_tensors. */
fsdp_status_t ckpt_manifest_alloc(ckpt_manifest_t *m, int world, int n_units, int n_tensors);
void ckpt_manifest_free(ckpt_manifest_t *m);
/* Section offsets from the ranges; checks ranges partition each unit. */
fsdp_status_t ckpt_manifest_layout(ckpt_manifest_t *m, const char *what);
/* The manifest text, with its CRC line last. */
fsdp_status_t ckpt_manifest_write(const ckpt_manifest_t *m, sbuf_t *out);
/* Parses and checks <dir>/manifest.json (CRC first, then every field). */
fsdp_status_t ckpt_manifest_read(const char *dir, ckpt_manifest_t *m);
/* Index of the tensor named name, or -1. */
int ckpt_find_tensor(const ckpt_manifest_t *m, const char *name);
/* Writes "<dir>/rank-<r>-of-<N>.bin" into out. */
void ckpt_shard_path(const ckpt_manifest_t *m, int r, char *out, size_t cap);

/* ---- shard header (manifest.c) --------------------------------------------- */

void ckpt_header_encode(const ckpt_manifest_t *m, int rank, uint8_t out[CKPT_HEADER_BYTES]);
/* Checks a header read from path against the manifest's rank r. */
fsdp_status_t ckpt_header_check(const ckpt_manifest_t *m, int r, const char *path,
                                const uint8_t in[CKPT_HEADER_BYTES]);

/* ---- files (io.c) ------------------------------------------------------------- */

typedef struct {
  int fd;
  char path[CKPT_PATH_MAX];
  uint32_t crc;
  uint64_t bytes;
  int64_t *fault_budget; /* test hook: bytes left before SIGKILL, NULL none */
  int fail_errno;        /* test hook: writes fail with this errno, 0 none */
  int compare;           /* 1: compare with the existing file instead of writing */
  char *scratch;         /* compare mode's read buffer */
} ckpt_writer_t;

/* Creates path (truncating) for writing. */
fsdp_status_t ckpt_writer_open(ckpt_writer_t *w, const char *path, int64_t *fault_budget);
/* A writer that writes nothing: ckpt_write checks the bytes against the
 * existing file (FSDP_ERR_FORMAT naming the first differing byte) and close
 * that the file ends there. The CRC and byte count are kept as in writing. */
fsdp_status_t ckpt_writer_open_compare(ckpt_writer_t *w, const char *path);
fsdp_status_t ckpt_write(ckpt_writer_t *w, const void *buf, size_t n);
/* fsync and close; on failure the file is left for the caller to remove. */
fsdp_status_t ckpt_writer_close(ckpt_writer_t *w);
void ckpt_writer_abort(ckpt_writer_t *w);

/* The FSDP_CKPT_FAULT budget for this rank's save of step (or -1: none). */
int64_t ckpt_fault_budget(int rank, int64_t step);
/* 1 when FSDP_CKPT_FAULT=enospc:<file>:step=<step> asks writes of `file`
 * ("latest") in the save of step to fail with ENOSPC (a full disk). */
int ckpt_fault_enospc(const char *file, int64_t step);

fsdp_status_t ckpt_read_whole(const char *path, char **buf, size_t *len);
fsdp_status_t ckpt_pread(int fd, const char *path, void *buf, size_t n, uint64_t off);
/* CRC-32 and size of a whole file, streaming. */
fsdp_status_t ckpt_file_crc(int fd, const char *path, uint64_t bytes, uint32_t *crc);
uint32_t ckpt_crc(uint32_t crc, const void *buf, size_t n);
/* Makes dir and its missing parents; FSDP_ERR_IO when it is not a directory. */
fsdp_status_t ckpt_make_dirs(const char *dir);
fsdp_status_t ckpt_fsync_dir(const char *dir);
/* Removes a directory and the plain files in it (one level: our step dirs). */
fsdp_status_t ckpt_remove_dir(const char *dir);
/* Removes a temporary directory after a failure, best effort, keeping the
 * failure's message (a later save removes what is left). */
void ckpt_discard(const char *tmp);
uint64_t ckpt_random_id(void);
/* snprintf into out, FSDP_ERR_INVALID_ARGUMENT when it does not fit. */
fsdp_status_t ckpt_path(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- commit protocol (commit.c) -------------------------------------------- */

/* Makes save_dir, refuses an existing step-<step> unless overwrite, removes
 * the step-*.tmp-* of dead saves (a live save's guard keeps its own), takes
 * this save's guard (*guard, for ckpt_guard_release once the save is
 * committed or discarded) and creates the temporary directory tmp_out. */
fsdp_status_t ckpt_prepare(const char *save_dir, int64_t step, uint64_t id, int overwrite,
                           char *tmp_out, size_t cap, int *guard);
/* Writes the manifest into tmp (fsynced), renames tmp to step-<step>
 * (replacing it when it exists), fsyncs save_dir, then replaces latest. */
fsdp_status_t ckpt_commit(const ckpt_manifest_t *m, const char *save_dir, const char *tmp,
                          int64_t *fault_budget, char *path_out, size_t cap);
/* Replaces save_dir/latest with "step-<step>" (write, fsync, rename, fsync). */
fsdp_status_t ckpt_point_latest(const char *save_dir, int64_t step);

/* ---- the lock file (lock.c) --------------------------------------------------- */

/* <save_dir>/lock: byte 0 is the run lock (fsdp_ckpt_lock); byte 1 + (id mod
 * 2^40) guards the save with checkpoint id `id` while it lives. Open file
 * description locks (fcntl F_OFD_SETLK): see ckpt.h for why. */
#define CKPT_LOCK_FILE "lock"
/* Takes save `id`'s guard: *fd holds it. FSDP_ERR_INVALID_USAGE when another
 * open file (a live save) holds it; FSDP_ERR_IO when the lock file cannot be
 * opened or locked. */
fsdp_status_t ckpt_guard_take(const char *save_dir, uint64_t id, int *fd);
void ckpt_guard_release(int fd); /* -1 is ignored */

/* ---- the save directory (dir.c) ------------------------------------------------ */

/* Complete means: the manifest reads (CRC and structure), names step k, and
 * every shard file has the header and the size the manifest says (no shard
 * CRCs: that is the load's and verify's full read). */
fsdp_status_t ckpt_step_complete(const char *step_dir, int64_t k);
/* Rank 0's part of fsdp_ckpt_repair (one process, the caller holds the lock). */
fsdp_status_t ckpt_repair_local(const char *save_dir, fsdp_ckpt_repair_t *out);

/* ---- the live engine (live.c) ------------------------------------------------- */

/* Every rank passes its status; all return the lowest failing rank's status
 * and message (or the collective's own error). */
fsdp_status_t ckpt_agree(fsdp_comm_t comm, fsdp_status_t st);
/* ckpt_agree over the engine's ranks; engine NULL: this process alone (st). */
fsdp_status_t ckpt_engine_agree(fsdp_engine_t e, fsdp_status_t st);
/* The engine's rank; 0 when e is NULL. */
int ckpt_engine_rank(fsdp_engine_t e);
/* Buffers per shard element the engine's optimizer keeps, master included:
 * 3 (AdamW: m, v), 2 (SGD with momentum), else 1, as materialize allocates. */
int ckpt_engine_states(fsdp_engine_t e);
/* Fails (changing nothing that matters) unless the engine is materialized and
 * between steps. */
fsdp_status_t ckpt_engine_idle(fsdp_engine_t e, const char *what);
/* The manifest of the live engine, without file sizes and CRCs. */
fsdp_status_t ckpt_manifest_from_engine(fsdp_engine_t e, ckpt_manifest_t *m);
/* Rank `rank`'s shard file of the live engine (header, then every unit's
 * states) through w: written, or compared (ckpt_writer_open_compare). */
fsdp_status_t ckpt_stream_shard(fsdp_engine_t e, const ckpt_manifest_t *m, int rank,
                                ckpt_writer_t *w);

/* ---- a step already committed (adopt.c) ---------------------------------------- */

/* Collective, before a save of step k without overwrite. *adopted = 0 when
 * step-<k> does not exist. When it does, it is adopted (*adopted = 1, `latest`
 * repaired, path_out set) only if it is exactly what this save would write
 * but for its random id: the same manifest text (model, layout, optimizer,
 * configuration, trainer state) and, on every rank, its shard byte for byte
 * with the CRC the manifest records. Anything else: FSDP_ERR_INVALID_USAGE
 * naming the first difference (the old refusal to overwrite). */
fsdp_status_t ckpt_adopt(fsdp_engine_t e, const char *save_dir, ckpt_manifest_t *m, int *adopted,
                         char *path_out, size_t cap);

/* ---- reading elements (read.c) --------------------------------------------- */

/* Open shard files of a manifest, opened on first use. */
typedef struct {
  const ckpt_manifest_t *m;
  int *fds; /* (world), -1 not open */
} ckpt_files_t;

fsdp_status_t ckpt_files_init(ckpt_files_t *f, const ckpt_manifest_t *m);
void ckpt_files_close(ckpt_files_t *f);
/* Header and size of file r (and its CRC when crc != 0). */
fsdp_status_t ckpt_check_file(ckpt_files_t *f, int r, int crc);
/* out[0..count) = flat elements [first, first+count) of unit u, state s. */
fsdp_status_t ckpt_read_unit(ckpt_files_t *f, int u, int s, size_t first, size_t count,
                             float *out);
/* out[0..count) = elements [first, first+count) of tensor t, state s. */
fsdp_status_t ckpt_read_elems(ckpt_files_t *f, int t, int s, size_t first, size_t count,
                              float *out);

/* ---- safetensors (safetensors.c) ---------------------------------------------- */

/* A tensor entry written into a safetensors header. */
typedef struct {
  const char *name;
  int ndim;
  const int64_t *shape;
  size_t numel;
} st_entry_t;

/* The header (length prefix included, padded to 8 bytes) for entries laid
 * out in order; metadata is a JSON object's members text ("" for none). */
fsdp_status_t st_header(const st_entry_t *e, int n, const char *metadata, sbuf_t *out);

#endif
