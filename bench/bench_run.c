/* bench/bench_run.c — one fsdp-bench configuration: the model on a fresh
 * engine, synthetic batches, warm-up and timed steps, the timeline split, the
 * correctness check, memory against the ZeRO formula, and the sgemm peak. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsdp_bench.h"

typedef struct {
  fsdp_engine_t eng;
  lm_t lm;              /* o->lm, with the model once built */
  fsdp_mlp_t mlp;
  int B, T, accum;      /* T = 1 for the MLP: a sample is a "token" */
  int *tok, *tgt;       /* gpt2, llama: (accum, B, T) */
  float *x;             /* mlp: (accum, B, 784) */
  int *y;               /* mlp: (accum, B) */
  size_t act_bytes;
  char ckpt_auto[320], ckpt_auto_json[256]; /* --checkpoint auto's choice, or "" */
  fsdp_step_stats_t last; /* the last step's: skipped_total counts the guard's skips */
  fsdp_replica_t replica; /* --replica-every, else NULL */
} model_t;

enum { MLP_IN = 784, MLP_CLASSES = 10 };

static uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Synthetic batches, different on every rank and micro-batch: throughput does
 * not depend on the data, and no dataset needs to be present. */
static int make_data(model_t *m, const bench_opts_t *o, int rank) {
  size_t n = (size_t)m->accum * m->B * m->T;
  uint64_t base = mix(o->seed ^ mix((uint64_t)rank + 1));
  if (m->lm.kind != LM_NONE) {
    lm_layout_t y;
    lm_layout(&m->lm, &y);
    const uint64_t V = (uint64_t)y.vocab_size;
    m->tok = malloc(n * sizeof *m->tok);
    m->tgt = malloc(n * sizeof *m->tgt);
    if (!m->tok || !m->tgt) return -1;
    for (size_t i = 0; i < n; i++) {
      m->tok[i] = (int)(mix(base + i) % V);
      m->tgt[i] = (int)(mix(base + i + 1) % V);
    }
    return 0;
  }
  m->x = malloc(n * MLP_IN * sizeof *m->x);
  m->y = malloc(n * sizeof *m->y);
  if (!m->x || !m->y) return -1;
  for (size_t i = 0; i < n * MLP_IN; i++)
    m->x[i] = (float)((double)(mix(base + i) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  for (size_t i = 0; i < n; i++) m->y[i] = (int)(mix(~base + i) % MLP_CLASSES);
  return 0;
}

static void model_free(model_t *m) {
  fsdp_replica_destroy(m->replica);
  lm_destroy(&m->lm);
  fsdp_mlp_destroy(m->mlp);
  fsdp_engine_destroy(m->eng);
  free(m->tok);
  free(m->tgt);
  free(m->x);
  free(m->y);
}

/* --config's sharding rules as --print-config writes them: their count and
 * an FNV-1a 64 hash, "(none)" without (a rank reading another file is named
 * before it plans other units). */
static void rules_digest(const cfg_file_t *c, char *out, size_t len) {
  char *text = NULL;
  size_t n = 0;
  FILE *f = cfg_sharding_count(c) ? open_memstream(&text, &n) : NULL;
  if (!f) {
    snprintf(out, len, "%s", cfg_sharding_count(c) ? "(unreadable)" : "(none)");
    return;
  }
  cfg_print_rules(f, c);
  fclose(f);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
  snprintf(out, len, "%d, FNV-1a 64 %016llx", cfg_sharding_count(c), (unsigned long long)h);
  free(text);
}

/* The bench's own settings, compared across ranks before the model is
 * built (the engine compares its configuration and plan itself): a rank with
 * another --micro-batch or --iters would time different work or hang. */
static fsdp_status_t bench_check_consistency(fsdp_engine_t eng, const bench_opts_t *o) {
  char v[10][64];
  const char *keys[10] = {"--model", "--preset", "gpt2 layers/heads/embd/context/vocab",
                          "--seq-len", "--hidden", "--micro-batch",
                          "--warmup/--iters/--rounds/--check", "--seed", "--peak-size",
                          "sharding rules"};
  const char *values[10];
  snprintf(v[0], sizeof v[0], "%s", o->model);
  snprintf(v[1], sizeof v[1], "%s", o->preset ? o->preset : "(none)");
  snprintf(v[2], sizeof v[2], "%d/%d/%d/%d/%d", o->gpt.n_layer, o->gpt.n_head, o->gpt.n_embd,
           o->gpt.block_size, o->gpt.vocab_size);
  snprintf(v[3], sizeof v[3], "%d", o->seq_len);
  int k = 0;
  v[4][0] = '\0';
  for (int i = 0; i < o->n_hidden && k < (int)sizeof v[4]; i++)
    k += snprintf(v[4] + k, sizeof v[4] - (size_t)k, "%s%d", i ? "," : "", o->hidden[i]);
  snprintf(v[5], sizeof v[5], "%d", o->micro_batch);
  snprintf(v[6], sizeof v[6], "%lld/%lld/%lld/%lld", (long long)o->warmup, (long long)o->iters,
           (long long)o->rounds, (long long)o->check);
  snprintf(v[7], sizeof v[7], "%llu", (unsigned long long)o->seed);
  snprintf(v[8], sizeof v[8], "%lld", (long long)o->peak_size);
  rules_digest(o->config, v[9], sizeof v[9]);
  for (int i = 0; i < 10; i++) values[i] = v[i];
  return fsdp_engine_check_consistency(eng, 10, keys, values);
}

static fsdp_status_t model_build(fsdp_world_t world, const bench_opts_t *o, fsdp_config_t *c,
                                 model_t *m) {
  const int gpt = m->lm.kind != LM_NONE;
  m->B = o->micro_batch;
  m->T = gpt ? o->seq_len : 1;
  m->accum = c->grad_accum;
  BENCH_TRY(fsdp_engine_create(world, c, &m->eng));
  BENCH_TRY(bench_check_consistency(m->eng, o));
  if (gpt) {
    fsdp_gpt2_opts_t w = o->wrap;
    w.max_batch = m->B;
    w.max_T = m->T;
    fsdp_plan_opts_t plan;
    char ckpt[512];
    const int ck_auto = lm_checkpoint_auto_opts(o->memory_budget, &w);
    int bad = o->config && lm_config_opts(&m->lm, o->config, &w, &plan, ckpt, sizeof ckpt);
    fsdp_status_t st = bad ? FSDP_ERR_INVALID_ARGUMENT : lm_create(&m->lm, m->eng, &w);
    if (st == FSDP_SUCCESS && ck_auto) {
      lm_checkpoint_auto_text(&m->lm, 0, m->ckpt_auto, sizeof m->ckpt_auto);
      lm_checkpoint_auto_text(&m->lm, 1, m->ckpt_auto_json, sizeof m->ckpt_auto_json);
    }
    if (st == FSDP_SUCCESS && o->config &&
        (cfg_check_matched(o->config, 1) || cfg_check_matched(o->config, 2)))
      st = FSDP_ERR_INVALID_ARGUMENT;
    if (st != FSDP_SUCCESS && o->config && o->config->err[0])
      fprintf(stderr, "fsdp-bench: %s\n", o->config->err);
    BENCH_TRY(st);
  } else {
    int widths[8] = {MLP_IN};
    for (int i = 0; i < o->n_hidden; i++) widths[i + 1] = o->hidden[i];
    widths[o->n_hidden + 1] = MLP_CLASSES;
    BENCH_TRY(fsdp_mlp_create(m->eng, widths, o->n_hidden + 1, m->B, &m->mlp));
  }
  BENCH_TRY(fsdp_engine_materialize(m->eng, o->seed));
  if (o->replica_every) BENCH_TRY(fsdp_replica_create(m->eng, o->replica_every, &m->replica));
  m->act_bytes = gpt ? lm_activation_bytes(&m->lm, NULL) : fsdp_mlp_activation_bytes(m->mlp);
  return FSDP_SUCCESS;
}

/* One optimizer step over accum micro-batches; *loss: mean per token. A step
 * the numerics guard skips still counts (it did the work), in m->last. */
static fsdp_status_t model_step(model_t *m, double *loss) {
  double sum = 0.0;
  size_t per = (size_t)m->B * m->T;
  float scale = (float)fsdp_engine_loss_scale(m->eng) / (float)per;
  for (int k = 0; k < m->accum; k++) {
    double l = 0.0;
    if (m->lm.kind != LM_NONE)
      BENCH_TRY(lm_forward_backward(&m->lm, m->tok + k * per, m->tgt + k * per, m->B, m->T,
                                    scale, &l));
    else
      BENCH_TRY(fsdp_mlp_forward_backward(m->mlp, m->x + k * per * MLP_IN, m->y + k * per, m->B,
                                          scale, &l));
    sum += l;
  }
  *loss = sum / ((double)per * m->accum);
  BENCH_TRY(fsdp_engine_report_loss(m->eng, *loss));
  BENCH_TRY(fsdp_engine_step(m->eng, &m->last));
  return m->replica ? fsdp_replica_snapshot(m->replica, NULL, NULL) : FSDP_SUCCESS;
}

/* ---- correctness ------------------------------------------------------------ */

/* Elements of one unit's assembled parameters that are not finite or differ
 * between ranks, compared through all-reduces of x and of -x in chunks (so the
 * check needs little memory beyond the assembled unit). */
static fsdp_status_t check_unit(fsdp_engine_t eng, fsdp_unit_t u, double *wrong) {
  enum { CHUNK = 1 << 18 };
  fsdp_comm_t comm = fsdp_engine_comm(eng);
  fsdp_unit_info_t info;
  fsdp_shard_t sh;
  BENCH_TRY(fsdp_unit_info(eng, u, &info));
  BENCH_TRY(fsdp_unit_shard(eng, u, &sh));
  size_t n = info.padded_numel, S = n / info.shard_numel; /* S: the shard group's ranks */
  int nranks = fsdp_comm_size(comm), rank = fsdp_comm_rank(comm);
  double *hi = malloc(2 * CHUNK * sizeof *hi), *lo = hi + CHUNK;
  /* Every rank's shard; this rank's unit is its own shard group's slices
   * (HSDP: the other groups' copies are then compared element by element). */
  float *all = malloc((S == 1 ? n : (size_t)nranks * info.shard_numel) * sizeof *all), *full = all;
  fsdp_status_t st = hi && all ? FSDP_SUCCESS : FSDP_ERR_OUT_OF_MEMORY;
  if (st == FSDP_SUCCESS && S == 1) memcpy(full, sh.master, n * sizeof *full);
  else if (st == FSDP_SUCCESS)
    st = fsdp_all_gather(comm, sh.master, all, info.shard_numel, FSDP_F32, FSDP_HOST_STREAM);
  if (S > 1) full = all + (size_t)(rank / (int)S) * n;
  for (size_t at = 0; st == FSDP_SUCCESS && at < n; at += CHUNK) {
    size_t k = n - at < CHUNK ? n - at : CHUNK;
    for (size_t i = 0; i < k; i++) hi[i] = full[at + i], lo[i] = -(double)full[at + i];
    st = bench_reduce(comm, hi, k, FSDP_MAX);
    if (st == FSDP_SUCCESS) st = bench_reduce(comm, lo, k, FSDP_MAX);
    for (size_t i = 0; st == FSDP_SUCCESS && i < k; i++)
      *wrong += !isfinite(full[at + i]) || hi[i] != -lo[i];
  }
  free(hi);
  free(all);
  fsdp_status_t rs = fsdp_unit_shard_release(eng, u, 0);
  return st ? st : rs;
}

/* #wrong: parameter elements (every unit, assembled from the shards) that are
 * not finite or not the same on every rank, plus non-finite losses. Counted
 * once per element, on rank 0's behalf (the comparison is already global). */
static fsdp_status_t bench_check(model_t *m, double first, double last, double *wrong) {
  double w = 0.0;
  for (int u = 0; u < fsdp_engine_num_units(m->eng); u++) BENCH_TRY(check_unit(m->eng, u, &w));
  double bad_loss = !isfinite(first) + !isfinite(last);
  BENCH_TRY(bench_reduce(fsdp_engine_comm(m->eng), &bad_loss, 1, FSDP_SUM));
  *wrong = w + bad_loss;
  return FSDP_SUCCESS;
}

/* ---- memory and FLOPs --------------------------------------------------------- */

static void model_sizes(const model_t *m, bench_result_t *r) {
  r->params = r->largest_unit = 0;
  r->n_units = fsdp_engine_num_units(m->eng);
  for (int u = 0; u < r->n_units; u++) {
    fsdp_unit_info_t info;
    fsdp_unit_info(m->eng, u, &info);
    r->params += info.numel;
    if (info.numel > r->largest_unit) r->largest_unit = info.numel;
  }
}

/* The ZeRO formula, bytes per rank (AdamW, U = largest unit, S = N shards, or 1
 * under NO_SHARD or on one rank):
 *   persistent 16P/S: fp32 master, gradient and the two moments
 *              bf16 params: + 2P/S for the bf16 shard, + 4P for its f32
 *              widening when S = 1 (the engine's param_copy)
 * + gathered   ZeRO-3: min(live, units) x U elements, live = max_live_units
 *                      (depth + 1, + 1 for a root unit held across the others)
 *              ZeRO-2: P elements; S = 1: none (views read the master)
 *              at 4 bytes an element, 6 for bf16 (the CPU keeps an f32 twin)
 * + gradients  (2 + root held) x 4U: one being computed, one being reduced,
 *              and the held root's; none on one rank with one micro-batch
 *              (backward adds into the gradient shards). */
static double predicted_bytes(const bench_result_t *r, const fsdp_config_t *c) {
  double P = (double)r->params, U = (double)r->largest_unit;
  int S = r->strategy == FSDP_NO_SHARD ? 1 : c->shard_size;
  int bf16 = c->param_dtype == FSDP_BF16 || c->param_dtype == FSDP_F16; /* 16-bit params */
  double persistent = 16.0 * P / S + (bf16 ? 2.0 * P / S + (S == 1 ? 4.0 * P : 0.0) : 0.0);
  double gathered = 0.0, elem = bf16 ? 6.0 : 4.0;
  int live = r->max_live < r->n_units ? r->max_live : r->n_units;
  if (S > 1 && r->strategy == FSDP_FULL_SHARD) gathered = elem * U * live;
  else if (S > 1 && r->strategy == FSDP_SHARD_GRAD_OP) gathered = elem * P;
  const int alone = r->shard_size * r->replicas == 1 && c->grad_accum == 1;
  double grads = alone ? 0.0 : 4.0 * U * (2 + r->root_held);
  return persistent + gathered + grads;
}

/* GPT-2: 6 (P - wpe) + 12 L T C per token (PaLM appendix B, as nanoGPT's
 * estimate_mfu: every weight multiplies once forward and twice backward, the
 * attention scores and values add 12 L T C; wpe is a lookup). A Llama: the
 * same with embed_tokens the lookup when the head is untied (tied, it is the
 * head's weight and multiplies); grouped-query attention shares k and v
 * between heads but the scores and values still span NH x D = C. MLP: 6P per
 * sample. Recomputation under checkpointing is not counted. */
static double flops_per_token(const bench_opts_t *o, const bench_result_t *r) {
  if (o->lm.kind == LM_NONE) return 6.0 * (double)r->params;
  lm_layout_t y;
  lm_layout(&o->lm, &y);
  return 6.0 * ((double)r->params - (double)y.lookup) +
         12.0 * y.n_layer * (double)o->seq_len * y.n_embd;
}

/* Sustained sgemm rate of this rank while every rank runs sgemms: three
 * windows of at least 0.5 s (and 2 sgemms) each, started together after a
 * barrier; the best window counts, which keeps a burst of load from elsewhere
 * out of it. Oversubscribed ranks share the cores inside a window, so the sum
 * over ranks is the machine's rate whatever the rank count. */
fsdp_status_t bench_peak_flops(fsdp_comm_t comm, int n, double *flops) {
  size_t nn = (size_t)n * n;
  float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c);
  fsdp_status_t st = a && b && c ? FSDP_SUCCESS : FSDP_ERR_OUT_OF_MEMORY;
  for (size_t i = 0; st == FSDP_SUCCESS && i < nn; i++)
    a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.2f;
  double best = 0.0, per = 2.0 * n * (double)n * n;
  if (st == FSDP_SUCCESS) /* warm-up: page faults, BLAS buffers */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  for (int w = 0; st == FSDP_SUCCESS && w < 3; w++) {
    st = fsdp_barrier(comm, FSDP_HOST_STREAM);
    double t0 = fsdp_time_now(), t = 0.0;
    int k = 0;
    for (; k < 2 || t < 0.5; k++, t = fsdp_time_now() - t0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                  c, n);
    if (k * per / t > best) best = k * per / t;
  }
  free(a);
  free(b);
  free(c);
  if (st == FSDP_SUCCESS) *flops = best;
  return st;
}

/* ---- one configuration ------------------------------------------------------- */

typedef struct {
  double *step, *compute, *comm, *gather, *reduce, *exposed; /* (iters) each */
  bench_window_t *w;
  bench_split_t *split;
  double busy, self; /* machine busy and own CPU seconds over the timed steps */
} series_t;

static int series_alloc(series_t *s, int n) {
  double *all = calloc((size_t)n * 6, sizeof *all);
  s->w = calloc((size_t)n, sizeof *s->w);
  s->split = calloc((size_t)n, sizeof *s->split);
  if (!all || !s->w || !s->split) return free(all), -1;
  s->step = all, s->compute = all + n, s->comm = all + 2 * n;
  s->gather = all + 3 * n, s->reduce = all + 4 * n, s->exposed = all + 5 * n;
  return 0;
}

static void series_free(series_t *s) {
  free(s->step);
  free(s->w);
  free(s->split);
}

/* Per step: the slowest rank's time; the split averaged over ranks. */
static fsdp_status_t series_reduce(fsdp_comm_t comm, series_t *s, int n, int nranks) {
  for (int i = 0; i < n; i++) {
    const bench_split_t *p = &s->split[i];
    s->step[i] = p->step_s;
    s->compute[i] = p->step_s - p->exposed_s;
    s->comm[i] = p->comm_s, s->gather[i] = p->gather_s;
    s->reduce[i] = p->reduce_s, s->exposed[i] = p->exposed_s;
  }
  BENCH_TRY(bench_reduce(comm, s->step, (size_t)n, FSDP_MAX));
  BENCH_TRY(bench_reduce(comm, s->compute, (size_t)n * 5, FSDP_SUM));
  for (int i = 0; i < n * 5; i++) s->compute[i] /= nranks;
  return FSDP_SUCCESS;
}

static fsdp_status_t timed_steps(model_t *m, const bench_opts_t *o, series_t *s,
                                 double *first, double *last) {
  double loss = 0.0;
  for (int64_t i = 0; i < o->warmup; i++) BENCH_TRY(model_step(m, &loss));
  fsdp_engine_timeline_clear(m->eng);
  if (o->kernel_profile) BENCH_TRY(fsdp_engine_profile(m->eng, 1)); /* the timed steps only */
  BENCH_TRY(fsdp_barrier(fsdp_engine_comm(m->eng), FSDP_HOST_STREAM));
  s->busy = bench_cpu_busy(), s->self = bench_cpu_self();
  for (int i = 0; i < (int)o->iters; i++) {
    s->w[i].t_begin = fsdp_time_now();
    BENCH_TRY(model_step(m, &loss));
    s->w[i].t_end = fsdp_time_now();
    if (i == 0) *first = loss;
  }
  *last = loss;
  s->busy = bench_cpu_busy() - s->busy, s->self = bench_cpu_self() - s->self;
  return FSDP_SUCCESS;
}

/* What other processes (and the hypervisor) took from the machine during the
 * timed steps: its busy CPU seconds less the ranks' own. One node only. */
static fsdp_status_t other_load(model_t *m, bench_result_t *r, const series_t *s, int iters) {
  fsdp_world_t world = fsdp_engine_world(m->eng);
  double v[2] = {s->busy, s->w[iters - 1].t_end - s->w[0].t_begin}, self = s->self;
  BENCH_TRY(bench_reduce(fsdp_engine_comm(m->eng), v, 2, FSDP_MAX));
  BENCH_TRY(bench_reduce(fsdp_engine_comm(m->eng), &self, 1, FSDP_SUM));
  if (fsdp_world_local_size(world) != fsdp_world_size(world)) r->other_load = -1.0;
  if (r->other_load < 0) return FSDP_SUCCESS;
  r->other_cpu += v[0] > self ? v[0] - self : 0.0;
  r->timed_wall += v[1];
  /* The machine's counters span slightly more than the timed window: on a
   * saturated machine the ratio can pass 1 by that skew. */
  r->other_load = fmin(1.0, r->other_cpu / (r->timed_wall * (double)sysconf(_SC_NPROCESSORS_ONLN)));
  return FSDP_SUCCESS;
}

/* Largest over ranks, and over the rounds so far (memory is the same every
 * round but the resident high-water mark is not). */
static fsdp_status_t memory(model_t *m, bench_result_t *r, double rss_base) {
  fsdp_mem_stats_t mem;
  fsdp_engine_memory(m->eng, &mem);
  const fsdp_config_t *c = fsdp_engine_config(m->eng);
  double *fields[10] = {&r->persistent, &r->gathered_peak, &r->grads_peak, &r->activations,
                        &r->model_peak,  &r->predicted,     &r->reserved,   &r->rss_base,
                        &r->rss_peak,    &r->device_used};
  double v[10] = {(double)mem.persistent, (double)mem.gathered_params_peak,
                  (double)mem.grads_in_flight_peak, (double)m->act_bytes,
                  (double)(mem.persistent + mem.gathered_params_peak + mem.grads_in_flight_peak),
                  predicted_bytes(r, c), (double)mem.total_reserved, rss_base,
                  (double)bench_rss_peak(),
                  c->device == FSDP_DEVICE_CUDA ? bench_cuda_device_used() : -1.0};
  BENCH_TRY(bench_reduce(fsdp_engine_comm(m->eng), v, 10, FSDP_MAX));
  for (int i = 0; i < 10; i++)
    if (v[i] > *fields[i]) *fields[i] = v[i];
  return FSDP_SUCCESS;
}

/* Statistics over every timed step of every round. */
static void summarise(bench_result_t *r, int nranks) {
  int n = r->n_samples, cap = r->cap_samples;
  const double *x = r->samples;
  double *tps = malloc((size_t)n * 3 * sizeof *tps);
  if (!tps) return;
  for (int i = 0; i < n; i++) {
    tps[i] = r->tokens_per_step / x[i];
    tps[n + i] = tps[i] / nranks;
    tps[2 * n + i] = r->peak_flops > 0 ? r->flops_per_token * tps[i] / r->peak_flops : 0.0;
  }
  bench_stat_t *out[6] = {&r->step_s, &r->compute_s, &r->comm_s,
                          &r->gather_s, &r->reduce_s, &r->exposed_s};
  for (int k = 0; k < 6; k++) *out[k] = bench_stat(x + (size_t)k * cap, n);
  r->tokens_per_s = bench_stat(tps, n), r->tokens_per_s_rank = bench_stat(tps + n, n);
  r->mfu = bench_stat(tps + 2 * n, n);
  free(tps);
}

/* Bytes per step by group, the mean over the timed steps (the same every step). */
static void comm_bytes(bench_result_t *r, const series_t *s, int n) {
  r->gather_bytes = r->reduce_bytes = r->replica_bytes = 0.0;
  for (int i = 0; i < n; i++) {
    r->gather_bytes += s->split[i].gather_bytes / n;
    r->reduce_bytes += s->split[i].reduce_bytes / n;
    r->replica_bytes += s->split[i].replica_bytes / n;
  }
}

/* Appends this round's reduced steps to the result's samples. */
static void append(bench_result_t *r, const series_t *s, int n) {
  const double *src[6] = {s->step, s->compute, s->comm, s->gather, s->reduce, s->exposed};
  for (int k = 0; k < 6; k++)
    memcpy(r->samples + (size_t)k * r->cap_samples + r->n_samples, src[k], (size_t)n * sizeof(double));
  r->n_samples += n;
}

static fsdp_status_t measure(model_t *m, const bench_opts_t *o, bench_result_t *r,
                             series_t *s, double rss_base, int round) {
  int nranks = fsdp_world_size(fsdp_engine_world(m->eng)), n_it = (int)o->iters;
  fsdp_comm_t comm = fsdp_engine_comm(m->eng);
  double first = 0.0, last = 0.0;
  BENCH_TRY(timed_steps(m, o, s, &first, &last));
  fsdp_replica_info_t ri;
  if (m->replica) {
    BENCH_TRY(fsdp_replica_info(m->replica, &ri));
    r->replica_snapshot_bytes = (double)ri.snapshot_bytes;
    r->replica_host_bytes = (double)ri.host_bytes;
    r->replica_copy_ms = ri.snapshots ? ri.copy_s * 1e3 / ri.snapshots : 0.0;
  }
  if (o->kernel_profile) BENCH_TRY(bench_kernels_collect(m->eng, &m->lm, m->B, m->T, n_it, r));
  size_t n = 0, dropped = 0;
  const fsdp_tl_event_t *tl = NULL;
  BENCH_TRY(fsdp_engine_timeline(m->eng, &tl, &n, &dropped));
  if (dropped)
    fprintf(stderr, "fsdp-bench: %zu timeline events dropped: the split is incomplete\n", dropped);
  bench_split_steps(tl, n, s->w, n_it, fsdp_engine_config(m->eng)->device == FSDP_DEVICE_CUDA,
                    s->split);
  comm_bytes(r, s, n_it);
  if (o->trace) /* every round rewrites it: the file holds the last */
    BENCH_TRY(bench_trace_write(m->eng, o->trace, tl, n, s->w, n_it, s->w[0].t_begin));
  BENCH_TRY(other_load(m, r, s, n_it));
  BENCH_TRY(series_reduce(comm, s, n_it, nranks));
  append(r, s, n_it);
  double losses[2] = {first, last};
  BENCH_TRY(bench_reduce(comm, losses, 2, FSDP_SUM));
  if (round == 0) r->loss_first = losses[0] / nranks;
  r->loss_last = losses[1] / nranks;
  double wrong = 0.0;
  if (o->check) BENCH_TRY(bench_check(m, first, last, &wrong));
  r->wrong += wrong;
  r->skipped_steps = (double)m->last.skipped_total;
  r->loss_scale = fsdp_engine_loss_scale(m->eng);
  BENCH_TRY(memory(m, r, rss_base));
  if (round == (int)o->rounds - 1) summarise(r, nranks);
  return FSDP_SUCCESS;
}

static int result_init(bench_result_t *r, const bench_opts_t *o, const fsdp_config_t *c,
                       int root_held) {
  memset(r, 0, sizeof *r);
  r->strategy = c->strategy, r->prefetch = c->prefetch_depth, r->max_live = c->max_live_units;
  r->root_held = root_held;
  r->device_used = -1.0;
  r->cap_samples = (int)(o->rounds * o->iters);
  r->samples = calloc((size_t)r->cap_samples * 6, sizeof *r->samples);
  return r->samples ? 0 : -1;
}

void bench_result_free(bench_result_t *r) {
  free(r->samples);
  r->samples = NULL;
}

int bench_run(fsdp_world_t world, const bench_opts_t *o, fsdp_strategy_t strategy, int depth,
              int shard_size, double peak_flops_rank, int round, bench_result_t *r) {
  lm_layout_t y = {0};
  if (o->lm.kind != LM_NONE) lm_layout(&o->lm, &y);
  const int gpt = o->lm.kind != LM_NONE, nranks = fsdp_world_size(world), layers = y.n_layer;
  fsdp_config_t c = o->cfg;
  c.strategy = strategy;
  c.prefetch_depth = depth;
  c.shard_size = shard_size;
  int root_held = gpt && (o->wrap.wrap_kinds || o->wrap.wrap_min_params);
  if (c.max_live_units == 0) c.max_live_units = depth + 1 + root_held;
  size_t events = (size_t)(o->iters + 1) * 64 * (size_t)(gpt ? layers + 2 : 8);
  if (c.timeline_capacity < events) c.timeline_capacity = events;
  if (round == 0 && result_init(r, o, &c, root_held))
    return fprintf(stderr, "fsdp-bench: out of host memory\n"), -1;

  bench_rss_reset();
  double rss_base = (double)bench_rss_now();
  model_t m = {.lm = o->lm};
  series_t s = {0};
  fsdp_status_t st = model_build(world, o, &c, &m);
  if (st == FSDP_SUCCESS && (make_data(&m, o, fsdp_world_rank(world)) ||
                             series_alloc(&s, (int)o->iters)))
    st = FSDP_ERR_OUT_OF_MEMORY;
  if (st == FSDP_SUCCESS) {
    model_sizes(&m, r);
    r->shard_size = fsdp_engine_config(m.eng)->shard_size;
    r->replicas = nranks / r->shard_size;
    r->replica_every = o->replica_every;
    if (round == 0 && m.ckpt_auto[0] && fsdp_world_rank(world) == 0 && !o->json)
      printf("  %s\n", m.ckpt_auto);
    memcpy(r->ckpt_auto, m.ckpt_auto, sizeof r->ckpt_auto);
    memcpy(r->ckpt_auto_json, m.ckpt_auto_json, sizeof r->ckpt_auto_json);
    r->tokens_per_step = (double)nranks * c.grad_accum * m.B * m.T;
    r->flops_per_token = flops_per_token(o, r);
    r->peak_flops = peak_flops_rank * nranks;
    st = measure(&m, o, r, &s, rss_base, round);
  }
  if (st == FSDP_ERR_OUT_OF_MEMORY && !*fsdp_last_error())
    fprintf(stderr, "fsdp-bench: out of host memory for the batches\n");
  else if (st != FSDP_SUCCESS && fsdp_world_size(world) > 1) {
    /* Perhaps this rank's failure alone: end the job rather than leave the
     * others waiting for it (fsdp_world_abort prints the line once). */
    char line[1200];
    snprintf(line, sizeof line, "fsdp-bench: rank %d: %s", fsdp_world_rank(world),
             fsdp_last_error());
    fsdp_world_abort(world, FSDP_SUCCESS, line);
  } else if (st != FSDP_SUCCESS)
    fprintf(stderr, "fsdp-bench: rank %d: %s\n", fsdp_world_rank(world), fsdp_last_error());
  series_free(&s);
  model_free(&m);
  return st == FSDP_SUCCESS ? 0 : -1;
}
