/* src/tools/fsdp_train.c — fsdp-train: trains the MLP with the FSDP engine on a
 * synthetic classification task (a fixed random teacher labels Gaussian points),
 * under mpirun or on one rank. Prints one line per step (or JSON lines with
 * --json) and a summary with held-out accuracy. main parses flags and calls the
 * library; everything else is the engine's public API. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/fsdp.h"

typedef struct {
  fsdp_config_t cfg;
  int widths[8], n_layers;
  int64_t global_batch;
  int steps, eval_every, json;
  uint64_t seed;
} opts_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: fsdp-train [options]   (launch with: mpirun -np N fsdp-train ...)\n"
          "  --strategy zero3|zero2|noshard   sharding (default zero3)\n"
          "  --prefetch D        units gathered ahead (default 1)\n"
          "  --widths a,b,...    MLP layer widths, inputs first (default 64,256,256,10)\n"
          "  --global-batch B    samples per step over all ranks (default 256)\n"
          "  --micro-batches M   gradient accumulation steps (default 1)\n"
          "  --accumulate-full   keep full grads across micro-batches, reduce once\n"
          "  --optim adamw|sgd   (default adamw)   --lr X (default 3e-3)\n"
          "  --momentum X        SGD momentum (default 0.9)\n"
          "  --wd X              weight decay (default 0.01)\n"
          "  --clip X            clip the global grad norm (default 1.0, 0 = off)\n"
          "  --schedule constant|cosine   --warmup N  (default cosine, 10 warm-up steps)\n"
          "  --steps N (default 200)   --eval-every N (default 50)   --seed N\n"
          "  --json              one JSON object per line\n");
}

static int parse_widths(const char *s, opts_t *o) {
  o->n_layers = -1;
  for (const char *p = s; *p && o->n_layers < 7;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v <= 0 || v > 1 << 20) return -1;
    o->widths[++o->n_layers] = (int)v;
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return o->n_layers >= 1 ? 0 : -1;
}

static int parse(int argc, char **argv, opts_t *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int used = 1;
    if (!strcmp(a, "--json")) o->json = 1, used = 0;
    else if (!strcmp(a, "--accumulate-full")) o->cfg.accumulate_full_grads = 1, used = 0;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 1;
    else if (!v) return fprintf(stderr, "fsdp-train: %s needs a value\n", a), -1;
    else if (!strcmp(a, "--strategy")) {
      if (fsdp_strategy_parse(v, &o->cfg.strategy))
        return fprintf(stderr, "fsdp-train: %s\n", fsdp_last_error()), -1;
    } else if (!strcmp(a, "--prefetch")) o->cfg.prefetch_depth = atoi(v);
    else if (!strcmp(a, "--widths")) {
      if (parse_widths(v, o))
        return fprintf(stderr, "fsdp-train: --widths '%s' is not a list like 64,256,10\n", v), -1;
    } else if (!strcmp(a, "--global-batch")) o->global_batch = atoll(v);
    else if (!strcmp(a, "--micro-batches")) o->cfg.grad_accum = atoi(v);
    else if (!strcmp(a, "--optim"))
      o->cfg.optim.kind = !strcmp(v, "sgd") ? FSDP_OPTIM_SGD : FSDP_OPTIM_ADAMW;
    else if (!strcmp(a, "--lr")) o->cfg.optim.lr = strtof(v, NULL);
    else if (!strcmp(a, "--momentum")) o->cfg.optim.momentum = strtof(v, NULL);
    else if (!strcmp(a, "--wd")) o->cfg.optim.weight_decay = strtof(v, NULL);
    else if (!strcmp(a, "--clip")) o->cfg.optim.max_grad_norm = strtof(v, NULL);
    else if (!strcmp(a, "--schedule"))
      o->cfg.schedule.kind = !strcmp(v, "cosine") ? FSDP_SCHED_WARMUP_COSINE : FSDP_SCHED_CONSTANT;
    else if (!strcmp(a, "--warmup")) o->cfg.schedule.warmup_steps = atoll(v);
    else if (!strcmp(a, "--steps")) o->steps = atoi(v);
    else if (!strcmp(a, "--eval-every")) o->eval_every = atoi(v);
    else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
    else return fprintf(stderr, "fsdp-train: unknown option '%s' (see --help)\n", a), -1;
    i += used;
  }
  if (o->steps <= 0) return fprintf(stderr, "fsdp-train: --steps must be positive\n"), -1;
  o->cfg.schedule.total_steps = o->steps;
  if (o->cfg.schedule.warmup_steps < 0) o->cfg.schedule.warmup_steps = o->steps < 100 ? o->steps / 10 : 10;
  return 0;
}

/* Sample `id` of the task: x ~ N(0, 1) and the teacher's argmax label. */
static void sample(const opts_t *o, uint64_t id, float *x, int *y) {
  int in = o->widths[0], classes = o->widths[o->n_layers];
  float best = -INFINITY;
  for (int i = 0; i < in; i++)
    x[i] = fsdp_init_value(o->seed + 1, "data", id * (uint64_t)in + (uint64_t)i,
                           FSDP_INIT_NORMAL, 1.0f);
  for (int c = 0; c < classes; c++) {
    float z = 0.0f;
    for (int i = 0; i < in; i++)
      z += x[i] * fsdp_init_value(o->seed + 2, "teacher", (uint64_t)(c * in + i),
                                  FSDP_INIT_NORMAL, 1.0f);
    if (z > best) best = z, *y = c;
  }
}

typedef struct {
  const opts_t *o;
  fsdp_engine_t eng;
  fsdp_mlp_t mlp;
  int64_t micro, offset;
  float *x;
  int *y, *pred;
  int rank, nranks;
} trainer_t;

/* Held-out accuracy over `n` samples beyond the training stream, split by rank. */
static int evaluate(trainer_t *t, int n, double *loss, double *acc) {
  double local[2] = {0, 0}, total[2];
  int per = n / t->nranks;
  for (int done = 0; done < per; done += (int)t->micro) {
    int b = per - done < t->micro ? per - done : (int)t->micro;
    for (int i = 0; i < b; i++)
      sample(t->o, (uint64_t)1 << 40 | (uint64_t)(t->rank * per + done + i),
             t->x + (size_t)i * (size_t)t->o->widths[0], &t->y[i]);
    double l;
    if (fsdp_mlp_predict(t->mlp, t->x, t->y, b, t->pred, &l)) return -1;
    local[0] += l;
    for (int i = 0; i < b; i++) local[1] += t->pred[i] == t->y[i];
  }
  if (fsdp_all_reduce(fsdp_engine_comm(t->eng), local, total, 2, FSDP_F64, FSDP_SUM,
                      FSDP_HOST_STREAM))
    return -1;
  *loss = total[0] / (per * t->nranks);
  *acc = total[1] / (per * t->nranks);
  return 0;
}

static int train_step(trainer_t *t, int step, double *loss, fsdp_step_stats_t *st) {
  const opts_t *o = t->o;
  double local = 0.0;
  for (int m = 0; m < o->cfg.grad_accum; m++) {
    uint64_t base = (uint64_t)step * (uint64_t)o->global_batch +
                    (uint64_t)(m * (o->global_batch / o->cfg.grad_accum) + t->offset);
    for (int i = 0; i < t->micro; i++)
      sample(o, base + (uint64_t)i, t->x + (size_t)i * (size_t)o->widths[0], &t->y[i]);
    double l;
    if (fsdp_mlp_forward_backward(t->mlp, t->x, t->y, (int)t->micro, 1.0f / (float)t->micro, &l))
      return -1;
    local += l;
  }
  double total;
  if (fsdp_all_reduce(fsdp_engine_comm(t->eng), &local, &total, 1, FSDP_F64, FSDP_SUM,
                      FSDP_HOST_STREAM))
    return -1;
  *loss = total / (double)o->global_batch;
  return fsdp_engine_step(t->eng, st) ? -1 : 0;
}

static void report_step(const trainer_t *t, int step, double loss, const fsdp_step_stats_t *st,
                        double secs) {
  fsdp_mem_stats_t m;
  fsdp_engine_memory(t->eng, &m);
  double sps = (double)t->o->global_batch / secs;
  size_t peak = m.persistent + m.gathered_params_peak + m.grads_in_flight_peak;
  if (t->o->json)
    printf("{\"event\":\"step\",\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6f,"
           "\"samples_per_s\":%.1f,\"step_ms\":%.3f,\"mem\":{\"persistent\":%zu,"
           "\"gathered_peak\":%zu,\"grads_peak\":%zu,\"reserved\":%zu}}\n",
           step, loss, st->lr, st->grad_norm, sps, secs * 1e3, m.persistent,
           m.gathered_params_peak, m.grads_in_flight_peak, m.total_reserved);
  else
    printf("step %5d | loss %.4f | lr %.2e | norm %6.3f | %8.0f samples/s | %7.2f ms | "
           "mem/rank %.2f MiB (peak %.2f)\n", step, loss, st->lr, st->grad_norm, sps, secs * 1e3,
           m.persistent / 1048576.0, peak / 1048576.0);
}

static int run(trainer_t *t) {
  const opts_t *o = t->o;
  double t0 = fsdp_time_now(), loss = 0, first = -1, eloss = 0, acc = 0;
  for (int s = 0; s < o->steps; s++) {
    fsdp_step_stats_t st;
    double ts = fsdp_time_now();
    if (train_step(t, s, &loss, &st)) return -1;
    if (first < 0) first = loss;
    if (t->rank == 0) report_step(t, s + 1, loss, &st, fsdp_time_now() - ts);
    if ((o->eval_every > 0 && (s + 1) % o->eval_every == 0) || s + 1 == o->steps) {
      if (evaluate(t, 2048, &eloss, &acc)) return -1;
      if (t->rank == 0)
        printf(o->json ? "{\"event\":\"eval\",\"step\":%d,\"loss\":%.6f,\"accuracy\":%.4f}\n"
                       : "eval  %5d | loss %.4f | accuracy %.2f%%\n",
               s + 1, eloss, o->json ? acc : 100 * acc);
    }
  }
  double secs = fsdp_time_now() - t0;
  if (t->rank == 0) {
    fsdp_mem_stats_t m;
    fsdp_engine_memory(t->eng, &m);
    if (o->json)
      printf("{\"event\":\"summary\",\"ranks\":%d,\"strategy\":\"%s\",\"steps\":%d,"
             "\"first_loss\":%.6f,\"final_loss\":%.6f,\"test_loss\":%.6f,\"test_accuracy\":%.4f,"
             "\"seconds\":%.3f,\"persistent_bytes\":%zu}\n", t->nranks,
             fsdp_strategy_name(o->cfg.strategy), o->steps, first, loss, eloss, acc, secs,
             m.persistent);
    else
      printf("done: %d ranks, %s, %d steps in %.2f s | loss %.4f -> %.4f | held-out accuracy "
             "%.2f%% | persistent %.2f MiB/rank\n", t->nranks, fsdp_strategy_name(o->cfg.strategy),
             o->steps, secs, first, loss, 100 * acc, m.persistent / 1048576.0);
  }
  return 0;
}

static void print_plan(const trainer_t *t) {
  printf("fsdp-train: %d ranks, %s, prefetch %d, global batch %lld (%lld per rank x %d micro)\n",
         t->nranks, fsdp_strategy_name(t->o->cfg.strategy), t->o->cfg.prefetch_depth,
         (long long)t->o->global_batch, (long long)t->micro, t->o->cfg.grad_accum);
  for (int u = 0; u < fsdp_engine_num_units(t->eng); u++) {
    fsdp_unit_info_t info;
    fsdp_unit_info(t->eng, u, &info);
    printf("  unit %-6s %-8s %9zu params  %9zu param bytes/rank\n", info.name, info.kind, info.numel,
           info.shard_numel * sizeof(float));
  }
}

int main(int argc, char **argv) {
  opts_t o = {.cfg = FSDP_CONFIG_INIT, .widths = {64, 256, 256, 10}, .n_layers = 3,
              .global_batch = 256, .steps = 200, .eval_every = 50, .seed = 1};
  o.cfg.optim.lr = 3e-3f;
  o.cfg.optim.momentum = 0.9f;
  o.cfg.optim.weight_decay = 0.01f;
  o.cfg.optim.max_grad_norm = 1.0f;
  o.cfg.schedule.kind = FSDP_SCHED_WARMUP_COSINE;
  o.cfg.schedule.warmup_steps = -1; /* default: 10, or a tenth of a short run */
  o.cfg.schedule.min_lr_ratio = 0.1f;
  int p = parse(argc, argv, &o);
  if (p) return p > 0 ? 0 : 2;

  fsdp_world_t world = NULL;
  trainer_t t = {.o = &o};
  int rc = 1;
  if (fsdp_world_init(&world, NULL)) goto fail;
  t.rank = fsdp_world_rank(world);
  t.nranks = fsdp_world_size(world);
  if (fsdp_engine_create(world, &o.cfg, &t.eng)) goto fail;
  if (fsdp_engine_shard_batch(t.eng, o.global_batch, &t.micro, &t.offset)) goto fail;
  if (fsdp_mlp_create(t.eng, o.widths, o.n_layers, (int)t.micro, &t.mlp)) goto fail;
  if (fsdp_engine_materialize(t.eng, o.seed)) goto fail;
  t.x = malloc((size_t)t.micro * (size_t)o.widths[0] * sizeof(float));
  t.y = malloc((size_t)t.micro * sizeof(int));
  t.pred = malloc((size_t)t.micro * sizeof(int));
  if (!t.x || !t.y || !t.pred) {
    fprintf(stderr, "fsdp-train: out of memory\n");
    goto done;
  }
  if (t.rank == 0 && !o.json) print_plan(&t);
  if (run(&t)) goto fail;
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "fsdp-train: rank %d: %s\n", world ? fsdp_world_rank(world) : 0,
          fsdp_last_error());
done:
  free(t.x);
  free(t.y);
  free(t.pred);
  fsdp_mlp_destroy(t.mlp);
  fsdp_engine_destroy(t.eng);
  fsdp_world_destroy(world);
  return rc;
}
