/* fsdp/ckpt.h — sharded checkpoints: atomic save, load at any world size and
 * strategy, and offline tools (verify, consolidate, reshard, export, import).
 *
 * On disk (little-endian, fp32):
 *   <save_dir>/latest                 "step-<k>\n": the last committed save
 *   <save_dir>/step-<k>/manifest.json format version, checkpoint id, step, world
 *                                     size, strategy, optimizer and its state
 *                                     names, the caller's trainer state, the
 *                                     model's record when one is given (a
 *                                     Llama's configuration), units
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
 * previous checkpoint and `latest` intact; the next save removes the
 * step-*.tmp-* directories of dead saves (a live save's guard, below, keeps
 * its own) and nothing ever reads them. A save that finds step-<k> committed
 * keeps it when it holds exactly this save's bytes (see fsdp_ckpt_save).
 *
 * Sharing a save directory (<save_dir>/lock, see "the save directory of a run"
 * below): byte 0 of the lock file is the run lock (fsdp_ckpt_lock), so a second
 * run is refused with the holder named; byte 1 + (id mod 2^40) is held by rank 0
 * for the life of the save with that checkpoint id. Both are fcntl open file
 * description locks (F_OFD_SETLK), chosen because: the kernel drops them when
 * the holding process dies (a stale lock file never blocks a restart); they
 * belong to one open file, not the whole process, so reading the lock file or
 * a second engine in the same process does not release or share them (classic
 * POSIX fcntl locks are dropped by any close of the file in the process);
 * unlike flock they are byte ranges, one file for the run and every save; and
 * on NFS they are real server-side locks (NLM/NFSv4; Linux emulates flock with
 * the same locks there), where a crashed client's locks are dropped when its
 * lease expires (about 90 s with NFSv4).
 *
 * Errors: every function returns fsdp_status_t and fsdp_last_error() names the
 * file and the problem (FSDP_ERR_IO: missing, unreadable or short; FSDP_ERR_FORMAT:
 * corrupt or not what the manifest says; FSDP_ERR_INVALID_ARGUMENT: the model or
 * optimizer does not match). Collective calls agree on the outcome: a failure on
 * any rank is returned on every rank, with the same message, never a hang.
 *
 * Test hook (not an API): FSDP_CKPT_FAULT=kill:rank=R:step=K:after_bytes=B makes
 * rank R SIGKILL itself after writing B bytes of its files of the save of step K
 * (rank 0's bytes count its shard, then the manifest); stop:... sends SIGSTOP
 * instead (a save held in progress); enospc:latest:step=K makes the write of
 * `latest.tmp` in the commit of the save of step K (not a later repair) fail
 * with ENOSPC, as a full disk does
 * (leaving step-K committed, `latest` at the previous step and an empty
 * latest.tmp). Crash and recovery tests use them.
 *
 * Thread safety: a checkpoint handle is used by one thread at a time. */
#ifndef FSDP_CKPT_H
#define FSDP_CKPT_H

#include "fsdp/engine.h"
#include "fsdp/nn.h"

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
  /* NULL; the Llama the engine holds (checked with fsdp_llama_config_check),
   * recorded as the manifest's "model" so that fsdp_ckpt_llama_config, eval
   * and export --hf know it. Read during the call only. */
  const fsdp_llama_config_t *llama;
} fsdp_ckpt_save_opts_t;
FSDP_ASSERT_NO_TAIL(fsdp_ckpt_save_opts_t, llama);
#define FSDP_CKPT_SAVE_OPTS_MAGIC 0xf5d9c0f3u
#define FSDP_CKPT_SAVE_OPTS_INIT                                                     \
  {                                                                                  \
    .size = sizeof(fsdp_ckpt_save_opts_t), .magic = FSDP_CKPT_SAVE_OPTS_MAGIC,       \
    .version = FSDP_VERSION_CODE, .overwrite = 0, .meta = NULL, .llama = NULL        \
  }

/* Saves the engine's master shards, optimizer state and step (k =
 * fsdp_engine_step_count) as <save_dir>/step-<k>, creating save_dir if needed,
 * and points `latest` at it. When step-<k> is already committed (and not
 * opts->overwrite) it is kept only if it is exactly what this save would
 * write but for its random id: the same manifest (model, layout, optimizer,
 * configuration, trainer state) and every rank's shard equal byte for byte
 * (each rank reads its own file once) with the CRC its manifest records; then
 * nothing is written, `latest` is repaired (fsdp_ckpt_repair) and the call
 * succeeds. That is the restart that re-ran the steps after a failed update
 * of `latest`. Otherwise it refuses (FSDP_ERR_INVALID_USAGE) naming the first
 * difference. Not while units are acquired or
 * between a backward and its step. If path_out is not NULL, it receives the
 * step directory (cap bytes). opts may be NULL. A NaN or Inf in any rank's
 * parameters or optimizer state refuses the save before anything is written:
 * FSDP_ERR_NONFINITE on every rank, naming the rank, tensor, state and first
 * bad index. The loss scale and its good-step count are saved with the step
 * when the engine scales the loss, and restored by fsdp_ckpt_load. */
FSDP_API fsdp_status_t fsdp_ckpt_save(fsdp_engine_t engine, const char *save_dir,
                                      const fsdp_ckpt_save_opts_t *opts, char *path_out,
                                      size_t cap);

/* Load options: start from FSDP_CKPT_LOAD_OPTS_INIT (as above). */
typedef struct {
  size_t size;          /* sizeof(fsdp_ckpt_load_opts_t) as compiled */
  unsigned int magic;   /* FSDP_CKPT_LOAD_OPTS_MAGIC */
  unsigned int version; /* FSDP_VERSION_CODE */
  /* Optimizer state of another kind than the engine's (AdamW vs SGD momentum):
   * 0 (default) refuses; 1 loads the parameters and step, zeroes the state and
   * restarts the optimizer's own step count (fsdp_engine_set_optim_step 0), so
   * the first update is a first update: AdamW's bias correction starts over
   * while the learning-rate schedule continues from the step. A checkpoint
   * without optimizer state (weights only, e.g. from import) always loads
   * this way. */
  int reset_optim;
  int reserved0; /* 0; fills what would be padding (core.h) */
} fsdp_ckpt_load_opts_t;
FSDP_ASSERT_NO_TAIL(fsdp_ckpt_load_opts_t, reserved0);
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
 * else the target of path/latest when that is a symbolic link to a step
 * directory, else path/<contents of path/latest>. FSDP_ERR_IO naming the file
 * when none exists. Local, no collectives. */
FSDP_API fsdp_status_t fsdp_ckpt_resolve(const char *path, char *step_dir, size_t cap);

/* ---- the save directory of a run ---------------------------------------------
 * A trainer opens its save directory before the first step: fsdp_ckpt_lock,
 * then fsdp_ckpt_probe, then (to continue) fsdp_ckpt_repair and
 * fsdp_ckpt_load; fsdp_ckpt_unlock at the end. engine may be NULL for the lock
 * and the repair: this process alone (offline tools); with an engine they are
 * collective: every rank calls them and the outcome, message included, is
 * the same on every rank. */

typedef struct fsdp_ckpt_lock *fsdp_ckpt_lock_t;

/* Creates save_dir if needed and takes its run lock: rank 0 alone holds it
 * (every other save of the run goes through rank 0, and one lock means one
 * lock-server round trip on NFS, not N), records the holder in <save_dir>/lock
 * ("fsdp-train pid 4242 on host h, run <random id>, started <UTC time>, 2
 * ranks") and keeps it until fsdp_ckpt_unlock or its process ends (a forked
 * child without exec shares it; exec does not inherit it). Another run holding
 * it: FSDP_ERR_INVALID_USAGE naming the holder. A lock file left by a dead
 * process holds no lock and is taken over. An unwritable directory:
 * FSDP_ERR_IO. *lock is NULL on failure. fsdp_ckpt_save does not require the
 * lock: a saver without it is not excluded, but is never harmed by another's
 * sweep either. */
FSDP_API fsdp_status_t fsdp_ckpt_lock(fsdp_engine_t engine, const char *save_dir,
                                      fsdp_ckpt_lock_t *lock);
/* Empties the holder record (the file is never removed: see dir.c) and
 * releases the lock. NULL is ignored. Local. */
FSDP_API void fsdp_ckpt_unlock(fsdp_ckpt_lock_t lock);

/* Collective, on a materialised engine. Before training: every rank creates, writes (4 KiB), fsyncs and
 * removes a probe file in save_dir (creating save_dir), and checks with
 * statvfs that the free space (f_bavail) holds one more checkpoint of this
 * engine: every rank's shard (header + parameters + optimizer state, as the
 * manifest will list them), the manifest and `latest`, rounded to blocks. One
 * more, because the previous checkpoint stays until the new one commits;
 * checkpoints are never pruned, so later saves need more and a disk that fills
 * later still fails that save (safely). FSDP_ERR_IO naming the rank and the
 * error, or the bytes needed and free. *need_bytes and *free_bytes (may be
 * NULL) receive the figures. */
FSDP_API fsdp_status_t fsdp_ckpt_probe(fsdp_engine_t engine, const char *save_dir,
                                       uint64_t *need_bytes, uint64_t *free_bytes);

typedef struct {
  int64_t step;     /* the step `latest` names now; -1: no checkpoint in the directory */
  int64_t was;      /* the complete step it named before; -1: missing, dangling or bad */
  int changed;      /* 1 when `latest` was rewritten */
  char reason[512]; /* why it was (rank 0 only), "" when not */
} fsdp_ckpt_repair_t;

/* Points `latest` at the newest complete step of save_dir when it is missing,
 * dangling, unreadable, names an incomplete step, or lags behind (a save that
 * committed step-<k> but failed to update `latest`). Complete means the
 * manifest reads (its CRC and structure) and names that step, and every shard
 * file has its header and size: a few small reads per step, newest first until
 * one passes; the shards' full CRCs are left to the load that follows
 * (fsdp_ckpt_load checks them all, shared across ranks). Never moves `latest`
 * to an older step than a complete one it names, never deletes a step; a
 * leftover latest.tmp is replaced (and renamed away) when it rewrites. Step
 * directories but none complete: FSDP_ERR_FORMAT naming the newest one's
 * problem, nothing changed. Collective with an engine (rank 0 repairs, every
 * rank gets step, was and changed); run while holding the lock. */
FSDP_API fsdp_status_t fsdp_ckpt_repair(fsdp_engine_t engine, const char *save_dir,
                                        fsdp_ckpt_repair_t *out);

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
  const char *param_dtype;/* what the engine gathered: "f32", "bf16" or "f16" */
  int n_states;           /* 1 + optimizer states per element */
  int n_units, n_tensors;
  size_t numel;           /* parameters in all tensors */
  size_t align;
  const fsdp_ckpt_meta_t *meta;
} fsdp_ckpt_info_t;
FSDP_API fsdp_status_t fsdp_ckpt_info(fsdp_ckpt_t ckpt, fsdp_ckpt_info_t *info);

/* The model family a checkpoint holds: "llama" when its manifest records a
 * Llama (fsdp_ckpt_import_hf of a LlamaForCausalLM, or a save with
 * opts->llama), "gpt2" when it has GPT-2's wte and wpe tensors (GPT-2
 * checkpoints record their shape as trainer state "gpt2.*", not as a model
 * record, so that they stay as they always were), else "other" (an MLP, or
 * tensors imported as they are). A static string; "other" for NULL. */
FSDP_API const char *fsdp_ckpt_family(fsdp_ckpt_t ckpt);
/* *out = the Llama configuration the checkpoint records;
 * FSDP_ERR_INVALID_ARGUMENT when it records none (fsdp_ckpt_family is not
 * "llama"). */
FSDP_API fsdp_status_t fsdp_ckpt_llama_config(fsdp_ckpt_t ckpt, fsdp_llama_config_t *out);
/* FSDP_SUCCESS when the checkpoint records no Llama or exactly *want; else
 * FSDP_ERR_INVALID_ARGUMENT naming the first field that differs (a resume of
 * an imported Llama under another configuration: same tensor shapes, other
 * heads, RoPE or epsilon, would load and compute something else). */
FSDP_API fsdp_status_t fsdp_ckpt_llama_check(fsdp_ckpt_t ckpt, const fsdp_llama_config_t *want);

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

/* Checks every shard file: header fields, size, CRC-32, then that every
 * element of every state is finite (FSDP_ERR_NONFINITE naming the tensors,
 * the state, the count and the first index otherwise). Without a model.
 * consolidate, reshard and export verify first, so they refuse such a
 * checkpoint too. */
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
/* Reads full weights from a safetensors file (F32, BF16 or F16, converted to
 * f32; validated strictly: header length, JSON, every entry's dtype, shape and
 * offsets, no gaps, no overlap, the file's exact size) and writes a
 * weights-only checkpoint at step 0 for one rank as <out_dir>/step-0 (+
 * latest); an existing step-0 is refused. GPT-2 names are mapped back
 * ("transformer." prefixes dropped, wte.weight -> wte, wpe.weight -> wpe), the
 * attention-mask buffers (*.attn.bias, *.attn.masked_bias) skipped, and
 * lm_head.weight checked equal to wte (refused otherwise). A file with wte,
 * wpe and ln_f.weight is held to GPT-2's shapes (see fsdp_ckpt_import_hf,
 * which this is with no preset and no flags). fsdp_ckpt_load then starts a
 * model from it. Thread-safe for distinct out_dirs; no collectives. */
FSDP_API fsdp_status_t fsdp_ckpt_import(const char *safetensors_file, const char *out_dir);

/* ---- Hugging Face interop ---------------------------------------------------- */

/* flags of fsdp_ckpt_export_hf and fsdp_ckpt_import_hf */
#define FSDP_CKPT_OVERWRITE 1 /* replace an existing output instead of refusing it */
#define FSDP_CKPT_LOCK 2      /* import: hold out_dir's run lock (fsdp_ckpt_lock) while
                                 writing, taken only once the input passed every check */

/* What an export or import did, for its one summary line. */
typedef struct {
  int tensors;       /* tensors written (import: into the checkpoint) */
  size_t numel;      /* parameters in them */
  uint64_t bytes;    /* bytes of the safetensors file written (export) or read (import) */
  char file[4096];   /* that file */
  char dtype[16];    /* import: the file's dtype ("F32", "BF16", "F16"; "mixed" if several) */
  char out[4096];    /* export: the directory; import: the step directory written */
} fsdp_ckpt_io_summary_t;

/* fsdp_ckpt_export that refuses an existing out_file (FSDP_ERR_INVALID_USAGE)
 * unless flags has FSDP_CKPT_OVERWRITE (fsdp_ckpt_export itself replaces it,
 * as it always did) and fills *summary (may be NULL). */
FSDP_API fsdp_status_t fsdp_ckpt_export_ex(fsdp_ckpt_t ckpt, const char *out_file, int flags,
                                           fsdp_ckpt_io_summary_t *summary);
/* A GPT-2 checkpoint as a directory that transformers'
 * GPT2LMHeadModel.from_pretrained loads: out_dir/model.safetensors (F32,
 * "transformer."-prefixed names, lm_head left out since it is tied to wte and
 * from_pretrained ties it back, as save_pretrained does) and
 * out_dir/config.json (n_layer, n_head, n_embd, n_positions, vocab_size from
 * the tensors' shapes; n_head from the checkpoint's "gpt2.n_head" trainer
 * state, else the n_head argument, else FSDP_ERR_INVALID_ARGUMENT). A
 * checkpoint that records a Llama (fsdp_ckpt_llama_config) becomes what
 * LlamaForCausalLM.from_pretrained loads: its tensors under their own names
 * (HF's), lm_head.weight only when untied, and config.json from the recorded
 * configuration (architectures, model_type "llama", num_key_value_heads,
 * head_dim, rms_norm_eps, rope_theta, rope_scaling null or llama3's,
 * tie_word_embeddings, torch_dtype float32); every tensor must be the one that
 * configuration implies, and n_head, when not 0, must be its heads
 * (FSDP_ERR_INVALID_ARGUMENT otherwise). out_dir is
 * created if missing; an existing model.safetensors or config.json is refused
 * (FSDP_ERR_INVALID_USAGE) unless flags has FSDP_CKPT_OVERWRITE. Files are
 * written to .tmp and renamed. Verifies first. *summary may be NULL. */
FSDP_API fsdp_status_t fsdp_ckpt_export_hf(fsdp_ckpt_t ckpt, const char *out_dir, int n_head,
                                           int flags, fsdp_ckpt_io_summary_t *summary);
/* fsdp_ckpt_import for what Hugging Face publishes: `in` is a directory with
 * config.json and model.safetensors, or with model.safetensors.index.json and
 * the shard files its weight_map names (every shard validated as one file;
 * the shards must hold exactly the tensors the index lists, each in the file
 * it names, and the names must be plain file names in that directory), or a
 * safetensors file or an index (a config.json beside it is used). F32, BF16
 * and F16 tensors are converted to f32 (the summary's dtype says which).
 *
 * The model is a Llama when config.json's model_type is "llama" or, without
 * a config.json, when the file holds model.embed_tokens.weight; any other
 * model_type than "gpt2" and "llama" is FSDP_ERR_UNSUPPORTED. A Llama's
 * configuration comes from config.json (transformers v4's keys: rope_theta,
 * rope_scaling, torch_dtype; or v5's: rope_parameters, dtype;
 * num_key_value_heads absent means num_attention_heads, HF's defaults for
 * the optional ones) and/or `preset` (fsdp_llama_preset's names; both must
 * agree, one is needed); what fsdp's Llama cannot compute is refused naming
 * the key (FSDP_ERR_UNSUPPORTED): attention_bias or mlp_bias true, head_dim
 * other than hidden_size / num_attention_heads, hidden_act other than silu,
 * a rope type other than default and llama3, a dtype other than float32,
 * bfloat16 and float16. Its tensors keep their (HF) names and are held to the
 * shapes of that configuration: the embedding, nine per layer, model.norm
 * and, untied, lm_head.weight; a tied head in the file must equal the
 * embedding (refused, naming the first element that differs, otherwise); the
 * *.rotary_emb.inv_freq buffers older checkpoints saved are skipped. The
 * checkpoint records the configuration (fsdp_ckpt_llama_config) and lists
 * the tensors in the model's order, whether they came from one file or shards.
 *
 * Otherwise (GPT-2) every tensor's shape is checked against the
 * GPT-2 shape that `preset` (fsdp_gpt2_preset's names; may be NULL) and the
 * config.json describe (both must agree), or, with neither, for a file with
 * wte, wpe and ln_f.weight, against the shape they and the layer count imply;
 * a missing, extra or misshapen tensor is FSDP_ERR_FORMAT naming it. lm_head.weight, when present, must equal wte
 * (GPT-2 ties them): an untied head is refused, naming the first element that
 * differs, rather than dropped. The model's shape is recorded in the
 * checkpoint's trainer state ("gpt2.n_layer", ... as fsdp-train writes them).
 * An existing out_dir/step-0 is refused unless flags has FSDP_CKPT_OVERWRITE.
 * A NaN or Inf value is refused (FSDP_ERR_NONFINITE) naming the file, the
 * tensor and the index, as fsdp_ckpt_save refuses one. A header over
 * 100,000,000 bytes or of more than 65536 entries is refused before it is
 * parsed, as is an index naming more than 4096 shards (docs/limits.md).
 * Nothing is created, out_dir included, before the input passed every check.
 * *summary may be NULL (its file is the index for a sharded input, its bytes
 * those of every shard). */
FSDP_API fsdp_status_t fsdp_ckpt_import_hf(const char *in, const char *out_dir,
                                           const char *preset, int flags,
                                           fsdp_ckpt_io_summary_t *summary);

#ifdef __cplusplus
}
#endif
#endif
