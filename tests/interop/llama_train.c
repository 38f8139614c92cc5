/* tests/interop/llama_train.c — llama-interop's trainer: loads a Llama
 * checkpoint (an import), takes STEPS optimizer steps on one fixed batch of
 * bytes and saves the result, so that llama_interop.py can hold the update
 * against PyTorch's on the same batch (SGD with lr 1 gives the gradient;
 * AdamW over several steps the whole optimizer). Runs alone or under
 * fsdp-run / mpirun: the batch's B rows are split over the ranks and each
 * rank's mean loss is scaled as fsdp-train scales it.
 * usage: llama_train CKPT DATA B T STEPS sgd|adamw LR WEIGHT_DECAY OUT_DIR
 * (DATA: B*T+1 bytes, inputs tokens [0, B*T), targets shifted by one; norms
 * are out of weight decay, as the model registers them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/fsdp.h"

static int fail(const char *what) {
  fprintf(stderr, "llama_train: %s: %s\n", what, fsdp_last_error());
  return 1;
}

/* The rank's rows of the batch: ids and targets, (micro, T). */
static int read_batch(const char *file, int64_t offset, int64_t micro, int T, int *ids, int *tgt) {
  FILE *f = fopen(file, "rb");
  if (!f) return fprintf(stderr, "llama_train: %s: cannot open\n", file), 1;
  size_t n = (size_t)(micro * T + 1);
  unsigned char *b = malloc(n);
  int ok = b && fseek(f, (long)(offset * T), SEEK_SET) == 0 && fread(b, 1, n, f) == n;
  for (size_t i = 0; ok && i + 1 < n; i++) ids[i] = b[i], tgt[i] = b[i + 1];
  free(b);
  fclose(f);
  return ok ? 0 : (fprintf(stderr, "llama_train: %s: shorter than the batch\n", file), 1);
}

static int train(fsdp_engine_t eng, fsdp_llama_t model, const int *ids, const int *tgt,
                 int64_t micro, int T, int steps) {
  for (int s = 0; s < steps; s++) {
    double loss;
    if (fsdp_llama_forward_backward(model, ids, tgt, (int)micro, T, 1.0f / (float)(micro * T),
                                    &loss))
      return fail("forward_backward");
    if (fsdp_engine_step(eng, NULL)) return fail("step");
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 10) return fputs("usage: llama_train CKPT DATA B T STEPS sgd|adamw LR WD OUT\n", stderr), 2;
  const char *ckpt = argv[1], *data = argv[2], *out = argv[9];
  int B = atoi(argv[3]), T = atoi(argv[4]), steps = atoi(argv[5]);
  fsdp_config_t cfg = FSDP_CONFIG_INIT;
  cfg.optim.kind = !strcmp(argv[6], "sgd") ? FSDP_OPTIM_SGD : FSDP_OPTIM_ADAMW;
  cfg.optim.lr = strtof(argv[7], NULL);
  cfg.optim.weight_decay = strtof(argv[8], NULL);
  fsdp_world_t world = NULL;
  fsdp_engine_t eng = NULL;
  fsdp_llama_t model = NULL;
  fsdp_ckpt_t ck = NULL;
  fsdp_llama_config_t lc;
  int64_t micro, offset;
  int rc = 1, *ids = NULL, *tgt = NULL;
  if (fsdp_world_init(&world, NULL)) return fail("world");
  if (fsdp_ckpt_open(ckpt, &ck) || fsdp_ckpt_llama_config(ck, &lc)) {
    rc = fail(ckpt);
    goto done;
  }
  fsdp_llama_opts_t w = {.wrap_kinds = "LlamaDecoderLayer", .max_batch = B, .max_T = T};
  fsdp_ckpt_load_opts_t lo = FSDP_CKPT_LOAD_OPTS_INIT;
  lo.reset_optim = 1; /* an import holds weights only */
  if (fsdp_engine_create(world, &cfg, &eng) || fsdp_engine_shard_batch(eng, B, &micro, &offset) ||
      fsdp_llama_create(eng, &lc, &w, &model) || fsdp_engine_materialize(eng, 1) ||
      fsdp_ckpt_load(eng, ckpt, &lo, NULL, NULL, 0)) {
    rc = fail("setup");
    goto done;
  }
  ids = malloc((size_t)(micro * T) * sizeof(int));
  tgt = malloc((size_t)(micro * T) * sizeof(int));
  if (!ids || !tgt || read_batch(data, offset, micro, T, ids, tgt) ||
      train(eng, model, ids, tgt, micro, T, steps))
    goto done;
  fsdp_ckpt_save_opts_t so = FSDP_CKPT_SAVE_OPTS_INIT;
  so.llama = &lc;
  rc = fsdp_ckpt_save(eng, out, &so, NULL, 0) ? fail("save") : 0;
done:
  free(ids);
  free(tgt);
  fsdp_llama_destroy(model);
  fsdp_engine_destroy(eng);
  fsdp_ckpt_close(ck);
  fsdp_world_destroy(world);
  return rc;
}
