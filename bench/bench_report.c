/* bench/bench_report.c — fsdp-bench's output on rank 0: a table for people
 * (medians, the spread of throughput and step time) and one JSON document with
 * every statistic for machines. */
#include <stdlib.h>
#include <string.h>

#include "fsdp_bench.h"

static double mib(double bytes) { return bytes / 1048576.0; }

static void describe_model(const bench_opts_t *o, char *buf, size_t n) {
  if (o->lm.kind != LM_NONE) {
    lm_layout_t y;
    char shape[96];
    lm_layout(&o->lm, &y);
    lm_shape(&o->lm, shape, sizeof shape);
    snprintf(buf, n, "%s %s: %s, T %d, vocab %d%s%s", y.name, o->preset, shape, o->seq_len,
             y.vocab_size, o->wrap.checkpoint_kinds ? ", checkpoint " : "",
             o->wrap.checkpoint_kinds ? o->wrap.checkpoint_kinds : "");
    return;
  }
  int k = snprintf(buf, n, "mlp 784");
  for (int i = 0; i < o->n_hidden && k > 0 && (size_t)k < n; i++)
    k += snprintf(buf + k, n - (size_t)k, "-%d", o->hidden[i]);
  if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "-10");
}

/* What runs the model's attention on the GPU at this run's shape, grouped-query
 * for a Llama with fewer KV heads (fsdp_cuda_attention_impl: cuDNN with its
 * version and path, or the in-house kernel and why); empty for the CPU and the
 * MLP. The same choice the model's first attention call takes (made once per
 * process and shape). */
static void attention_impl(const bench_opts_t *o, char *buf, size_t n) {
  buf[0] = '\0';
  if (o->cfg.device != FSDP_DEVICE_CUDA || o->lm.kind == LM_NONE) return;
  lm_layout_t y;
  lm_layout(&o->lm, &y);
  fsdp_stream_t s = NULL;
  if (fsdp_stream_create_cuda("bench-attention", 0, &s) != FSDP_SUCCESS ||
      fsdp_cuda_attention_impl(s, o->cfg.param_dtype, o->micro_batch, o->seq_len, y.n_embd,
                               y.n_head, y.n_kv_head, buf, n) != FSDP_SUCCESS)
    snprintf(buf, n, "unknown: %s", fsdp_last_error());
  if (s) fsdp_stream_destroy(s);
}

/* bench_products on a stream of its own, at the header's shape. */
static void products_impl(const bench_opts_t *o, char *buf, size_t n) {
  buf[0] = '\0';
  if (o->cfg.device != FSDP_DEVICE_CUDA || strcmp(o->model, "gpt2")) return;
  fsdp_stream_t s = NULL;
  if (fsdp_stream_create_cuda("bench-products", 0, &s) != FSDP_SUCCESS)
    snprintf(buf, n, "unknown: %s", fsdp_last_error());
  else
    bench_products(&o->lm, s, o->cfg.param_dtype, o->micro_batch * o->seq_len, buf, n);
  if (s) fsdp_stream_destroy(s);
}

void bench_print_header(const bench_opts_t *o, int nranks, const char *backend,
                        const bench_machine_t *m, double peak_rank) {
  char model[160];
  describe_model(o, model, sizeof model);
  printf("fsdp-bench: %s | %d ranks (%s) | micro-batch %d x %d per rank | %s%s | AdamW | "
         "%lld warm-up + %lld timed steps x %lld round(s), synthetic data\n",
         model, nranks, backend, o->micro_batch, o->cfg.grad_accum,
         fsdp_dtype_name(o->cfg.param_dtype),
         o->cfg.device == FSDP_DEVICE_CUDA ? " on cuda" : "", (long long)o->warmup,
         (long long)o->iters, (long long)o->rounds);
  printf("machine: %s | %d cores | %s\n", m->cpu, m->cores, m->blas);
  char att[640];
  attention_impl(o, att, sizeof att);
  if (att[0]) printf("attention: %s\n", att);
  char products[1024];
  products_impl(o, products, sizeof products);
  if (products[0]) printf("block products: %s\n", products);
  if (peak_rank > 0 && o->cfg.device == FSDP_DEVICE_CUDA)
    printf("peak: %.1f TFLOP/s per rank (cuBLAS %s %lld^3 product on each rank's GPU)\n"
           "MFU = (6 (P%s) + 12 L T C) x tokens/s / peak\n\n", peak_rank / 1e12,
           fsdp_dtype_name(o->cfg.param_dtype), (long long)o->peak_size,
           strcmp(o->model, "llama") ? " - wpe"
           : o->llama.tie_embeddings ? ""
                                     : " - embed_tokens");
  else if (peak_rank > 0)
    printf("peak: %.1f GFLOP/s per rank (sgemm %lld on every rank at once)\n\n", peak_rank / 1e9,
           (long long)o->peak_size);
  else
    printf("peak: not measured (--peak-size 0): no MFU\n\n");
  printf("%-11s %2s | %-22s %10s | %-22s %8s %8s %8s %7s | %6s | %9s %9s %8s %8s | %8s %8s | "
         "%5s | %6s\n",
         "strategy", "pf", "tokens/s (min-max)", "per rank", "step ms (min-max)", "compute",
         "comm", "exposed", "hidden", "MFU", "model MiB", "ZeRO MiB", "act MiB", "RSS MiB",
         "shard MiB", "repl MiB", "load", "#wrong");
  fflush(stdout);
}

/* "zero3", or "zero3 2x2" under HSDP; " +r10" with buddy replicas every 10
 * steps. */
static void strategy_label(const bench_result_t *r, char *buf, size_t n) {
  int k;
  if (r->replicas > 1 && r->strategy != FSDP_NO_SHARD)
    k = snprintf(buf, n, "%s %dx%d", fsdp_strategy_name(r->strategy), r->replicas, r->shard_size);
  else
    k = snprintf(buf, n, "%s", fsdp_strategy_name(r->strategy));
  if (r->replica_every && k >= 0 && (size_t)k < n)
    snprintf(buf + k, n - (size_t)k, " +r%d", r->replica_every);
}

void bench_print_replica_cost(const bench_result_t *without, const bench_result_t *with) {
  char name[32];
  strategy_label(without, name, sizeof name);
  const double a = without->tokens_per_s.median, b = with->tokens_per_s.median;
  printf("cost: %s pf %d, replicas every %d steps: %.0f tokens/s (%.0f-%.0f) with, %.0f "
         "(%.0f-%.0f) without (%+.1f %%); snapshots of %.2f MiB/rank, %.2f MiB of host memory "
         "per rank, copy %.3f ms each on the step's path against a %.2f ms step\n",
         name, without->prefetch, with->replica_every, b, with->tokens_per_s.min,
         with->tokens_per_s.max, a, without->tokens_per_s.min, without->tokens_per_s.max,
         a > 0 ? 100.0 * (b - a) / a : 0.0, mib(with->replica_snapshot_bytes),
         mib(with->replica_host_bytes), with->replica_copy_ms, with->step_s.median * 1e3);
  fflush(stdout);
}

void bench_print_row(const bench_result_t *r) {
  char tps[32], step[32], mfu[16] = "n/a", load[16] = "n/a", name[32];
  strategy_label(r, name, sizeof name);
  snprintf(tps, sizeof tps, "%.0f (%.0f-%.0f)", r->tokens_per_s.median, r->tokens_per_s.min,
           r->tokens_per_s.max);
  snprintf(step, sizeof step, "%.2f (%.2f-%.2f)", r->step_s.median * 1e3, r->step_s.min * 1e3,
           r->step_s.max * 1e3);
  if (r->peak_flops > 0) snprintf(mfu, sizeof mfu, "%.2f%%", r->mfu.median * 100.0);
  if (r->other_load >= 0) snprintf(load, sizeof load, "%.0f%%", r->other_load * 100.0);
  double hidden = r->comm_s.median > 0 ? 100.0 * (1.0 - r->exposed_s.median / r->comm_s.median)
                                       : 0.0;
  printf("%-11s %2d | %-22s %10.0f | %-22s %8.2f %8.2f %8.2f %6.0f%% | %6s | %9.2f %9.2f "
         "%8.2f %8.2f | %8.2f %8.2f | %5s | %6.0f\n",
         name, r->prefetch, tps, r->tokens_per_s_rank.median, step,
         r->compute_s.median * 1e3, r->comm_s.median * 1e3, r->exposed_s.median * 1e3,
         hidden < 0 ? 0 : hidden, mfu, mib(r->model_peak), mib(r->predicted),
         mib(r->activations), mib(r->rss_peak), mib(r->gather_bytes + r->reduce_bytes),
         mib(r->replica_bytes), load, r->wrong);
  if (r->device_used >= 0)
    printf("device memory: %.2f MiB in use on the GPU after the timed steps (largest rank)\n",
           mib(r->device_used));
  fflush(stdout);
}

static void result_json(FILE *f, const bench_opts_t *o, int nranks, const bench_result_t *r) {
  fprintf(f, "{\"model\":\"%s\",\"preset\":\"%s\",\"strategy\":\"%s\",\"prefetch\":%d,"
         "\"max_live_units\":%d,\"world_size\":%d,\"micro_batch\":%d,\"grad_accum\":%d,"
         "\"seq_len\":%d,\"dtype\":\"%s\",\"params\":%zu,\"units\":%d,\"largest_unit\":%zu,"
         "\"tokens_per_step\":%.0f,\"flops_per_token\":%.6g,\"peak_flops\":%.6g,"
         "\"shard_size\":%d,\"replicas\":%d,\"comm_bytes_per_step\":{\"shard_group\":{"
         "\"all_gather\":%.0f,\"reduce\":%.0f},\"replica_group\":{\"all_reduce\":%.0f}},",
         o->model, strcmp(o->model, "mlp") ? o->preset : "", fsdp_strategy_name(r->strategy),
         r->prefetch, r->max_live, nranks, o->micro_batch, o->cfg.grad_accum,
         strcmp(o->model, "mlp") ? o->seq_len : 1, fsdp_dtype_name(o->cfg.param_dtype),
         r->params, r->n_units, r->largest_unit, r->tokens_per_step, r->flops_per_token,
         r->peak_flops, r->shard_size, r->replicas, r->gather_bytes, r->reduce_bytes,
         r->replica_bytes);
  fprintf(f, "\"replica_every\":%d,", r->replica_every);
  if (r->ckpt_auto_json[0]) fprintf(f, "%s,", r->ckpt_auto_json);
  if (r->replica_every)
    fprintf(f, "\"buddy_replica\":{\"snapshot_bytes\":%.0f,\"host_bytes\":%.0f,"
            "\"copy_ms\":%.4f},", r->replica_snapshot_bytes, r->replica_host_bytes,
            r->replica_copy_ms);
  const struct { const char *name; const bench_stat_t *s; double scale; } stats[] = {
      {"tokens_per_s", &r->tokens_per_s, 1},   {"tokens_per_s_per_rank", &r->tokens_per_s_rank, 1},
      {"step_ms", &r->step_s, 1e3},            {"compute_ms", &r->compute_s, 1e3},
      {"comm_ms", &r->comm_s, 1e3},            {"gather_ms", &r->gather_s, 1e3},
      {"reduce_ms", &r->reduce_s, 1e3},        {"exposed_comm_ms", &r->exposed_s, 1e3},
      {"mfu", &r->mfu, 1}};
  for (size_t i = 0; i < sizeof stats / sizeof stats[0]; i++) {
    fprintf(f, "\"%s\":", stats[i].name);
    bench_stat_json(f, stats[i].s, stats[i].scale);
    fprintf(f, ",");
  }
  fprintf(f, "\"memory\":{\"persistent\":%.0f,\"gathered_peak\":%.0f,\"grads_peak\":%.0f,"
         "\"model_peak\":%.0f,\"predicted\":%.0f,\"reserved\":%.0f,\"activations\":%.0f,"
         "\"rss_base\":%.0f,\"rss_peak\":%.0f},\"loss_first\":%.6f,\"loss_last\":%.6f,"
         "\"other_load\":%.4f,\"wrong\":%.0f,\"skipped_steps\":%.0f,\"loss_scale\":%.9g",
         r->persistent, r->gathered_peak, r->grads_peak, r->model_peak, r->predicted,
         r->reserved, r->activations, r->rss_base, r->rss_peak, r->loss_first, r->loss_last,
         r->other_load, r->wrong, r->skipped_steps, r->loss_scale);
  if (r->device_used >= 0)
    fprintf(f, ",\"device\":\"cuda\",\"device_peak_bytes\":%.0f", r->device_used);
  bench_kernels_json(f, o, r);
  fprintf(f, "}");
}

void bench_print_json(FILE *f, const bench_opts_t *o, int nranks, const char *backend,
                      const bench_machine_t *m, const bench_result_t *r, int n) {
  double wrong = 0;
  for (int i = 0; i < n; i++) wrong += r[i].wrong;
  fprintf(f, "{\"bench\":\"fsdp-bench\",\"version\":\"%d.%d.%d\",\"backend\":\"%s\",\"world_size\":%d,"
         "\"warmup\":%lld,\"iters\":%lld,\"rounds\":%lld,\"peak_size\":%lld,\"machine\":",
         FSDP_VERSION_MAJOR, FSDP_VERSION_MINOR, FSDP_VERSION_PATCH, backend, nranks,
         (long long)o->warmup, (long long)o->iters, (long long)o->rounds, (long long)o->peak_size);
  bench_machine_json(f, m);
  fprintf(f, ",\"results\":[");
  for (int i = 0; i < n; i++) {
    fprintf(f, "%s\n", i ? "," : "");
    result_json(f, o, nranks, &r[i]);
  }
  fprintf(f, "],\n\"wrong\":%.0f}\n", wrong);
  fflush(f);
}

static double gib(double bytes) { return bytes / 1073741824.0; }

/* One preset's rows: per layout, the per-block bytes, the whole step's with
 * every block saved and with every block checkpointed, and a one-GPU total
 * (18 bytes of model state per parameter: bf16 gathered, fp32 master and
 * gradient, AdamW's two moments). */
static int memory_rows(const char *preset, int B, int T, fsdp_dtype_t dt) {
  fsdp_gpt2_config_t c;
  if (fsdp_gpt2_preset(preset, &c) != FSDP_SUCCESS) return 1;
  if (T > c.block_size) {
    printf("%-6s (sequence length %d is past its context of %d)\n", preset, T, c.block_size);
    return 0;
  }
  const struct { const char *name; fsdp_gpt2_layout_t l; } layouts[] = {
      {"before", FSDP_GPT2_LAYOUT_PROBS},
      {"now", FSDP_GPT2_LAYOUT_BUILT},
      {"after", FSDP_GPT2_LAYOUT_FLASH}};
  const double state = 18.0 * (double)fsdp_gpt2_num_params(&c);
  for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
    fsdp_gpt2_memory_t m;
    if (fsdp_gpt2_memory(&c, B, T, dt, layouts[i].l, &m) != FSDP_SUCCESS) return 1;
    printf("%-6s %-7s %9.1f %10.1f %9.2f %9.2f %10.2f %10.2f %12.2f\n", preset,
           layouts[i].name, mib((double)m.per_layer), mib((double)m.attention),
           gib((double)m.inputs), gib((double)m.common), gib((double)m.saved),
           gib((double)m.checkpointed), gib(state + (double)m.checkpointed));
  }
  return 0;
}

/* Host memory of a GPU run's end-of-run check and checkpoints: fsdp_unit_shard
 * copies one unit's fp32 master, gradient and AdamW moments (16 bytes per
 * parameter) to the host and fsdp_unit_shard_release frees them, so the most
 * held at once is the largest unit's: the root (wte, wpe, ln_f) when every
 * block is wrapped. Before, the copies of every unit stayed for the engine's
 * life. */
static int host_rows(const char *preset) {
  fsdp_gpt2_config_t c;
  if (fsdp_gpt2_preset(preset, &c) != FSDP_SUCCESS) return 1;
  const double C = c.n_embd, root = (double)c.vocab_size * C + (double)c.block_size * C + 2 * C;
  printf("%-6s %20.2f %20.2f\n", preset, gib(16.0 * root),
         gib(16.0 * (double)fsdp_gpt2_num_params(&c)));
  return 0;
}

/* What buddy replicas (fsdp/replica.h) cost in host memory per rank: the
 * model's units as a run makes them (its wrap plan, on a one-rank engine
 * that is never materialised), sized by fsdp_replica_bytes, the function
 * fsdp_replica_create sizes its buffers with, at each shard size (the ranks
 * a unit is sharded over: the world, or HSDP's --shard-size). */
static fsdp_status_t replica_units(fsdp_world_t w, const bench_opts_t *o, const char *preset,
                                   size_t *numel, int cap, int *n) {
  fsdp_config_t c = o->cfg;
  c.device = FSDP_DEVICE_CPU;
  c.comm_backend = NULL;
  c.shard_size = 0;
  fsdp_engine_t e;
  fsdp_gpt2_opts_t wrap = o->wrap;
  wrap.max_batch = wrap.max_T = 1; /* activation buffers: none worth the name */
  fsdp_status_t st = fsdp_engine_create(w, &c, &e);
  if (st) return st;
  fsdp_llama_t llama = NULL;
  fsdp_gpt2_t gpt = NULL;
  fsdp_gpt2_config_t g;
  fsdp_llama_config_t l;
  st = !strcmp(o->model, "llama")
                         ? fsdp_llama_preset(preset, &l) ||
                               fsdp_llama_create(e, &l, &wrap, &llama)
                         : fsdp_gpt2_preset(preset, &g) || fsdp_gpt2_create(e, &g, &wrap, &gpt);
  *n = st ? 0 : fsdp_engine_num_units(e);
  if (*n > cap) {
    fprintf(stderr, "fsdp-bench: --memory-plan: %s has %d units, the plan lists at most %d\n",
            preset, *n, cap);
    *n = 0;
    st = FSDP_ERR_UNSUPPORTED;
  }
  for (int u = 0; u < *n && !st; u++) {
    fsdp_unit_info_t info;
    st = fsdp_unit_info(e, u, &info);
    numel[u] = info.numel;
  }
  fsdp_llama_destroy(llama);
  fsdp_gpt2_destroy(gpt);
  fsdp_engine_destroy(e);
  return st;
}

static int replica_rows(const bench_opts_t *o, const char *const *presets, int n_presets) {
  enum { MAX_UNITS = 512 };
  const int states = o->cfg.optim.kind == FSDP_OPTIM_ADAMW ? 3
                     : o->cfg.optim.momentum != 0.0f       ? 2
                                                           : 1; /* master + the optimizer's */
  int shards[4] = {1, 8, 64}, n_shards = 3;
  if (o->cfg.shard_size > 0 && o->cfg.shard_size != 1 && o->cfg.shard_size != 8 &&
      o->cfg.shard_size != 64)
    shards[n_shards++] = o->cfg.shard_size;
  printf("\nBuddy replicas (--replica-every K, %s %d): host memory per rank, whatever K: 4 "
         "snapshots (its own last two, the last two of the rank it keeps copies for) of a "
         "shard, fp32 "
         "master%s; fsdp_replica_bytes over the model's units; S = ranks a unit is sharded "
         "over (the world, or --shard-size)\n",
         o->replica_every ? "here" : "default", o->replica_every ? o->replica_every
                                                                : FSDP_REPLICA_DEFAULT_EVERY,
         states == 3 ? " + AdamW m + v" : states == 2 ? " + SGD momentum" : "");
  printf("%-15s %6s %18s %18s %10s\n", "preset", "S", "snapshot bytes", "host bytes",
         "host GiB");
  fsdp_world_t w = NULL;
  size_t *numel = malloc(MAX_UNITS * sizeof *numel);
  int rc = !numel || fsdp_world_init(&w, NULL) != FSDP_SUCCESS;
  for (int i = 0; i < n_presets && !rc; i++) {
    int n;
    if (replica_units(w, o, presets[i], numel, MAX_UNITS, &n)) {
      rc = 1;
      break;
    }
    for (int k = 0; k < n_shards && !rc; k++) {
      size_t snap, host;
      rc = fsdp_replica_bytes(numel, n, states, shards[k], o->cfg.align, &snap, &host) != 0;
      if (!rc)
        printf("%-15s %6d %18zu %18zu %10.3f\n", presets[i], shards[k], snap, host,
               gib((double)host));
    }
  }
  if (rc) fprintf(stderr, "fsdp-bench: --memory-plan: %s\n", numel ? fsdp_last_error() :
                  "out of memory");
  fsdp_world_destroy(w);
  free(numel);
  return rc;
}

/* --checkpoint auto's arithmetic per preset (this build's layout): the
 * activation arena at k of L layers checkpointed (fsdp_activation_arena_bytes,
 * what the arena is allocated by) and the k fsdp_checkpoint_auto chooses at
 * each budget, the fixed part being lm_model_state_bytes on one rank (the
 * kernels' few MiB of scratch, which only a built model knows, excluded).
 * That is an estimate, built without an engine: a run's --checkpoint auto
 * takes the engine's own number (fsdp_engine_memory_plan), which can be
 * larger, and so may checkpoint more layers than this table's k. */
static int auto_rows(const bench_opts_t *o, const char *const *presets, int n, int B, int T,
                     fsdp_dtype_t dt) {
  const double given = (double)o->memory_budget;
  const double budgets[3] = {given > 0 ? given : 40.0, 78.0, 139.0};
  const int n_budgets = given > 0 ? 1 : 3;
  printf("\nCheckpoint auto (--checkpoint auto): activations GiB with k of L layers "
         "checkpointed (the first k), model state on 1 rank (lm_model_state_bytes: %s "
         "params, AdamW, prefetch %d), and the k chosen at each budget (GiB%s)\n",
         fsdp_dtype_name(o->cfg.param_dtype), o->cfg.prefetch_depth,
         given > 0 ? ", --memory-budget" : "; 78, 139: an H100's and an H200's less 2 GiB");
  printf("%-15s %4s %9s %9s %9s %9s %9s %9s", "preset", "L", "k=0", "k=L/4", "k=L/2",
         "k=3L/4", "k=L", "state");
  for (int b = 0; b < n_budgets; b++) printf("  k@%-6.0f", budgets[b]);
  printf("\n");
  for (int i = 0; i < n; i++) {
    fsdp_gpt2_config_t g;
    fsdp_llama_config_t l;
    fsdp_gpt2_memory_t m;
    lm_t lm;
    int L;
    if (!strcmp(o->model, "llama")) {
      if (fsdp_llama_preset(presets[i], &l) != FSDP_SUCCESS) return 1;
      if (T > l.max_seq_len) continue;
      if (fsdp_llama_memory(&l, B, T, dt, &m) != FSDP_SUCCESS) return 1;
      lm = lm_pick("llama", NULL, &l), L = l.n_layer;
    } else {
      if (fsdp_gpt2_preset(presets[i], &g) != FSDP_SUCCESS) return 1;
      if (T > g.block_size) continue;
      if (fsdp_gpt2_memory(&g, B, T, dt, FSDP_GPT2_LAYOUT_BUILT, &m) != FSDP_SUCCESS) return 1;
      lm = lm_pick("gpt2", &g, NULL), L = g.n_layer;
    }
    const size_t state = lm_model_state_bytes(&lm, &o->cfg, 1);
    printf("%-15s %4d", presets[i], L);
    const int ks[5] = {0, L / 4, L / 2, 3 * L / 4, L};
    for (int j = 0; j < 5; j++)
      printf(" %9.2f", gib((double)fsdp_activation_arena_bytes(&m, L - ks[j], ks[j] > 0)));
    printf(" %9.2f", gib((double)state));
    for (int b = 0; b < n_budgets; b++) {
      fsdp_checkpoint_choice_t ch;
      if (fsdp_checkpoint_auto(&m, L, state, lm_budget_bytes(budgets[b]), &ch))
        printf("  %-8s", "none");
      else
        printf("  %-8d", ch.k);
    }
    printf("\n");
  }
  return 0;
}

/* The Llama presets' activation memory (fsdp_llama_memory) and a one-GPU
 * total as GPT-2's. */
static int llama_memory_plan(const bench_opts_t *o, int B, int T, fsdp_dtype_t dt) {
  printf("Llama activation memory, computed (fsdp_llama_memory), micro-batch %d x %d, %s "
         "activations (attention keeps %s)\n"
         "1 GPU: 18 B/param of model state (bf16 gathered, fp32 master + gradient, AdamW "
         "m + v) + every layer checkpointed\n\n",
         B, T, fsdp_dtype_name(dt),
         dt == FSDP_BF16 ? "the (B,NH,T) log-sum-exp" : "(B,NH,T,T) fp32 probabilities");
  printf("%-15s %9s %10s %9s %9s %10s %10s %12s\n", "preset", "layer MiB", "attn MiB",
         "in GiB", "head GiB", "saved GiB", "ckpt GiB", "1 GPU GiB");
  const char *presets[] = {"SmolLM-135M", "TinyLlama-1.1B", "Llama-3.2-1B", o->preset};
  for (int i = 0; i < 4; i++) {
    if (i == 3 && (!strcmp(o->preset, presets[0]) || !strcmp(o->preset, presets[1]) ||
                   !strcmp(o->preset, presets[2])))
      break;
    fsdp_llama_config_t c;
    fsdp_llama_memory_t m;
    if (fsdp_llama_preset(presets[i], &c) != FSDP_SUCCESS ||
        (T <= c.max_seq_len && fsdp_llama_memory(&c, B, T, dt, &m) != FSDP_SUCCESS)) {
      fprintf(stderr, "fsdp-bench: --memory-plan: %s\n", fsdp_last_error());
      return 1;
    }
    if (T > c.max_seq_len) {
      printf("%-15s (sequence length %d is past its %d positions)\n", presets[i], T,
             c.max_seq_len);
      continue;
    }
    const double state = 18.0 * (double)fsdp_llama_num_params(&c);
    printf("%-15s %9.1f %10.1f %9.2f %9.2f %10.2f %10.2f %12.2f\n", presets[i],
           mib((double)m.per_layer), mib((double)m.attention), gib((double)m.inputs),
           gib((double)m.common), gib((double)m.saved), gib((double)m.checkpointed),
           gib(state + (double)m.checkpointed));
  }
  int n = strcmp(o->preset, presets[0]) && strcmp(o->preset, presets[1]) &&
          strcmp(o->preset, presets[2]) ? 4 : 3;
  if (auto_rows(o, presets, n, B, T, dt)) {
    fprintf(stderr, "fsdp-bench: --memory-plan: %s\n", fsdp_last_error());
    return 1;
  }
  return replica_rows(o, presets, n);
}

int bench_print_memory_plan(const bench_opts_t *o) {
  const int T = o->seq_len, B = o->micro_batch;
  const fsdp_dtype_t dt = o->cfg.param_dtype == FSDP_BF16 ? FSDP_BF16 : FSDP_F32;
  if (!strcmp(o->model, "llama")) return llama_memory_plan(o, B, T, dt);
  printf("GPT-2 activation memory, computed (fsdp_gpt2_memory), micro-batch %d x %d, %s "
         "activations\n"
         "before: attention keeps (B,NH,T,T) fp32 probabilities, logits and their gradient "
         "are two (B,T,V) buffers\n"
         "now:    this build's kernels (bf16 on CUDA: the flash attention, no T^2 scratch)\n"
         "after:  attention keeps the (B,NH,T) fp32 log-sum-exp, the gradient is written over "
         "one (B,T,Vp) buffer\n"
         "1 GPU: 18 B/param of model state (bf16 gathered, fp32 master + gradient, AdamW "
         "m + v) + every block checkpointed\n\n",
         B, T, fsdp_dtype_name(dt));
  printf("%-6s %-7s %9s %10s %9s %9s %10s %10s %12s\n", "preset", "layout", "layer MiB",
         "attn MiB", "in GiB", "head GiB", "saved GiB", "ckpt GiB", "1 GPU GiB");
  const char *presets[] = {"124M", "1558M", o->preset};
  for (int i = 0; i < 3; i++) {
    if (i == 2 && (!strcmp(o->preset, "124M") || !strcmp(o->preset, "1558M"))) break;
    if (memory_rows(presets[i], B, T, dt)) {
      fprintf(stderr, "fsdp-bench: --memory-plan: %s\n", fsdp_last_error());
      return 1;
    }
  }
  printf("\nHost copies of the shards on 1 GPU (16 B/param: fp32 master, gradient, AdamW m + v) "
         "while a check or a checkpoint reads them:\n"
         "one unit at a time (the largest: the root, wte + wpe + ln_f, every block wrapped), "
         "before: every unit, kept\n");
  printf("%-6s %20s %20s\n", "preset", "one unit GiB", "before GiB");
  for (int i = 0; i < 3; i++) {
    if (i == 2 && (!strcmp(o->preset, "124M") || !strcmp(o->preset, "1558M"))) break;
    if (host_rows(presets[i])) {
      fprintf(stderr, "fsdp-bench: --memory-plan: %s\n", fsdp_last_error());
      return 1;
    }
  }
  const int n = strcmp(o->preset, "124M") && strcmp(o->preset, "1558M") ? 3 : 2;
  if (auto_rows(o, presets, n, B, T, dt)) {
    fprintf(stderr, "fsdp-bench: --memory-plan: %s\n", fsdp_last_error());
    return 1;
  }
  return replica_rows(o, presets, n);
}
