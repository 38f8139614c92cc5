/* src/nn/decoder.h — the decoder skeleton GPT-2 and the Llama family share
 * (src/nn/decoder.c): units cut by the wrap policy, the activation arena,
 * the per-unit forward and backward loops with activation checkpointing,
 * the gather/release order, tokens in and losses and logits out, sampling.
 * A model fills a decoder_model_t with its own math (embedding, layer, head,
 * their backward, its tensors and buffers) and embeds a decoder_t first in
 * its handle. Not installed. Dims: B batch, T time, C channels, NH query
 * heads, V vocabulary, L layers. */
#ifndef FSDP_NN_DECODER_H
#define FSDP_NN_DECODER_H

#include "backend/compute.h"
#include "core/internal.h"
#include "fsdp/nn.h"
#include "nn/gpt2_io.h"

struct decoder_unit {
  fsdp_unit_t id;
  int first, count; /* layers [first, first+count); root: unused */
  int checkpoint;
  fsdp_view_t view;
};

typedef struct decoder decoder_t;

/* What a model tells the skeleton. The hooks marked optional may be NULL. */
typedef struct {
  const char *name;         /* "GPT-2": the errors' first word */
  const char *root_kind;    /* the root unit's kind ("GPT2Model") */
  const char *layer_kind;   /* a layer's module and unit kind ("GPT2Block") */
  const char *layer_prefix; /* a layer's module name before its index ("h.") */
  int layer_tensors;        /* tensors per layer */
  int root_tensors;         /* the root's tensors besides its layers, at most */
  int check_complete;       /* refuse a compute table missing any kernel */
  size_t acts_size;         /* bytes of the model's per-layer activation struct */
  size_t (*layer_params)(const decoder_t *d);
  fsdp_status_t (*layer_descs)(decoder_t *d, int l, fsdp_tensor_desc_t *out);
  /* The root's own tensors before (tail 0) or after (tail 1) the layers it
   * keeps: appended at out[*n], *n advanced. */
  fsdp_status_t (*root_descs)(decoder_t *d, int tail, fsdp_tensor_desc_t *out, int *n);
  /* After ops, dt, s, align and esize are set, before any device buffer:
   * the layout (ldv), what attention keeps, checks of the device's room. */
  fsdp_status_t (*prepare)(decoder_t *d);
  fsdp_status_t (*buffers)(decoder_t *d); /* optional: the model's own device buffers */
  void (*fini)(decoder_t *d);             /* optional: frees what buffers made */
  /* Dry run of the carving at d's shape (fsdp_gpt2_memory_t's fields). */
  void (*arena_parts)(const decoder_t *d, fsdp_gpt2_memory_t *m);
  void (*acts_carve)(const decoder_t *d, void *acts, char *base, size_t *at);
  void (*common_carve)(decoder_t *d, char *base, size_t *at);
  size_t (*extra_bytes)(const decoder_t *d); /* held besides the arena, in act_bytes */
  /* optional: refuse an arena of `layers` layers before it is allocated */
  fsdp_status_t (*check_arena)(const decoder_t *d, int layers, const fsdp_gpt2_memory_t *m);
  /* optional: what the kernels assume of a just-acquired unit's view */
  fsdp_status_t (*check_view)(const decoder_t *d, const struct decoder_unit *u);
  /* Tokens (d->tok) to layer 0's input; root's parameters p. */
  fsdp_status_t (*embed_forward)(decoder_t *d, float *const *p, int B, int T);
  /* One layer: prev the previous layer's activations when x holds only its
   * last branch (completed here), NULL when x is whole. */
  fsdp_status_t (*layer_forward)(const decoder_t *d, float *const *p, void *acts,
                                 const void *prev, void *x, void *out, int B, int T);
  /* The last layer's output to the logits. */
  fsdp_status_t (*head_forward)(decoder_t *d, float *const *p, int B, int T);
  /* The logits' gradient (over them) to d(last output), left in the model's
   * residual gradient buffer for the layers. */
  fsdp_status_t (*head_backward)(decoder_t *d, float *const *p, float *const *dp, int B, int T);
  fsdp_status_t (*layer_backward)(decoder_t *d, float *const *p, float *const *dp,
                                  const void *acts, const void *x, int B, int T);
  fsdp_status_t (*embed_backward)(decoder_t *d, float *const *dp, int B, int T);
} decoder_model_t;

struct decoder {
  const decoder_model_t *m;
  fsdp_engine_t eng;
  int L, C, NH, V;     /* layers, width, query heads, vocabulary */
  int maxB, maxT;
  int wide;            /* the widest product output: the column sums' width */
  struct decoder_unit *units; /* units[0] is the root */
  int n_units;
  int *layer_unit;     /* (L) index into units */
  int *layer_base;     /* (L) the layer's first tensor in its unit's view */
  char **names;        /* tensor names, owned */
  int n_names;

  const fsdp_compute_ops_t *ops; /* the kernels: the engine device's compute table */
  fsdp_dtype_t dt;     /* activations, and parameters in the views */
  fsdp_stream_t s;     /* the engine's compute stream, which the kernels run on */
  gpt2_io_t *io;       /* tokens in, losses and logits out */
  void *att_scratch;   /* ops->attention_scratch_bytes */
  void *colsum;        /* ops->colsum_scratch_bytes(wide) */
  size_t align;        /* bytes each buffer in the arena is rounded up to */
  size_t esize;        /* bytes per activation element */
  int ldv;             /* the logits' row stride: V, or V padded to a multiple of 128 */
  void *arena;         /* every activation buffer, in the backend's memory */
  char *acts;          /* (L) the model's activation structs, m->acts_size apart: saved,
                          or pointing into scratch for checkpointed units */
  char *scratch;       /* (the largest checkpointed unit's layers) */
  void *xs;            /* (L+1, B,T,C): every layer's input and the last output */
  void *logits, *dlogits; /* (B,T,ldv); dlogits == logits when written over them */
  const int *tok, *tgt;   /* the micro-batch's tokens and targets as the kernels see them */
  float *row;          /* (V) host: the logits row sampling draws from */
  float *logits_host;  /* (B,T,V) host: the forward's logits, on first ask */
  size_t act_bytes, act_bytes_full;
  int ckpt_auto;       /* opts' checkpoint_auto */
  size_t budget;       /* its budget (after create: the one used, 0 for none) */
  size_t reserved;     /* opts' memory_reserved */
};

/* A kernel-table call inside the scope of its class (fsdp/profile.h), so that
 * fsdp-bench --kernel-profile times each class; with profiling off a scope is
 * one branch in the engine. The scope ends whether or not the call failed. */
static inline fsdp_status_t decoder_kc_end(fsdp_engine_t e, fsdp_kclass_t k, fsdp_status_t st) {
  fsdp_status_t end = fsdp_engine_kclass_end(e, k);
  return st != FSDP_SUCCESS ? st : end;
}
#define KC(d, cls, call)                                                \
  do {                                                                  \
    FSDP_TRY(fsdp_engine_kclass_begin((d)->eng, FSDP_KC_##cls));        \
    FSDP_TRY(decoder_kc_end((d)->eng, FSDP_KC_##cls, (call)));          \
  } while (0)

/* Bytes a buffer of n elements takes in the arena. */
static inline size_t decoder_span(const decoder_t *d, size_t n, size_t esize) {
  return (n * esize + d->align - 1) / d->align * d->align;
}
/* The next buffer at byte offset *at of the arena `base`; a NULL base only
 * counts (a dry run sizes the arena with the code that carves it). */
static inline void *decoder_take(const decoder_t *d, char *base, size_t *at, size_t n,
                                 size_t esize) {
  void *p = base ? base + *at : NULL;
  *at += decoder_span(d, n, esize);
  return p;
}
/* Layer l's input at micro-batch B x T (l = L: the last layer's output). */
static inline void *decoder_x(const decoder_t *d, int l, int B, int T) {
  size_t n = (size_t)B * (size_t)T * (size_t)d->C;
  return (char *)d->xs + (size_t)l * decoder_span(d, n, d->esize);
}
static inline void *decoder_acts(const decoder_t *d, int l) {
  return d->acts + (size_t)l * d->m->acts_size;
}
/* Bytes of the L + 1 layer inputs at d's shape (arena_parts' `inputs`). */
static inline size_t decoder_inputs_bytes(const decoder_t *d) {
  return (size_t)(d->L + 1) * decoder_span(d, (size_t)d->maxB * d->maxT * d->C, d->esize);
}

/* Appends a copy of name to d's names, for a tensor descriptor. */
fsdp_status_t decoder_add_name(decoder_t *d, const char *name, fsdp_tensor_desc_t *desc);
/* Layers whose activations the arena holds at once: the saved ones and the
 * largest checkpointed unit's recompute scratch (*maxk layers). */
int decoder_arena_layers(const decoder_t *d, int *maxk);

/* checkpoint_auto: marks the first k layers' units checkpointed (k from
 * fsdp_checkpoint_auto); a no-op without it. Called by the models' prepare,
 * once the layout and the kernels are known and before any fit check. */
fsdp_status_t decoder_checkpoint_auto(decoder_t *d);
/* Layers whose units recompute their activations. */
int decoder_checkpointed(const decoder_t *d);
/* 1 when layer l's unit is checkpointed, 0 when not, -1 outside [0, L). */
int decoder_layer_checkpointed(const decoder_t *d, int l);

/* Create's body, with d->m, eng, L, C, NH, V, maxB, maxT and wide set (the
 * rest zero): units planned and registered, the backend picked, buffers and
 * the arena allocated. On failure the caller calls decoder_fini. */
fsdp_status_t decoder_init(decoder_t *d, const fsdp_gpt2_opts_t *o);
/* Frees what decoder_init made (the handle itself is the caller's). */
void decoder_fini(decoder_t *d);

/* fsdp_gpt2_forward_backward, fsdp_gpt2_forward and fsdp_gpt2_sample (fsdp/nn.h)
 * for any decoder; errors name d->m->name. */
fsdp_status_t decoder_forward_backward(decoder_t *d, const int *tokens, const int *targets,
                                       int B, int T, float loss_scale, double *loss_sum);
fsdp_status_t decoder_forward(decoder_t *d, const int *tokens, const int *targets, int B, int T,
                              double *loss_sum, const float **logits);
fsdp_status_t decoder_sample(decoder_t *d, const char *who, const int *prompt, int n_prompt,
                             int n_new, const fsdp_gpt2_sampling_t *how, int *out);

#endif
