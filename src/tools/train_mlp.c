/* src/tools/train_mlp.c — the MLP on Fashion-MNIST: epochs through the
 * distributed sampler, test accuracy after each epoch. */
#include <stdio.h>
#include <stdlib.h>

#include "tools/train.h"

typedef struct {
  fsdp_idx_dataset_t train, test;
  fsdp_mlp_t mlp;
  fsdp_sampler_t sampler;
  float *x;
  int *y, *pred;
  uint32_t *idx;
} mlp_task_t;

/* Pixels standardised with the training set's mean and deviation (0.286, 0.353
 * on [0, 1]): centred inputs train faster than raw intensities. */
static void fill(const fsdp_idx_dataset_t *ds, const uint32_t *idx, int n, float *x, int *y) {
  size_t d = (size_t)ds->rows * (size_t)ds->cols;
  for (int i = 0; i < n; i++) {
    const uint8_t *img = ds->images + (size_t)idx[i] * d;
    for (size_t k = 0; k < d; k++)
      x[(size_t)i * d + k] = (img[k] * (1.0f / 255.0f) - 0.286f) * (1.0f / 0.353f);
    y[i] = ds->labels[idx[i]];
  }
}

/* This rank's slice [r n/N, (r+1) n/N) of the test set, in micro-batches. */
static int evaluate(trainer_t *t, mlp_task_t *m, double *loss, double *acc) {
  size_t n = (size_t)m->test.n, lo = n * (size_t)t->rank / (size_t)t->nranks;
  size_t hi = n * (size_t)(t->rank + 1) / (size_t)t->nranks;
  double sums[2] = {0, 0};
  for (size_t i = lo; i < hi; i += (size_t)t->micro) {
    int b = (int)(hi - i < (size_t)t->micro ? hi - i : (size_t)t->micro);
    for (int k = 0; k < b; k++) m->idx[k] = (uint32_t)(i + (size_t)k);
    fill(&m->test, m->idx, b, m->x, m->y);
    double l;
    if (fsdp_mlp_predict(m->mlp, m->x, m->y, b, m->pred, &l)) return -1;
    sums[0] += l;
    for (int k = 0; k < b; k++) sums[1] += m->pred[k] == m->y[k];
  }
  if (train_sum(t, sums, 2)) return -1;
  *loss = sums[0] / (double)n;
  *acc = sums[1] / (double)n;
  return 0;
}

static int step(trainer_t *t, mlp_task_t *m, int64_t epoch, int64_t batch, double *loss) {
  double sum = 0.0;
  int64_t per_micro = t->o->global_batch / t->o->cfg.grad_accum;
  for (int k = 0; k < t->o->cfg.grad_accum; k++) {
    if (fsdp_sampler_batch(&m->sampler, epoch, batch, k * per_micro + t->offset, t->micro,
                           m->idx))
      return -1;
    fill(&m->train, m->idx, (int)t->micro, m->x, m->y);
    double l;
    if (fsdp_mlp_forward_backward(m->mlp, m->x, m->y, (int)t->micro,
                                  train_loss_scale(t) / (float)t->micro, &l))
      return -1;
    sum += l;
  }
  if (train_sum(t, &sum, 1)) return -1;
  *loss = sum / (double)t->o->global_batch;
  return 0;
}

static int run(trainer_t *t, mlp_task_t *m) {
  const train_opts_t *o = t->o;
  double loss = 0, first = -1, tl = 0, acc = 0;
  int evals = 0;
  int64_t per_epoch = m->sampler.batches_per_epoch;
  int end = train_end_step(t), s = end > t->start_step ? end - t->start_step : 0;
  for (int k = t->start_step; k < end; k++) {
    double ts = fsdp_time_now();
    fsdp_step_stats_t st;
    if (step(t, m, k / per_epoch, k % per_epoch, &loss) || train_fault(t, k + 1)) return -1;
    int skipped = train_update(t, k + 1, loss, &st);
    if (skipped < 0) return -1;
    if (skipped) {
      k--; /* the same update again, on the same batch */
      continue;
    }
    if (first < 0) first = loss;
    train_report_step(t, k + 1, loss, &st, fsdp_time_now() - ts, "samples",
                      (double)o->global_batch);
    if (k % per_epoch == per_epoch - 1) {
      if (evaluate(t, m, &tl, &acc)) return -1;
      evals++;
      train_report_eval(t, k + 1, "test_accuracy", tl, acc);
    }
    if (train_save(t, k + 1)) return -1;
  }
  char tl_text[32], acc_text[32], pct_text[32];
  snprintf(tl_text, sizeof tl_text, "%.6f", tl);
  snprintf(acc_text, sizeof acc_text, "%.4f", acc);
  snprintf(pct_text, sizeof pct_text, "%.2f%%", 100 * acc);
  if (t->rank == 0 && o->json)
    printf("{\"event\":\"summary\",\"model\":\"mlp\",\"ranks\":%d,\"strategy\":\"%s\","
           "\"epochs\":%d,\"steps\":%d,\"seconds\":%.2f,\"first_loss\":%.6f,\"final_loss\":%.6f,"
           "\"test_loss\":%s,\"test_accuracy\":%s,\"peak_bytes_per_rank\":%zu}\n",
           t->nranks, fsdp_strategy_name(o->cfg.strategy), o->epochs, s,
           fsdp_time_now() - t->t0, first, loss, evals ? tl_text : "null",
           evals ? acc_text : "null", train_peak_bytes(t));
  else if (t->rank == 0)
    printf("done: mlp, %d ranks, %s, %d epochs (%d steps) in %.1f s | loss %.4f -> %.4f | "
           "%s%s | peak %.2f MiB/rank\n", t->nranks,
           fsdp_strategy_name(o->cfg.strategy), o->epochs, s, fsdp_time_now() - t->t0, first,
           loss, evals ? "test accuracy " : "no eval ran", evals ? pct_text : "",
           train_peak_bytes(t) / 1048576.0);
  return 0;
}

static size_t idx_bytes(const fsdp_idx_dataset_t *ds) {
  return (size_t)ds->n * ((size_t)ds->rows * (size_t)ds->cols + 1);
}

/* The data's identity for the consistency check: images, then labels. */
static uint64_t idx_hash(const fsdp_idx_dataset_t *ds, uint64_t h) {
  h = train_hash(h, ds->images, (size_t)ds->n * (size_t)ds->rows * (size_t)ds->cols);
  return train_hash(h, ds->labels, (size_t)ds->n);
}

static int setup(trainer_t *t, mlp_task_t *m) {
  const train_opts_t *o = t->o;
  const char *dir = o->data ? o->data : "/usr/share/datasets/fashion-mnist";
  if (fsdp_fashion_mnist_load(dir, "train", &m->train) ||
      fsdp_fashion_mnist_load(dir, "t10k", &m->test) ||
      train_engine(t, (int)(m->train.n / o->global_batch) * o->epochs) ||
      train_check_consistency(t, dir, idx_bytes(&m->train) + idx_bytes(&m->test),
                              idx_hash(&m->test, idx_hash(&m->train, 0))))
    return -1;
  int widths[8], d = m->train.rows * m->train.cols;
  widths[0] = d;
  for (int i = 0; i < o->n_hidden; i++) widths[i + 1] = o->hidden[i];
  widths[o->n_hidden + 1] = 10;
  /* The wrap flags, over the layers ("fc.<i>", kind Linear): a unit each by default. */
  fsdp_plan_opts_t plan = FSDP_PLAN_OPTS_INIT;
  plan.wrap_kinds = o->wrap.wrap_kinds;
  plan.wrap_min_params = o->wrap.wrap_min_params;
  plan.checkpoint_kinds = o->wrap.checkpoint_kinds;
  if (fsdp_mlp_create_plan(t->eng, widths, o->n_hidden + 1, (int)t->micro, &plan, &m->mlp) ||
      fsdp_engine_materialize(t->eng, o->seed) ||
      fsdp_sampler_init(&m->sampler, (size_t)m->train.n, o->global_batch, o->seed))
    return -1;
  m->x = malloc((size_t)t->micro * (size_t)d * sizeof(float));
  m->y = malloc((size_t)t->micro * sizeof(int));
  m->pred = malloc((size_t)t->micro * sizeof(int));
  m->idx = malloc((size_t)t->micro * sizeof(uint32_t));
  if (!m->x || !m->y || !m->pred || !m->idx) {
    fprintf(stderr, "fsdp-train: out of memory for a batch of %lld\n", (long long)t->micro);
    return -1;
  }
  t->act_bytes = fsdp_mlp_activation_bytes(m->mlp);
  train_print_plan(t, "mlp on Fashion-MNIST");
  return 0;
}

int train_mlp(trainer_t *t) {
  mlp_task_t m = {0};
  int rc = setup(t, &m) || train_resume(t) || run(t, &m) ? -1 : 0;
  free(m.x);
  free(m.y);
  free(m.pred);
  free(m.idx);
  fsdp_sampler_free(&m.sampler);
  fsdp_mlp_destroy(m.mlp);
  fsdp_idx_free(&m.train);
  fsdp_idx_free(&m.test);
  return rc;
}
