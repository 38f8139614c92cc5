/* src/nn/mlp.c — a multi-layer perceptron written only against the public
 * engine API: its layers cut into units by a wrap policy (fsdp/plan.h; one
 * unit per layer by default), ReLU between layers, softmax cross-entropy on
 * the logits. The handle owns activations, never parameters. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "fsdp/nn.h"

struct fsdp_mlp {
  fsdp_engine_t engine;
  int n_layers;
  int max_batch;
  int *widths;        /* (n_layers + 1) */
  /* units[0] is the root (the layers no unit of the plan takes; id -1 when
   * there are none), units[1..n_units-1] the plan's, in order. */
  fsdp_unit_t *units; /* (n_layers + 1) */
  int n_units;
  int *first, *last;  /* (n_layers + 1) a unit's first and last layer */
  int *layer_unit;    /* (n_layers) index into units */
  int *slot;          /* (n_layers) the layer's weight in its unit's view */
  fsdp_view_t *views; /* (n_layers + 1) */
  /* act[i + 1] is layer i's output: post-ReLU for hidden layers (ReLU's
   * backward needs only its output), logits for the last. act[0] is unused:
   * layer 0 reads the caller's x, kept in `x` for the pass. */
  float **act;        /* (n_layers + 1) of (max_batch, widths[i]) */
  const float *x;     /* (B, widths[0]) */
  float *dlogits;     /* (max_batch, classes) */
  /* (max_batch, widest hidden layer) each: [0] a layer's dinp, [1] that
   * gradient taken back through the ReLU below it (the next layer's dout). */
  float *scratch[2];
  size_t act_bytes;
};

static float *alloc_rows(struct fsdp_mlp *m, int rows, int cols) {
  size_t bytes = (size_t)rows * (size_t)cols * sizeof(float);
  m->act_bytes += bytes;
  return fsdp_alloc(bytes);
}

void fsdp_mlp_destroy(fsdp_mlp_t m) {
  if (!m) return;
  if (m->act)
    for (int i = 1; i <= m->n_layers; ++i) fsdp_free(m->act[i]);
  fsdp_free(m->act);
  fsdp_free(m->dlogits);
  fsdp_free(m->scratch[0]);
  fsdp_free(m->scratch[1]);
  fsdp_free(m->units);
  fsdp_free(m->first);
  fsdp_free(m->last);
  fsdp_free(m->layer_unit);
  fsdp_free(m->slot);
  fsdp_free(m->views);
  fsdp_free(m->widths);
  fsdp_free(m);
}

static fsdp_status_t check_shape(fsdp_engine_t engine, const int *widths, int n_layers,
                                 int max_batch) {
  if (!engine) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: engine is NULL");
  if (!widths) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: widths is NULL");
  if (n_layers < 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: n_layers %d must be >= 1", n_layers);
  if (max_batch < 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: max_batch %d must be >= 1", max_batch);
  for (int i = 0; i <= n_layers; ++i)
    if (widths[i] < 1)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: widths[%d] = %d must be >= 1", i,
                        widths[i]);
  return FSDP_SUCCESS;
}

/* Everything is allocated before any unit is registered, so running out of
 * memory never leaves the engine with half an MLP. */
static fsdp_status_t alloc_buffers(struct fsdp_mlp *m, const int *widths) {
  const int L = m->n_layers, B = m->max_batch;
  m->widths = fsdp_alloc((size_t)(L + 1) * sizeof(int));
  m->units = fsdp_alloc((size_t)(L + 1) * sizeof(fsdp_unit_t));
  m->first = fsdp_alloc((size_t)(L + 1) * sizeof(int));
  m->last = fsdp_alloc((size_t)(L + 1) * sizeof(int));
  m->layer_unit = fsdp_alloc((size_t)L * sizeof(int));
  m->slot = fsdp_alloc((size_t)L * sizeof(int));
  m->views = fsdp_alloc((size_t)(L + 1) * sizeof(fsdp_view_t));
  m->act = fsdp_alloc((size_t)(L + 1) * sizeof(float *));
  if (!m->widths || !m->units || !m->first || !m->last || !m->layer_unit || !m->slot ||
      !m->views || !m->act)
    goto oom;
  memcpy(m->widths, widths, (size_t)(L + 1) * sizeof(int));
  int hidden = 0;
  for (int i = 1; i <= L; ++i) {
    if (!(m->act[i] = alloc_rows(m, B, widths[i]))) goto oom;
    if (i < L && widths[i] > hidden) hidden = widths[i];
  }
  if (!(m->dlogits = alloc_rows(m, B, widths[L]))) goto oom;
  /* Only hidden layers need a dinp: layer 0's input gradient is never used. */
  for (int k = 0; k < 2 && hidden > 0; ++k)
    if (!(m->scratch[k] = alloc_rows(m, B, hidden))) goto oom;
  return FSDP_SUCCESS;
oom:
  return fsdp_error(FSDP_ERR_OUT_OF_MEMORY,
                    "mlp: out of memory for activations of %d layers at max_batch %d", L, B);
}

/* Layer i's two tensors, names kept in `names` until registered. */
static void layer_descs(const struct fsdp_mlp *m, int i, fsdp_tensor_desc_t *t, char names[2][48]) {
  snprintf(names[0], 48, "fc.%d.weight", i);
  snprintf(names[1], 48, "fc.%d.bias", i);
  const int in = m->widths[i], out = m->widths[i + 1];
  /* Kaiming-uniform-like, as torch.nn.Linear: U(-1/sqrt(in), 1/sqrt(in)). */
  const float bound = 1.0f / sqrtf((float)in);
  t[0] = (fsdp_tensor_desc_t){names[0], 2, {out, in, 0, 0}, FSDP_INIT_UNIFORM, bound, 0};
  t[1] = (fsdp_tensor_desc_t){names[1], 1, {out, 0, 0, 0}, FSDP_INIT_UNIFORM, bound, 1};
}

/* Registers unit u (0: the root) holding the layers whose layer_unit is u. */
static fsdp_status_t add_unit(struct fsdp_mlp *m, int u, const char *name, const char *kind) {
  fsdp_tensor_desc_t *t = fsdp_alloc((size_t)m->n_layers * 2 * sizeof *t);
  char(*names)[2][48] = fsdp_alloc((size_t)m->n_layers * sizeof *names);
  fsdp_status_t st = FSDP_SUCCESS;
  int n = 0;
  if (!t || !names) st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "mlp: out of host memory");
  for (int i = 0; st == FSDP_SUCCESS && i < m->n_layers; ++i) {
    if (m->layer_unit[i] != u) continue;
    if (!n) m->first[u] = i;
    m->last[u] = i, m->slot[i] = n;
    layer_descs(m, i, &t[n], names[i]);
    n += 2;
  }
  m->units[u] = -1;
  if (st == FSDP_SUCCESS && n) st = fsdp_unit_add(m->engine, name, kind, t, n, &m->units[u]);
  fsdp_free(t);
  fsdp_free(names);
  return st;
}

/* The plan over the layers (modules "fc.<i>", kind "Linear"), then its units. */
static fsdp_status_t plan_units(struct fsdp_mlp *m, const fsdp_plan_opts_t *opts) {
  const int L = m->n_layers;
  fsdp_module_t mods[64] = {{0}};
  char names[64][16];
  if (L > 64) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: %d layers, at most 64", L);
  for (int i = 0; i < L; ++i) {
    snprintf(names[i], sizeof names[i], "fc.%d", i);
    mods[i] = (fsdp_module_t){names[i], "Linear",
                              (size_t)m->widths[i + 1] * (size_t)(m->widths[i] + 1)};
  }
  fsdp_plan_t plan;
  FSDP_TRY(fsdp_plan_create(mods, L, opts, &plan));
  fsdp_status_t st = FSDP_SUCCESS;
  m->n_units = 1 + fsdp_plan_num_units(plan);
  for (int i = 0; i < L; ++i) m->layer_unit[i] = 1 + fsdp_plan_unit_of(plan, i);
  for (int u = 1; u < m->n_units && st == FSDP_SUCCESS; ++u) {
    fsdp_plan_unit_t pu;
    fsdp_plan_unit(plan, u - 1, &pu);
    if (pu.checkpoint)
      st = fsdp_error(FSDP_ERR_UNSUPPORTED, "mlp: unit '%s': the MLP keeps every activation "
                      "(it recomputes none): drop the checkpoint policy", pu.name);
  }
  if (st != FSDP_SUCCESS) goto out;
  FSDP_TRYG(st, add_unit(m, 0, "root", "MLP"), out);
  for (int u = 1; u < m->n_units; ++u) {
    fsdp_plan_unit_t pu;
    fsdp_plan_unit(plan, u - 1, &pu);
    FSDP_TRYG(st, add_unit(m, u, pu.name, pu.kind), out);
  }
out:
  fsdp_plan_destroy(plan);
  return st;
}

fsdp_status_t fsdp_mlp_create(fsdp_engine_t engine, const int *widths, int n_layers,
                              int max_batch, fsdp_mlp_t *mlp) {
  fsdp_plan_opts_t per_layer = FSDP_PLAN_OPTS_INIT;
  per_layer.wrap_kinds = "Linear";
  return fsdp_mlp_create_plan(engine, widths, n_layers, max_batch, &per_layer, mlp);
}

fsdp_status_t fsdp_mlp_create_plan(fsdp_engine_t engine, const int *widths, int n_layers,
                                   int max_batch, const fsdp_plan_opts_t *plan, fsdp_mlp_t *mlp) {
  if (!mlp) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: output handle is NULL");
  FSDP_TRY(check_shape(engine, widths, n_layers, max_batch));
  if (fsdp_engine_config(engine)->device != FSDP_DEVICE_CPU)
    return fsdp_error(FSDP_ERR_UNSUPPORTED,
                      "mlp: the MLP computes on the CPU only; use an engine with config.device "
                      "FSDP_DEVICE_CPU (GPT-2 runs on CUDA)");
  struct fsdp_mlp *m = fsdp_alloc(sizeof *m);
  if (!m) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "mlp: out of memory for the handle");
  m->engine = engine;
  m->n_layers = n_layers;
  m->max_batch = max_batch;
  fsdp_status_t st;
  FSDP_TRYG(st, alloc_buffers(m, widths), fail);
  FSDP_TRYG(st, plan_units(m, plan), fail);
  *mlp = m;
  return FSDP_SUCCESS;
fail:
  fsdp_mlp_destroy(m);
  return st;
}

static fsdp_status_t check_batch(const struct fsdp_mlp *m, const float *x, const int *labels,
                                 int B, int need_labels) {
  if (!m) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: handle is NULL");
  if (!x) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: input x is NULL");
  if (B < 1 || B > m->max_batch)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: batch %d outside [1, max_batch %d]", B,
                      m->max_batch);
  if (!need_labels) return FSDP_SUCCESS;
  if (!labels) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: labels is NULL");
  const int classes = m->widths[m->n_layers];
  for (int b = 0; b < B; ++b)
    if (labels[b] < 0 || labels[b] >= classes)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: labels[%d] = %d outside [0, %d)", b,
                        labels[b], classes);
  return FSDP_SUCCESS;
}

static const float *layer_input(const struct fsdp_mlp *m, int i) {
  return i == 0 ? m->x : m->act[i];
}

/* Acquires (at_start) or releases layer i's unit where the pass enters or
 * leaves it; the root is the caller's. */
static fsdp_status_t edge(struct fsdp_mlp *m, int i, fsdp_pass_t pass, int at_start) {
  const int u = m->layer_unit[i];
  if (u == 0) return FSDP_SUCCESS;
  const int enter = pass == FSDP_FORWARD ? m->first[u] : m->last[u];
  const int leave = pass == FSDP_FORWARD ? m->last[u] : m->first[u];
  if (at_start && i == enter) return fsdp_unit_acquire(m->engine, m->units[u], pass, &m->views[u]);
  if (!at_start && i == leave) return fsdp_unit_release(m->engine, m->units[u], pass);
  return FSDP_SUCCESS;
}

static fsdp_status_t root(struct fsdp_mlp *m, fsdp_pass_t pass, int acquire) {
  if (m->units[0] < 0) return FSDP_SUCCESS;
  return acquire ? fsdp_unit_acquire(m->engine, m->units[0], pass, &m->views[0])
                 : fsdp_unit_release(m->engine, m->units[0], pass);
}

/* Leaves the logits in act[n_layers]. */
static fsdp_status_t forward(struct fsdp_mlp *m, const float *x, int B) {
  const int L = m->n_layers;
  m->x = x;
  FSDP_TRY(root(m, FSDP_FORWARD, 1));
  for (int i = 0; i < L; ++i) {
    FSDP_TRY(edge(m, i, FSDP_FORWARD, 1));
    const fsdp_view_t *v = &m->views[m->layer_unit[i]];
    fsdp_linear_forward(m->act[i + 1], layer_input(m, i), v->param[m->slot[i]],
                        v->param[m->slot[i] + 1], B, m->widths[i], m->widths[i + 1]);
    FSDP_TRY(edge(m, i, FSDP_FORWARD, 0));
    /* In place: ReLU's backward needs only its output. */
    if (i + 1 < L)
      fsdp_relu_forward(m->act[i + 1], m->act[i + 1], (size_t)B * (size_t)m->widths[i + 1]);
  }
  return root(m, FSDP_FORWARD, 0);
}

/* Layer i's backward from dout; writes d(layer i input) into dinp unless i == 0. */
static fsdp_status_t backward_layer(struct fsdp_mlp *m, int i, const float *dout, float *dinp,
                                    int B) {
  const int C = m->widths[i], OC = m->widths[i + 1];
  if (i > 0) memset(dinp, 0, (size_t)B * (size_t)C * sizeof(float));
  FSDP_TRY(edge(m, i, FSDP_BACKWARD, 1));
  const fsdp_view_t *v = &m->views[m->layer_unit[i]];
  fsdp_linear_backward(i > 0 ? dinp : NULL, v->grad[m->slot[i]], v->grad[m->slot[i] + 1], dout,
                       layer_input(m, i), v->param[m->slot[i]], B, C, OC);
  return edge(m, i, FSDP_BACKWARD, 0);
}

static fsdp_status_t backward(struct fsdp_mlp *m, int B) {
  float *dinp = m->scratch[0], *dpre = m->scratch[1];
  const float *dout = m->dlogits;
  FSDP_TRY(root(m, FSDP_BACKWARD, 1));
  for (int i = m->n_layers - 1; i >= 0; --i) {
    FSDP_TRY(backward_layer(m, i, dout, dinp, B));
    if (i == 0) break;
    /* Through the ReLU that produced act[i], after release so that the
     * gradient reduction of unit i overlaps it. */
    const size_t n = (size_t)B * (size_t)m->widths[i];
    memset(dpre, 0, n * sizeof(float));
    fsdp_relu_backward(dpre, m->act[i], dinp, n);
    dout = dpre;
  }
  return root(m, FSDP_BACKWARD, 0);
}

fsdp_status_t fsdp_mlp_forward_backward(fsdp_mlp_t m, const float *x, const int *labels, int B,
                                        float loss_scale, double *loss_sum) {
  FSDP_TRY(check_batch(m, x, labels, B, 1));
  FSDP_TRY(forward(m, x, B));
  double loss = fsdp_softmax_xent(m->dlogits, m->act[m->n_layers], labels, B,
                                  m->widths[m->n_layers], loss_scale);
  FSDP_TRY(backward(m, B));
  if (loss_sum) *loss_sum = loss;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_mlp_predict(fsdp_mlp_t m, const float *x, const int *labels, int B, int *pred,
                               double *loss_sum) {
  FSDP_TRY(check_batch(m, x, labels, B, loss_sum != NULL));
  if (!pred) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: pred is NULL");
  FSDP_TRY(forward(m, x, B));
  const int V = m->widths[m->n_layers];
  const float *logits = m->act[m->n_layers];
  for (int b = 0; b < B; ++b) {
    const float *row = logits + (size_t)b * V;
    int best = 0;
    for (int j = 1; j < V; ++j)
      if (row[j] > row[best]) best = j;
    pred[b] = best;
  }
  if (loss_sum) *loss_sum = fsdp_softmax_xent(NULL, logits, labels, B, V, 1.0f);
  return FSDP_SUCCESS;
}

size_t fsdp_mlp_activation_bytes(fsdp_mlp_t m) { return m ? m->act_bytes : 0; }
