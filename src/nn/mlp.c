/* src/nn/mlp.c — a multi-layer perceptron written only against the public
 * engine API and the compute table (src/backend/compute.h), so it runs on the
 * engine's device, CPU or CUDA: its layers cut into units by a wrap policy
 * (fsdp/plan.h; one unit per layer by default), ReLU between layers, softmax
 * cross-entropy on the logits. It computes in f32. The handle owns
 * activations (in the engine's device memory), never parameters. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/compute.h"
#include "core/internal.h"
#include "fsdp/nn.h"

struct fsdp_mlp {
  fsdp_engine_t engine;
  const fsdp_compute_ops_t *ops; /* the engine device's kernels */
  fsdp_stream_t s;               /* the engine's compute stream */
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
  /* All in the device's memory. act[i + 1] is layer i's output: post-ReLU
   * for hidden layers (ReLU's backward needs only its output), logits for
   * the last, overwritten by their gradient (the table's xent). act[0] is
   * layer 0's input: the caller's x on the CPU, a copy of it on CUDA. */
  float **act;        /* (n_layers + 1) of (max_batch, widths[i]) */
  float *x_dev;       /* (max_batch, widths[0]) CUDA only: x staged */
  int *labels;        /* (max_batch) the labels staged (CUDA) or the caller's (CPU) */
  int *labels_dev;    /* (max_batch) CUDA only */
  double *losses;     /* (max_batch) each row's loss, device memory */
  double *losses_host; /* (max_batch) CUDA only: their copy */
  float *logits_host; /* (max_batch, classes) CUDA only: predict's copy */
  /* (max_batch, widest hidden layer) each: a layer's d(input), taken back
   * through the ReLU below it in place, is the next layer's dout; the two
   * alternate. */
  float *scratch[2];
  void *colsum; /* ops->colsum_scratch_bytes(widest layer output): the bias gradients' */
  size_t act_bytes;
};

static int on_cuda(const struct fsdp_mlp *m) { return m->ops->device == FSDP_DEVICE_CUDA; }

/* Device memory of the engine's kind, counted as activations. */
static fsdp_status_t alloc_dev(struct fsdp_mlp *m, size_t bytes, void *out) {
  void *p = NULL;
  FSDP_TRY(fsdp_device_alloc(m->ops->device, bytes ? bytes : 1, &p));
  m->act_bytes += bytes;
  memcpy(out, &p, sizeof p);
  return FSDP_SUCCESS;
}

static fsdp_status_t alloc_rows(struct fsdp_mlp *m, int rows, int cols, size_t esize, void *out) {
  return alloc_dev(m, (size_t)rows * (size_t)cols * esize, out);
}

void fsdp_mlp_destroy(fsdp_mlp_t m) {
  if (!m) return;
  const fsdp_device_kind_t kind = m->ops->device;
  if (m->act)
    for (int i = 1; i <= m->n_layers; ++i) fsdp_device_free(kind, m->act[i]);
  fsdp_free(m->act);
  fsdp_device_free(kind, m->x_dev);
  fsdp_device_free(kind, m->labels_dev);
  fsdp_device_free(kind, m->losses);
  fsdp_free(m->losses_host);
  fsdp_free(m->logits_host);
  fsdp_device_free(kind, m->scratch[0]);
  fsdp_device_free(kind, m->scratch[1]);
  fsdp_device_free(kind, m->colsum);
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
  memset(m->act, 0, (size_t)(L + 1) * sizeof(float *));
  int hidden = 0, widest = 0;
  for (int i = 1; i <= L; ++i) {
    FSDP_TRY(alloc_rows(m, B, widths[i], sizeof(float), &m->act[i]));
    if (i < L && widths[i] > hidden) hidden = widths[i];
    if (widths[i] > widest) widest = widths[i];
  }
  const size_t colsum = m->ops->colsum_scratch_bytes(widest);
  if (colsum) FSDP_TRY(alloc_dev(m, colsum, &m->colsum));
  FSDP_TRY(alloc_rows(m, B, 1, sizeof(double), &m->losses));
  if (on_cuda(m)) {
    FSDP_TRY(alloc_rows(m, B, widths[0], sizeof(float), &m->x_dev));
    FSDP_TRY(alloc_rows(m, B, 1, sizeof(int), &m->labels_dev));
    m->losses_host = fsdp_alloc((size_t)B * sizeof(double));
    m->logits_host = fsdp_alloc((size_t)B * (size_t)widths[L] * sizeof(float));
    if (!m->losses_host || !m->logits_host) goto oom;
  }
  /* Only hidden layers need a dinp: layer 0's input gradient is never used. */
  for (int k = 0; k < 2 && hidden > 0; ++k)
    FSDP_TRY(alloc_rows(m, B, hidden, sizeof(float), &m->scratch[k]));
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
  const fsdp_config_t *cfg = fsdp_engine_config(engine);
  const fsdp_compute_ops_t *ops = fsdp_compute_ops(cfg->device);
  if (!ops)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "mlp: no kernels for the engine's device %d (built "
                      "without CUDA?)", (int)cfg->device);
  if (cfg->device == FSDP_DEVICE_CUDA && cfg->param_dtype != FSDP_F32)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "mlp: the MLP computes in f32; on CUDA it needs "
                      "config.param_dtype FSDP_F32, not %s", fsdp_dtype_name(cfg->param_dtype));
  struct fsdp_mlp *m = fsdp_alloc(sizeof *m);
  if (!m) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "mlp: out of memory for the handle");
  memset(m, 0, sizeof *m);
  m->ops = ops;
  m->s = fsdp_engine_stream(engine);
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

/* Acquires unit u's view for pass; the MLP computes in f32 (a unit given
 * another param_dtype on CUDA is refused, naming it). */
static fsdp_status_t acquire(struct fsdp_mlp *m, int u, fsdp_pass_t pass) {
  FSDP_TRY(fsdp_unit_acquire(m->engine, m->units[u], pass, &m->views[u]));
  if (m->views[u].dtype != FSDP_F32)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "mlp: unit %d is gathered in %s; the MLP computes "
                      "in f32 (param_dtype FSDP_F32)", u, fsdp_dtype_name(m->views[u].dtype));
  return FSDP_SUCCESS;
}

/* Acquires (at_start) or releases layer i's unit where the pass enters or
 * leaves it; the root is the caller's. */
static fsdp_status_t edge(struct fsdp_mlp *m, int i, fsdp_pass_t pass, int at_start) {
  const int u = m->layer_unit[i];
  if (u == 0) return FSDP_SUCCESS;
  const int enter = pass == FSDP_FORWARD ? m->first[u] : m->last[u];
  const int leave = pass == FSDP_FORWARD ? m->last[u] : m->first[u];
  if (at_start && i == enter) return acquire(m, u, pass);
  if (!at_start && i == leave) return fsdp_unit_release(m->engine, m->units[u], pass);
  return FSDP_SUCCESS;
}

static fsdp_status_t root(struct fsdp_mlp *m, fsdp_pass_t pass, int acquire_it) {
  if (m->units[0] < 0) return FSDP_SUCCESS;
  return acquire_it ? acquire(m, 0, pass) : fsdp_unit_release(m->engine, m->units[0], pass);
}

/* Puts the batch where the kernels read it: on CUDA, copied to the device
 * on the compute stream (labels too when given); on the CPU, the caller's. */
static fsdp_status_t stage(struct fsdp_mlp *m, const float *x, const int *labels, int B) {
  if (!on_cuda(m)) {
    m->act[0] = (float *)x; /* read only: layer 0's input */
    m->labels = (int *)labels;
    return FSDP_SUCCESS;
  }
  m->act[0] = m->x_dev, m->labels = m->labels_dev;
  FSDP_TRY(fsdp_device_copy(m->x_dev, x, (size_t)B * (size_t)m->widths[0] * sizeof(float), m->s));
  if (labels) FSDP_TRY(fsdp_device_copy(m->labels_dev, labels, (size_t)B * sizeof(int), m->s));
  return FSDP_SUCCESS;
}

/* Leaves the logits in act[n_layers]. */
static fsdp_status_t forward(struct fsdp_mlp *m, int B) {
  const int L = m->n_layers;
  FSDP_TRY(root(m, FSDP_FORWARD, 1));
  for (int i = 0; i < L; ++i) {
    FSDP_TRY(edge(m, i, FSDP_FORWARD, 1));
    const fsdp_view_t *v = &m->views[m->layer_unit[i]];
    FSDP_TRY(m->ops->matmul_forward(&(fsdp_matmul_forward_args_t){
                                        .dt = FSDP_F32, .out = m->act[i + 1], .inp = m->act[i],
                                        .weight = v->param[m->slot[i]],
                                        .bias = v->param[m->slot[i] + 1], .B = B,
                                        .C = m->widths[i], .OC = m->widths[i + 1],
                                        .weight_out_in = 1},
                                    m->s));
    FSDP_TRY(edge(m, i, FSDP_FORWARD, 0));
    /* In place: ReLU's backward needs only its output. */
    if (i + 1 < L)
      FSDP_TRY(m->ops->relu_forward(&(fsdp_relu_forward_args_t){
                                        .dt = FSDP_F32, .x = m->act[i + 1],
                                        .n = (size_t)B * (size_t)m->widths[i + 1]},
                                    m->s));
  }
  return root(m, FSDP_FORWARD, 0);
}

/* Layer i's backward from dout; writes d(layer i input) into dinp unless i == 0. */
static fsdp_status_t backward_layer(struct fsdp_mlp *m, int i, const float *dout, float *dinp,
                                    int B) {
  FSDP_TRY(edge(m, i, FSDP_BACKWARD, 1));
  const fsdp_view_t *v = &m->views[m->layer_unit[i]];
  FSDP_TRY(m->ops->matmul_backward(&(fsdp_matmul_backward_args_t){
                                       .dt = FSDP_F32, .dinp = i > 0 ? dinp : NULL,
                                       .dweight = v->grad[m->slot[i]],
                                       .dbias = v->grad[m->slot[i] + 1], .scratch = m->colsum,
                                       .dout = dout,
                                       .inp = m->act[i], .weight = v->param[m->slot[i]], .B = B,
                                       .C = m->widths[i], .OC = m->widths[i + 1],
                                       .weight_out_in = 1},
                                   m->s));
  return edge(m, i, FSDP_BACKWARD, 0);
}

/* From the logits' gradient in act[n_layers]. */
static fsdp_status_t backward(struct fsdp_mlp *m, int B) {
  const float *dout = m->act[m->n_layers];
  FSDP_TRY(root(m, FSDP_BACKWARD, 1));
  for (int i = m->n_layers - 1; i >= 0; --i) {
    float *dinp = m->scratch[i & 1];
    FSDP_TRY(backward_layer(m, i, dout, dinp, B));
    if (i == 0) break;
    /* Through the ReLU that produced act[i], after release so that the
     * gradient reduction of unit i overlaps it. */
    FSDP_TRY(m->ops->relu_backward(&(fsdp_relu_backward_args_t){
                                       .dt = FSDP_F32, .dx = dinp, .out = m->act[i],
                                       .n = (size_t)B * (size_t)m->widths[i]},
                                   m->s));
    dout = dinp;
  }
  return root(m, FSDP_BACKWARD, 0);
}

/* Cross-entropy of the logits in act[n_layers] against the staged labels
 * (grad: their gradient written over them); *loss_sum = the rows' losses
 * summed in order on the host. */
static fsdp_status_t xent(struct fsdp_mlp *m, int B, float scale, int grad, double *loss_sum) {
  const int V = m->widths[m->n_layers];
  FSDP_TRY(m->ops->xent(&(fsdp_xent_args_t){.dt = FSDP_F32, .logits = m->act[m->n_layers],
                                            .ld = V, .losses = m->losses, .targets = m->labels,
                                            .B = B, .V = V, .scale = scale, .grad = grad},
                        m->s));
  const double *losses = m->losses;
  if (on_cuda(m)) {
    FSDP_TRY(fsdp_device_copy(m->losses_host, m->losses, (size_t)B * sizeof(double), m->s));
    FSDP_TRY(fsdp_stream_synchronize(m->s));
    losses = m->losses_host;
  }
  double sum = 0.0;
  for (int b = 0; b < B; ++b) sum += losses[b];
  *loss_sum = sum;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_mlp_forward_backward(fsdp_mlp_t m, const float *x, const int *labels, int B,
                                        float loss_scale, double *loss_sum) {
  FSDP_TRY(check_batch(m, x, labels, B, 1));
  FSDP_TRY(stage(m, x, labels, B));
  FSDP_TRY(forward(m, B));
  double loss;
  FSDP_TRY(xent(m, B, loss_scale, 1, &loss));
  FSDP_TRY(backward(m, B));
  if (loss_sum) *loss_sum = loss;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_mlp_predict(fsdp_mlp_t m, const float *x, const int *labels, int B, int *pred,
                               double *loss_sum) {
  FSDP_TRY(check_batch(m, x, labels, B, loss_sum != NULL));
  if (!pred) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "mlp: pred is NULL");
  FSDP_TRY(stage(m, x, loss_sum ? labels : NULL, B));
  FSDP_TRY(forward(m, B));
  const int V = m->widths[m->n_layers];
  const float *logits = m->act[m->n_layers];
  if (on_cuda(m)) {
    FSDP_TRY(fsdp_device_copy(m->logits_host, logits, (size_t)B * (size_t)V * sizeof(float), m->s));
    FSDP_TRY(fsdp_stream_synchronize(m->s));
    logits = m->logits_host;
  }
  for (int b = 0; b < B; ++b) {
    const float *row = logits + (size_t)b * V;
    int best = 0;
    for (int j = 1; j < V; ++j)
      if (row[j] > row[best]) best = j;
    pred[b] = best;
  }
  return loss_sum ? xent(m, B, 1.0f, 0, loss_sum) : FSDP_SUCCESS;
}

size_t fsdp_mlp_activation_bytes(fsdp_mlp_t m) { return m ? m->act_bytes : 0; }
