/* src/tools/fsdp_ckpt.c — fsdp-ckpt: look at, check, repair and convert
 * checkpoints without MPI or a model: inspect, verify, repair, consolidate,
 * export, import, reshard. Each command is a call into fsdp/ckpt.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "fsdp/ckpt.h"

static const char usage_text[] =
    "usage: fsdp-ckpt [--stats] COMMAND ...\n"
    "  inspect PATH                     step, world size, strategy, optimizer, trainer state,\n"
    "                                   tensors with their shapes and units\n"
    "  verify PATH                      every shard's header, size and CRC-32, and no NaN/Inf\n"
    "                                   (no model needed)\n"
    "  repair SAVE_DIR                  point a missing, dangling or lagging `latest` at the\n"
    "                                   newest complete step (takes the directory's lock)\n"
    "  consolidate PATH OUT.safetensors every tensor and optimizer state in one file\n"
    "  export PATH OUT.safetensors      parameters only, GPT-2 names, for other tools\n"
    "  export PATH --hf DIR [--n-head N] DIR/model.safetensors + config.json that\n"
    "                                   transformers' GPT2LMHeadModel or LlamaForCausalLM\n"
    "                                   .from_pretrained loads (--n-head for GPT-2\n"
    "                                   checkpoints that do not record it)\n"
    "  import IN SAVE_DIR [--preset P]  a weights-only checkpoint (step 0) to --resume from;\n"
    "                                   IN: a safetensors file or a Hugging Face directory\n"
    "                                   (config.json + model.safetensors, or its sharded\n"
    "                                   model.safetensors.index.json), GPT-2 or Llama,\n"
    "                                   F32/BF16/F16; shapes checked against config.json\n"
    "                                   and the preset (GPT-2's or Llama's by the model)\n"
    "  reshard PATH --world N SAVE_DIR  rewrite the checkpoint for N ranks\n"
    "export and import refuse to replace their output unless --overwrite.\n"
    "PATH is a step directory (SAVE_DIR/step-K) or a save directory (its `latest` is used).\n"
    "repair, import and reshard take SAVE_DIR's lock: refused while a trainer saves there.\n"
    "--stats prints the command's wall time and peak resident memory to stderr.\n"
    "Exit status: 0 success, 1 the checkpoint or file is bad (the message says which and why),\n"
    "2 usage.\n";

static void print_shape(const int64_t *shape, int ndim) {
  char text[96];
  size_t n = (size_t)snprintf(text, sizeof text, "(");
  for (int d = 0; d < ndim; d++)
    n += (size_t)snprintf(text + n, sizeof text - n, "%s%" PRId64, d ? ", " : "", shape[d]);
  snprintf(text + n, sizeof text - n, ")");
  printf(" %-16s", text);
}

static void print_summary(fsdp_ckpt_t c) {
  fsdp_ckpt_info_t in;
  fsdp_ckpt_info(c, &in);
  printf("checkpoint %s\n  step %" PRId64 " | world %d | %s | %s (", in.dir, in.step,
         in.world_size, in.strategy, in.optimizer);
  for (int s = 0; s < in.n_states; s++) printf("%s%s", s ? ", " : "", fsdp_ckpt_state_name(c, s));
  printf(") | param dtype %s | align %zu | id %016" PRIx64 "\n", in.param_dtype, in.align, in.id);
  printf("  %zu parameters in %d units, %d tensors | trainer state:", in.numel, in.n_units,
         in.n_tensors);
  for (int i = 0; i < in.meta->n; i++)
    printf(" %s=%" PRId64, in.meta->kv[i].key, in.meta->kv[i].value);
  printf("%s\n", in.meta->n ? "" : " none");
  fsdp_llama_config_t l;
  if (fsdp_ckpt_llama_config(c, &l) == FSDP_SUCCESS) {
    printf("  model: llama, %d layers, width %d, %d heads / %d KV, FFN %d, vocabulary %d, "
           "context %d, rope_theta %g", l.n_layer, l.n_embd, l.n_head, l.n_kv_head, l.ffn_hidden,
           l.vocab_size, l.max_seq_len, (double)l.rope_theta);
    if (l.rope_type == FSDP_ROPE_LLAMA3)
      printf(" (llama3 x%g, %g..%g, original %d)", (double)l.rope_factor,
             (double)l.rope_low_freq_factor, (double)l.rope_high_freq_factor,
             l.rope_original_max_pos);
    printf(", rms_eps %g, %s head\n", (double)l.rms_eps, l.tie_embeddings ? "tied" : "untied");
  }
}

static int inspect(fsdp_ckpt_t c) {
  fsdp_ckpt_info_t in;
  fsdp_ckpt_info(c, &in);
  print_summary(c);
  printf("  %-36s %-16s %-10s %12s\n", "tensor", "shape", "unit", "offset");
  for (int i = 0; i < in.n_tensors; i++) {
    fsdp_ckpt_tensor_t t;
    if (fsdp_ckpt_tensor(c, i, &t)) return 1;
    printf("  %-36s", t.name);
    print_shape(t.shape, t.ndim);
    printf(" %-10s %12zu\n", t.unit, t.offset);
  }
  return 0;
}

/* Peak resident memory of this program: VmHWM belongs to the address space
 * exec created, while getrusage's maxrss also keeps the peak of whatever
 * process forked us before the exec. */
static double peak_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  double kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lf kB", &kib) == 1) break;
  if (f) fclose(f);
  if (kib < 0) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    kib = (double)ru.ru_maxrss;
  }
  return kib;
}

static void print_stats(double t0) {
  fprintf(stderr, "fsdp-ckpt: %.2f s, peak RSS %.1f MiB\n", fsdp_time_now() - t0,
          peak_kib() / 1024.0);
}

/* Options that may stand anywhere after the command. */
static struct {
  int overwrite, hf, n_head;
  const char *preset;
} opt;

static void print_io(const char *verb, const fsdp_ckpt_io_summary_t *s, int hf) {
  if (!strcmp(verb, "exported"))
    printf("exported %d tensors, %zu parameters, %" PRIu64 " bytes (F32) to %s%s\n", s->tensors,
           s->numel, s->bytes, s->file, hf ? " + config.json" : "");
  else
    printf("imported %d tensors, %zu parameters, %" PRIu64 " bytes from %s (%s%s) into %s\n",
           s->tensors, s->numel, s->bytes, s->file, s->dtype,
           strcmp(s->dtype, "F32") ? " converted to f32" : "", s->out);
}

static fsdp_status_t export(fsdp_ckpt_t c, const char *out) {
  fsdp_ckpt_io_summary_t sum;
  int flags = opt.overwrite ? FSDP_CKPT_OVERWRITE : 0;
  fsdp_status_t st = opt.hf ? fsdp_ckpt_export_hf(c, out, opt.n_head, flags, &sum)
                            : fsdp_ckpt_export_ex(c, out, flags, &sum);
  if (!st) print_io("exported", &sum, opt.hf);
  return st;
}

static fsdp_status_t with_ckpt(const char *cmd, const char *path, char **rest) {
  fsdp_ckpt_t c;
  fsdp_status_t st = fsdp_ckpt_open(path, &c);
  if (st) return st;
  if (!strcmp(cmd, "inspect")) {
    st = inspect(c) ? FSDP_ERR_INTERNAL : FSDP_SUCCESS;
  } else if (!strcmp(cmd, "verify")) {
    st = fsdp_ckpt_verify(c);
    if (!st) print_summary(c), printf("ok: every shard's size and CRC-32 match the manifest; every value is finite\n");
  } else if (!strcmp(cmd, "consolidate")) {
    st = fsdp_ckpt_consolidate(c, rest[0]);
  } else if (!strcmp(cmd, "export")) {
    st = export(c, rest[0]);
  } else {
    fsdp_ckpt_lock_t lock; /* a trainer saving into the output directory is not raced */
    st = fsdp_ckpt_lock(NULL, rest[1], &lock);
    if (!st) st = fsdp_ckpt_reshard(c, atoi(rest[0]), rest[1]);
    fsdp_ckpt_unlock(lock);
  }
  fsdp_ckpt_close(c);
  return st;
}

/* The lock is taken once the input passed its checks: a refused file leaves
 * no directory or lock file behind. */
static fsdp_status_t import_locked(const char *file, const char *out_dir) {
  fsdp_ckpt_io_summary_t sum;
  fsdp_status_t st = fsdp_ckpt_import_hf(file, out_dir, opt.preset,
                                         FSDP_CKPT_LOCK | (opt.overwrite ? FSDP_CKPT_OVERWRITE : 0),
                                         &sum);
  if (!st) print_io("imported", &sum, 0);
  return st;
}

/* Under the directory's lock, so a running trainer's `latest` is never touched. */
static fsdp_status_t repair(const char *save_dir) {
  fsdp_ckpt_lock_t lock;
  fsdp_ckpt_repair_t rep;
  fsdp_status_t st = fsdp_ckpt_lock(NULL, save_dir, &lock);
  if (!st) st = fsdp_ckpt_repair(NULL, save_dir, &rep);
  fsdp_ckpt_unlock(lock);
  if (st) return st;
  if (rep.step < 0) printf("%s: no checkpoint: nothing to repair\n", save_dir);
  else if (rep.changed) printf("%s/latest repaired (%s): now step-%" PRId64 "\n", save_dir,
                               rep.reason, rep.step);
  else printf("%s/latest: step-%" PRId64 ", the newest complete step: nothing to repair\n",
              save_dir, rep.step);
  return FSDP_SUCCESS;
}

/* Arguments each command takes after its PATH (reshard: --world N OUT). */
static int arity(const char *cmd) {
  static const struct { const char *name; int n; } table[] = {
      {"inspect", 1}, {"verify", 1}, {"repair", 1}, {"consolidate", 2}, {"export", 2}, {"import", 2},
      {"reshard", 4}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (!strcmp(cmd, table[i].name)) return table[i].n;
  return -1;
}

/* Takes the options out of argv (export's and import's only); 0 on a bad one. */
static int take_options(const char *cmd, int *argc, char **argv) {
  int n = 1, ok = 1, exp = !strcmp(cmd, "export"), imp = !strcmp(cmd, "import");
  for (int i = 1; i < *argc; i++) {
    const char *a = argv[i];
    if ((exp || imp) && !strcmp(a, "--overwrite")) opt.overwrite = 1;
    else if (exp && !strcmp(a, "--hf")) opt.hf = 1;
    else if (exp && !strcmp(a, "--n-head") && i + 1 < *argc) ok &= (opt.n_head = atoi(argv[++i])) > 0;
    else if (imp && !strcmp(a, "--preset") && i + 1 < *argc) opt.preset = argv[++i];
    else if ((exp || imp) && !strncmp(a, "--", 2) && i > 1)
      ok = 0, fprintf(stderr, "fsdp-ckpt %s: unknown option %s (or its value is missing)\n", cmd, a);
    else argv[n++] = argv[i];
  }
  *argc = n;
  return ok && (!opt.n_head || opt.hf);
}

int main(int argc, char **argv) {
  int stats = argc > 1 && !strcmp(argv[1], "--stats");
  argv += stats;
  argc -= stats;
  if (!take_options(argc > 1 ? argv[1] : "", &argc, argv)) return fputs(usage_text, stderr), 2;
  if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
    return fputs(usage_text, stdout), 0;
  const char *cmd = argc > 1 ? argv[1] : "";
  int n = arity(cmd);
  if (n < 0 || argc - 2 != n || (n == 4 && strcmp(argv[3], "--world")) ||
      (n == 4 && atoi(argv[4]) < 1))
    return fputs(usage_text, stderr), 2;
  double t0 = fsdp_time_now();
  fsdp_status_t st;
  if (!strcmp(cmd, "import")) st = import_locked(argv[2], argv[3]);
  else if (!strcmp(cmd, "repair")) st = repair(argv[2]);
  else st = with_ckpt(cmd, argv[2], argv + (n == 4 ? 4 : 3));
  if (stats) print_stats(t0);
  if (st) {
    fprintf(stderr, "fsdp-ckpt %s: %s\n", cmd, fsdp_last_error());
    return 1;
  }
  return 0;
}
