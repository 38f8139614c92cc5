/* fsdp/plan.h — wrap and activation-checkpointing policies: which of a model's
 * modules become engine units, and which units recompute their activations.
 *
 * A model describes its modules (name, kind, parameter count) in forward
 * order; a policy turns them into a plan: units of consecutive modules, each
 * registered by the model with fsdp_unit_add(_opts); the modules no unit takes
 * stay in the model's root unit (GPT-2 keeps wte, wpe and ln_f there without
 * listing them). Policies, as in the systems this copies:
 *   wrap_kinds       a unit per module of these kinds (TorchAcc's wrap_layer_cls,
 *                    PyTorch's ModuleWrapPolicy): "GPT2Block"
 *   wrap_names       a unit per module whose name matches one of these wildcard
 *                    patterns: "h.*", "fc.[01]"  (may be given with wrap_kinds)
 *   wrap_min_params  consecutive modules grouped into units of at least this many
 *                    parameters; a smaller tail stays in the root (PyTorch's
 *                    size_based_auto_wrap_policy)
 *   wrap_fn          the caller decides, module by module (auto_wrapper_callable)
 * and, for activation checkpointing, checkpoint_kinds / checkpoint_names: a
 * unit is checkpointed when one of its modules matches.
 *
 * Wildcards (fsdp_pattern_match): '*' any run of characters (dots included, so
 * "h.*" matches "h.3" and "h.3.attn.c_attn.weight"), '?' one character,
 * "[0-3]" one of a set; lists are comma-separated (spaces around items are
 * dropped; an item may be of any length).
 *
 * Ownership: fsdp_plan_create copies what it needs from modules and opts; unit
 * names are owned by the plan until fsdp_plan_destroy. Thread safety: a plan is
 * immutable once made; distinct calls are independent. Errors:
 * FSDP_ERR_INVALID_ARGUMENT naming the policy field and the module or pattern
 * (a kind or pattern that matches no module, two exclusive policies, a callback
 * answer that cannot be followed, a checkpointed module left in the root). */
#ifndef FSDP_PLAN_H
#define FSDP_PLAN_H

#include <stddef.h>

#include "fsdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *name; /* unique among the modules: "h.3" */
  const char *kind; /* a free label: "GPT2Block"; NULL means "" */
  size_t numel;     /* parameters the module holds */
} fsdp_module_t;

/* What a wrap callback answers for one module. */
typedef enum {
  FSDP_WRAP_SKIP = 0, /* not wrapped: the module stays in the root unit */
  FSDP_WRAP_UNIT,     /* the module begins a unit */
  FSDP_WRAP_JOIN,     /* the module joins the unit of the module before it, which
                         must be wrapped */
  FSDP_WRAP_FAIL      /* the callback refuses the module (its own rules conflict):
                         fsdp_plan_create fails, FSDP_ERR_INVALID_ARGUMENT naming
                         the module; the callback keeps its reasons for its caller */
} fsdp_wrap_t;

/* Called once per module, in forward order: modules[index] (of n) is the one
 * to decide; open_numel the parameters of the unit the previous module is in
 * (0 when it stays in the root or index is 0). Runs on the calling thread. */
typedef fsdp_wrap_t (*fsdp_wrap_fn)(void *user, const fsdp_module_t *modules, int n, int index,
                                    size_t open_numel);

/* Start from FSDP_PLAN_OPTS_INIT and set what you need (size/magic/version
 * first, new fields appended: the fsdp_config_t rule). At most one of
 * {wrap_kinds and/or wrap_names}, wrap_min_params, wrap_fn; none: every module
 * stays in the root. */
typedef struct {
  size_t size;                  /* sizeof(fsdp_plan_opts_t) as the caller compiled it */
  unsigned int magic;           /* FSDP_PLAN_OPTS_MAGIC */
  unsigned int version;         /* FSDP_VERSION_CODE of the caller's header */
  const char *wrap_kinds;       /* NULL: comma-separated module kinds, a unit each */
  const char *wrap_names;       /* NULL: comma-separated name patterns, a unit each */
  size_t wrap_min_params;       /* 0 (off): group consecutive modules to at least this */
  fsdp_wrap_fn wrap_fn;         /* NULL: the caller's policy (above) */
  void *wrap_user;              /* NULL: passed to wrap_fn */
  const char *checkpoint_kinds; /* NULL: kinds whose units recompute activations */
  const char *checkpoint_names; /* NULL: name patterns whose units recompute activations */
} fsdp_plan_opts_t;
FSDP_ASSERT_NO_TAIL(fsdp_plan_opts_t, checkpoint_names);

#define FSDP_PLAN_OPTS_MAGIC 0xf5d9b1a1u

#define FSDP_PLAN_OPTS_INIT                                                           \
  {                                                                                   \
    .size = sizeof(fsdp_plan_opts_t), .magic = FSDP_PLAN_OPTS_MAGIC,                  \
    .version = FSDP_VERSION_CODE, .wrap_kinds = NULL, .wrap_names = NULL,             \
    .wrap_min_params = 0, .wrap_fn = NULL, .wrap_user = NULL,                         \
    .checkpoint_kinds = NULL, .checkpoint_names = NULL                                \
  }

typedef struct fsdp_plan *fsdp_plan_t;

/* One unit of a plan: modules [first, first + count). name: the module's for a
 * unit of one, else "<first>-<last index>" when both end in a number after the
 * same prefix ("h.0-3"), else "<first>-<last>"; kind: the first module's. */
typedef struct {
  const char *name;
  const char *kind;
  int first, count;
  size_t numel;
  int checkpoint; /* 1: recompute this unit's activations in backward */
} fsdp_plan_unit_t;

/* Applies opts (NULL: every module in the root) to n modules (n >= 0). */
FSDP_API fsdp_status_t fsdp_plan_create(const fsdp_module_t *modules, int n,
                                        const fsdp_plan_opts_t *opts, fsdp_plan_t *plan);
FSDP_API void fsdp_plan_destroy(fsdp_plan_t plan); /* NULL is ignored */

/* Units in forward order (the root not counted); -1 on a NULL plan. */
FSDP_API int fsdp_plan_num_units(fsdp_plan_t plan);
/* The unit a module is in; -1 when it stays in the root (and on a NULL plan or
 * an index out of range). */
FSDP_API int fsdp_plan_unit_of(fsdp_plan_t plan, int module);
/* Unit u (0 .. num_units - 1); strings owned by the plan. */
FSDP_API fsdp_status_t fsdp_plan_unit(fsdp_plan_t plan, int u, fsdp_plan_unit_t *out);

/* 1 when name matches the wildcard pattern (above), else 0 (NULL: 0). */
FSDP_API int fsdp_pattern_match(const char *pattern, const char *name);

#ifdef __cplusplus
}
#endif
#endif
