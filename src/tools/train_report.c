/* src/tools/train_report.c — what fsdp-train's tasks share: engine set-up and
 * the output (per-step lines, a progress bar on a terminal, JSON lines with
 * --json, the unit plan, memory per rank). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tools/train.h"

/* The shard size for the engine over t->nranks: --shard-size (0: the world);
 * after the world changed size (t->resized, t->joining) and --shard-size no
 * longer divides it, the smallest divisor of the new world above it (the
 * world itself at worst: plain FSDP), so that no rank holds more than before
 * (16P/S) and every rank, deciding from the same two numbers, chooses alike. */
static int shard_size(const trainer_t *t) {
  int want = t->o->cfg.shard_size, n = t->nranks;
  if (!want || n % want == 0 || !(t->joining || t->resized)) return want;
  for (int s = want + 1; s < n; s++)
    if (n % s == 0) return s;
  return n;
}

fsdp_status_t train_engine(trainer_t *t, int total_steps) {
  fsdp_config_t c = t->o->cfg;
  t->total_steps = total_steps;
  c.schedule.total_steps = total_steps;
  c.shard_size = shard_size(t);
  if (c.schedule.warmup_steps < 0) c.schedule.warmup_steps = total_steps < 200 ? total_steps / 10 : 20;
  fsdp_status_t st = fsdp_engine_create(t->world, &c, &t->eng);
  if (st) return st;
  return fsdp_engine_shard_batch(t->eng, t->o->global_batch, &t->micro, &t->offset);
}

fsdp_status_t train_sum(const trainer_t *t, double *values, int n) {
  return fsdp_all_reduce(fsdp_engine_comm(t->eng), values, values, (size_t)n, FSDP_F64,
                         FSDP_SUM, FSDP_HOST_STREAM);
}

size_t train_peak_bytes(const trainer_t *t) {
  fsdp_mem_stats_t m;
  fsdp_engine_memory(t->eng, &m);
  return m.persistent + m.gathered_params_peak + m.grads_in_flight_peak + t->act_bytes;
}

static void json_step(trainer_t *t, int step, double loss, const fsdp_step_stats_t *st,
                      double secs, const char *unit, double per_step) {
  fsdp_mem_stats_t m;
  fsdp_engine_memory(t->eng, &m);
  printf("{\"event\":\"step\",\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6f,"
         "\"%s_per_s\":%.1f,\"step_ms\":%.3f,\"skipped_total\":%lld,\"loss_scale\":%.9g,"
         "\"mem\":{\"persistent\":%zu,\"gathered_peak\":%zu,"
         "\"grads_peak\":%zu,\"activations\":%zu,\"peak\":%zu}}\n",
         step, loss, st->lr, st->grad_norm, unit, per_step / secs, secs * 1e3,
         (long long)st->skipped_total, st->loss_scale, m.persistent,
         m.gathered_params_peak, m.grads_in_flight_peak, t->act_bytes, train_peak_bytes(t));
}

/* JSON has no NaN or Inf: non-finite values are written as strings. */
static void json_number(const char *key, double x) {
  if (isfinite(x)) printf("\"%s\":%.6g", key, x);
  else printf("\"%s\":\"%s\"", key, isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
}

static void report_skip(const trainer_t *t, int step, double loss, const fsdp_step_stats_t *st) {
  if (t->rank != 0) return;
  double next = fsdp_engine_loss_scale(t->eng);
  if (t->o->json) {
    printf("{\"event\":\"skip\",\"step\":%d,", step);
    json_number("loss", loss);
    printf(",");
    json_number("grad_norm", st->grad_norm);
    printf(",\"nonfinite_loss_ranks\":%d,\"consecutive\":%d,\"skipped_total\":%lld,"
           "\"loss_scale\":%.9g,\"next_loss_scale\":%.9g}\n", st->nonfinite_loss_ranks,
           st->consecutive_skips, (long long)st->skipped_total, st->loss_scale, next);
  } else {
    printf("%sskip  %5d | loss %.4f | norm %g | non-finite: update not applied (%d in a row, %lld "
           "in all)", t->tty ? "\n" : "", step, loss, st->grad_norm, st->consecutive_skips,
           (long long)st->skipped_total);
    if (st->loss_scale != next) printf(" | loss scale %g -> %g", st->loss_scale, next);
    printf("\n");
  }
  fflush(stdout);
}

int train_update(trainer_t *t, int step, double loss, fsdp_step_stats_t *st) {
  /* Every rank knows the global loss; a rank's own NaN also reaches the engine
   * through its gradients. */
  if (fsdp_engine_report_loss(t->eng, loss)) return -1;
  fsdp_status_t rc = fsdp_engine_step(t->eng, st);
  if (rc == FSDP_ERR_NONFINITE) report_skip(t, step, loss, st);
  if (rc) return -1;
  if (st->skipped) report_skip(t, step, loss, st);
  return st->skipped ? 1 : 0;
}

float train_loss_scale(const trainer_t *t) { return (float)fsdp_engine_loss_scale(t->eng); }

void train_report_step(trainer_t *t, int step, double loss, const fsdp_step_stats_t *st,
                       double secs, const char *unit, double per_step) {
  if (t->rank != 0 || (step % t->o->log_every != 0 && step != t->total_steps && !t->tty)) return;
  if (t->o->json) {
    json_step(t, step, loss, st, secs, unit, per_step);
    return;
  }
  char line[200];
  snprintf(line, sizeof line, "step %5d/%d | loss %.4f | lr %.2e | norm %7.3f | %9.0f %s/s | "
           "%8.2f ms | peak %.2f MiB/rank", step, t->total_steps, loss, st->lr, st->grad_norm,
           per_step / secs, unit, secs * 1e3, train_peak_bytes(t) / 1048576.0);
  if (!t->tty) {
    printf("%s\n", line);
    return;
  }
  int width = 24, done = (int)((long)width * step / t->total_steps);
  printf("\r[%.*s%*s] %s", done, "========================", width - done, "", line);
  if (step == t->total_steps) printf("\n");
  fflush(stdout);
}

void train_report_eval(trainer_t *t, int step, const char *metric, double loss, double value) {
  if (t->rank != 0) return;
  if (t->o->json)
    printf("{\"event\":\"eval\",\"step\":%d,\"loss\":%.6f,\"%s\":%.6f}\n", step, loss, metric,
           value);
  else
    printf("%seval  %5d | loss %.4f | %s %.4f\n", t->tty ? "\n" : "", step, loss, metric, value);
  fflush(stdout);
}

void train_print_plan(const trainer_t *t, const char *what) {
  if (t->rank != 0 || t->o->json) return;
  const fsdp_config_t *c = &t->o->cfg;
  /* The engine's resolved shard size: "zero3" or "zero3 (HSDP 2 x 2)". */
  int shard = fsdp_engine_config(t->eng)->shard_size;
  char hsdp[48] = "";
  if (shard < t->nranks && c->strategy != FSDP_NO_SHARD)
    snprintf(hsdp, sizeof hsdp, " (HSDP %d x %d)", t->nranks / shard, shard);
  printf("fsdp-train: %s | %d ranks | %s%s | prefetch %d | global batch %lld = %d ranks x %lld "
         "x %d micro-batches\n", what, t->nranks, fsdp_strategy_name(c->strategy), hsdp,
         c->prefetch_depth, (long long)t->o->global_batch, t->nranks, (long long)t->micro,
         c->grad_accum);
  /* columns as wide as the longest name and kind ("model.layers.0-1"), at least 8 and 16 */
  int wn = 8, wk = 16;
  for (int u = 0; u < fsdp_engine_num_units(t->eng); u++) {
    fsdp_unit_info_t info;
    if (fsdp_unit_info(t->eng, u, &info) != FSDP_SUCCESS) continue;
    if ((int)strlen(info.name) > wn) wn = (int)strlen(info.name);
    if ((int)strlen(info.kind) > wk) wk = (int)strlen(info.kind);
  }
  printf("  %-*s %-*s %12s %14s %8s %6s\n", wn, "unit", wk, "kind", "parameters", "bytes/rank",
         "reshard", "dtype");
  /* master, gradient and optimizer state (AdamW's m and v, SGD's momentum
   * buffer) of this rank's shard: what the engine allocates per element */
  const fsdp_optim_config_t *opt = &fsdp_engine_config(t->eng)->optim;
  size_t per = opt->kind == FSDP_OPTIM_ADAMW ? 16 : opt->momentum > 0.0f ? 12 : 8;
  for (int u = 0; u < fsdp_engine_num_units(t->eng); u++) {
    fsdp_unit_info_t info;
    if (fsdp_unit_info(t->eng, u, &info) != FSDP_SUCCESS) continue;
    printf("  %-*s %-*s %12zu %14zu %8s %6s\n", wn, info.name, wk, info.kind, info.numel,
           info.shard_numel * per, info.reshard_after_forward ? "yes" : "no",
           fsdp_dtype_name(info.param_dtype));
  }
  fflush(stdout);
}
