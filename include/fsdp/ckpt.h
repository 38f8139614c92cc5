/* fsdp/ckpt.h — sharded checkpoints: atomic save, load at any world size and
 * strategy, and offline tools (verify, consolidate, reshard, export, import).
 *
 * On disk (little-endian, fp32):
 *   <save_dir>/latest                 "step-<k>\n": the last committed save
 *   <save_dir>/step-<k>/manifest.json format version, checkpoint id, step, world
 *                                     size, strategy, optimizer and its state
 *                                     names, the caller's trainer state, units
 *                                     with each rank's element range, the tensor
 *                                     table (name, shape, dtype, unit, offset),
 *                                     each shard file's size and CRC-32, and a
 *                                     CRC-32 of the manifest itself (last line)
 *   <save_dir>/step-<k>/rank-<r>-of-<N>.bin
 *                                     a 64-byte header (magic, version, step,
 *                                     checkpoint id, rank, world, counts, its own
 *                                     CRC), then for every unit in order this
 *                                     rank's real elements of the master
 *                                     parameters, then of each optimizer state.
 * Only real elements are stored: the format does not depend on the engine's
 * alignment or padding, and ranges, not shapes of shards, say who holds what.
 * Under NO_SHARD every rank holds everything; each writes an even 1/N of it.
 *
 * Commit protocol (fsdp_ckpt_save): every rank writes and fsyncs its file in
 * <save_dir>/step-<k>.tmp-<id>/; after a collective check rank 0 writes and
 * fsyncs the manifest, renames the directory to step-<k>, fsyncs <save_dir>,
 * then replaces `latest` by write-fsync-rename. A crash at any point leaves the
 * previous checkpoint and `latest` intact; the next save removes stale
 * step-*.tmp-* directories and nothing ever reads them. Two jobs must not save
 * into one directory at the same time.
 *
 * Errors: every function returns fsdp_status_t and fsdp_last_error() names the
 * file and the problem (FSDP_ERR_IO: missing, unreadable or short; FSDP_ERR_FORMAT:
 * corrupt or not what the manifest says; FSDP_ERR_INVALID_ARGUMENT: the model or
 * optimizer does not match). Collective calls agree on the outcome: a failure on
 * any rank is returned on every rank, with the same message, never a hang.
 *
 * Test hook (not an API): FSDP_CKPT_FAULT=kill:rank=R:step=K:after_bytes=B makes
 * rank R SIGKILL itself after writing B bytes of its files of the save of step K
 * (rank 0's bytes count its shard, then the manifest). Crash tests use it.
 *
 * Thread safety: a checkpoint handle is used by one thread at a time. */
#ifndef FSDP_CKPT_H
#define FSDP_CKPT_H

#include "fsdp/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- trainer state ----------------------------------------------------------
 * Integers the caller stores with a checkpoint (seed, data position, ...), kept
 * under "trainer" in the manifest. The engine's own step is always saved. */
#define FSDP_CKPT_META_MAX 16
#define FSDP_CKPT_KEY_MAX 32
typedef struct {
  int n;
  struct {
    char key[FSDP_CKPT_KEY_MAX]; /* [A-Za-z0-9_.-], not empty */
    int64_t value;
  } kv[FSDP_CKPT_META_MAX];
} fsdp_ckpt_meta_t;

/* Sets (or replaces) key. FSDP_ERR_INVALID_ARGUMENT when the key is not valid
 * or the table is full. */
FSDP_API fsdp_status_t fsdp_ckpt_meta_set(fsdp_ckpt_meta_t *meta, const char *key, int64_t value);
/* *value when key is present; FSDP_ERR_INVALID_ARGUMENT naming the key when not. */
FSDP_API fsdp_status_t fsdp_ckpt_meta_get(const fsdp_ckpt_meta_t *meta, const char *key,
                                          int64_t *value);

/* ---- save and load (collective: every rank of the engine calls them) -------- */

/* Save options: start from FSDP_CKPT_SAVE_OPTS_INIT (size, magic and version
 * first, fields only appended, as fsdp_config_t). */
typedef struct {
  size_t size;                  /* sizeof(fsdp_ckpt_save_opts_t) as compiled */
  unsigned int magic;           /* FSDP_CKPT_SAVE_OPTS_MAGIC */
  unsigned int version;         /* FSDP_VERSION_CODE */
  int overwrite;                /* 0; 1: replace an existing committed step-<k> */
  const fsdp_ckpt_meta_t *meta; /* NULL; trainer state to record */
} fsdp_ckpt_save_opts_t;
#define FSDP_CKPT_SAVE_OPTS_MAGIC 0xf5d9c0f3u
#define FSDP_CKPT_SAVE_OPTS_INIT                                                     \
  {                                                                                  \
    .size = sizeof(fsdp_ckpt_save_opts_t), .magic = FSDP_CKPT_SAVE_OPTS_MAGIC,       \
    .version = FSDP_VERSION_CODE, .overwrite = 0, .meta = NULL                       \
  }

/* Saves the engine's master shards, optimizer state and step (k =
 * fsdp_engine_step_count) as <save_dir>/step-<k>, creating save_dir if needed,
 * and points `latest` at it. Refuses (FSDP_ERR_INVALID_USAGE) when step-<k> is
 * already committed unless opts->overwrite. Not while units are acquired or
 * between a backward and its step. If path_out is not NULL, it receives the
 * step directory (cap bytes). opts may be NULL. */
FSDP_API fsdp_status_t fsdp_ckpt_save(fsdp_engine_t engine, const char *save_dir,
                                      const fsdp_ckpt_save_opts_t *opts, char *path_out,
                                      size_t cap);

/* Load options: start from FSDP_CKPT_LOAD_OPTS_INIT (as above). */
typedef struct {
  size_t size;          /* sizeof(fsdp_ckpt_load_opts_t) as compiled */
  unsigned int magic;   /* FSDP_CKPT_LOAD_OPTS_MAGIC */
  unsigned int version; /* FSDP_VERSION_CODE */
  /* Optimizer state of another kind than the engine's (AdamW vs SGD momentum):
   * 0 (default) refuses; 1 loads the parameters and step and zeroes the state. A
   * checkpoint without optimizer state (weights only, e.g. from import) always
   * loads this way. */
  int reset_optim;
} fsdp_ckpt_load_opts_t;
#define FSDP_CKPT_LOAD_OPTS_MAGIC 0xf5d9c0f4u
#define FSDP_CKPT_LOAD_OPTS_INIT                                                     \
  {                                                                                  \
    .size = sizeof(fsdp_ckpt_load_opts_t), .magic = FSDP_CKPT_LOAD_OPTS_MAGIC,       \
    .version = FSDP_VERSION_CODE, .reset_optim = 0                                   \
  }

/* Loads a checkpoint into a materialized engine of any world size, strategy and
 * wrapping: tensors are matched by name and must agree in shape and dtype, and
 * every tensor of the model must be in the checkpoint and vice versa. path is a
 * step directory or a save directory (then `latest` says which step). Each rank
 * reads only the elements it now owns.
 *
 * Before anything live changes, every rank checks the manifest (its CRC and
 * structure), the model match and every shard's header and size, and the ranks
 * share out the whole-file CRC-32 check of the shard files (file f by rank
 * f mod N); the verdict is agreed collectively. Only then are the master shards
 * and optimizer state overwritten and fsdp_engine_set_step called. A read error
 * after that point (a file changed or vanished during the load) is reported
 * with a note that the engine's state is partly overwritten and must be loaded
 * again. meta (may be NULL) receives the trainer state; path_out (may be NULL)
 * the step directory loaded. opts may be NULL. */
FSDP_API fsdp_status_t fsdp_ckpt_load(fsdp_engine_t engine, const char *path,
                                      const fsdp_ckpt_load_opts_t *opts, fsdp_ckpt_meta_t *meta,
                                      char *path_out, size_t cap);

/* The step directory `path` names: path itself when it holds manifest.json,
 * else path/<contents of path/latest>. FSDP_ERR_IO naming the file when
 * neither exists. Local, no collectives. */
FSDP_API fsdp_status_t fsdp_ckpt_resolve(const char *path, char *step_dir, size_t cap);

/* ---- offline access (one process, no engine, no MPI) ------------------------- */

typedef struct fsdp_ckpt *fsdp_ckpt_t;

/* Opens the checkpoint at path (as in fsdp_ckpt_resolve): reads the manifest,
 * checks its CRC and structure. Shard files are only checked by verify and read
 * on demand. */
FSDP_API fsdp_status_t fsdp_ckpt_open(const char *path, fsdp_ckpt_t *ckpt);
FSDP_API void fsdp_ckpt_close(fsdp_ckpt_t ckpt); /* NULL is ignored */

typedef struct {
  const char *dir;        /* the step directory */
  int64_t step;
  uint64_t id;            /* random per save; shard headers repeat it */
  int world_size;
  const char *strategy;   /* "zero3", "zero2", "noshard", or "import" */
  const char *optimizer;  /* "adamw", "sgd" or "none" */
  const char *param_dtype;/* what the engine gathered: "f32" or "bf16" */
  int n_states;           /* 1 + optimizer states per element */
  int n_units, n_tensors;
  size_t numel;           /* parameters in all tensors */
  size_t align;
  const fsdp_ckpt_meta_t *meta;
} fsdp_ckpt_info_t;
FSDP_API fsdp_status_t fsdp_ckpt_info(fsdp_ckpt_t ckpt, fsdp_ckpt_info_t *info);

typedef struct {
  const char *name, *unit;
  int ndim;
  int64_t shape[FSDP_MAX_DIMS];
  size_t numel;
  size_t offset; /* in the unit's flat buffer */
} fsdp_ckpt_tensor_t;
FSDP_API fsdp_status_t fsdp_ckpt_tensor(fsdp_ckpt_t ckpt, int index, fsdp_ckpt_tensor_t *t);
/* State s's name: 0 "param", then "exp_avg", "exp_avg_sq" (AdamW) or
 * "momentum_buffer" (SGD); "unknown" when out of range. */
FSDP_API const char *fsdp_ckpt_state_name(fsdp_ckpt_t ckpt, int state);

/* Checks every shard file: header fields, size, CRC-32. Without a model. */
FSDP_API fsdp_status_t fsdp_ckpt_verify(fsdp_ckpt_t ckpt);
/* out[0..count) = elements [first, first+count) of tensor `index`, state
 * `state`, read from the shard files that hold them. */
FSDP_API fsdp_status_t fsdp_ckpt_read(fsdp_ckpt_t ckpt, int index, int state, size_t first,
                                      size_t count, float *out);

/* One safetensors file with every tensor: parameters under their own names and
 * optimizer state as "optim.<state>.<name>"; __metadata__ holds the step and
 * the trainer state. Streams through a fixed buffer: memory does not grow with
 * the model. Written to out_file.tmp and renamed. Verifies first. */
FSDP_API fsdp_status_t fsdp_ckpt_consolidate(fsdp_ckpt_t ckpt, const char *out_file);
/* Parameters only, as safetensors with the published GPT-2 names ("wte" and
 * "wpe" become "wte.weight" and "wpe.weight"; the rest already match) and
 * {"format": "pt"} metadata, so other tools can read them. Streaming, verifies
 * first. */
FSDP_API fsdp_status_t fsdp_ckpt_export(fsdp_ckpt_t ckpt, const char *out_file);
/* Rewrites the checkpoint for `world` ranks as <out_dir>/step-<k> (+ latest),
 * with the same commit protocol as a save. Streaming, verifies first. */
FSDP_API fsdp_status_t fsdp_ckpt_reshard(fsdp_ckpt_t ckpt, int world, const char *out_dir);
/* Reads full weights from a safetensors file (F32 only, validated strictly:
 * header length, JSON, every entry's dtype, shape and offsets, no gaps, no
 * overlap, the file's exact size) and writes a weights-only checkpoint at step
 * 0 for one rank as <out_dir>/step-0 (+ latest). GPT-2 names are mapped back
 * ("transformer." prefixes dropped, wte.weight -> wte, wpe.weight -> wpe) and
 * the attention-mask buffers (*.attn.bias, *.attn.masked_bias) and the tied
 * lm_head.weight are skipped. fsdp_ckpt_load then starts a model from it. */
FSDP_API fsdp_status_t fsdp_ckpt_import(const char *safetensors_file, const char *out_dir);

#ifdef __cplusplus
}
#endif
#endif
