/* tests/interop/gpt2_logits.c — fsdp's side of the Hugging Face interop test:
 * loads a GPT-2 checkpoint at one rank and writes the logits of the given
 * tokens, so hf_interop.py compares them with transformers'.
 * usage: gpt2_logits CKPT PRESET TOKENS.i32 B T OUT.f32
 * The shape comes from the checkpoint's trainer state (gpt2.*, which import
 * and fsdp-train write), else from PRESET. TOKENS.i32: B*T int32; OUT.f32:
 * B*T*V float32 (the loss is computed from them by the script). */
#include <stdio.h>
#include <stdlib.h>

#include "fsdp/fsdp.h"

static int shape(const char *preset, const fsdp_ckpt_meta_t *meta, fsdp_gpt2_config_t *c) {
  if (fsdp_gpt2_preset(preset, c)) return -1;
  int *f[] = {&c->n_layer, &c->n_head, &c->n_embd, &c->block_size, &c->vocab_size};
  const char *k[] = {"gpt2.n_layer", "gpt2.n_head", "gpt2.n_embd", "gpt2.block_size",
                     "gpt2.vocab_size"};
  for (int i = 0; i < 5; i++) {
    int64_t v;
    if (fsdp_ckpt_meta_get(meta, k[i], &v) == FSDP_SUCCESS) *f[i] = (int)v;
  }
  return 0;
}

static int read_meta(const char *ckpt, fsdp_ckpt_meta_t *meta) {
  fsdp_ckpt_t c;
  fsdp_ckpt_info_t in;
  if (fsdp_ckpt_open(ckpt, &c) || fsdp_ckpt_info(c, &in)) return -1;
  *meta = *in.meta;
  fsdp_ckpt_close(c);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 7) return fputs("usage: gpt2_logits CKPT PRESET TOKENS.i32 B T OUT.f32\n", stderr), 2;
  int B = atoi(argv[4]), T = atoi(argv[5]);
  fsdp_ckpt_meta_t meta;
  fsdp_gpt2_config_t c;
  fsdp_world_t world;
  fsdp_engine_t eng;
  fsdp_gpt2_t gpt;
  fsdp_config_t cfg = FSDP_CONFIG_INIT;
  fsdp_gpt2_opts_t go = {.wrap_kinds = "GPT2Block", .max_batch = B, .max_T = T};
  int *tok = malloc(sizeof(int) * (size_t)B * T);
  FILE *f = fopen(argv[3], "rb");
  if (B < 1 || T < 1 || !tok || !f || fread(tok, sizeof(int), (size_t)B * T, f) != (size_t)B * T)
    return fprintf(stderr, "gpt2_logits: cannot read %d tokens from %s\n", B * T, argv[3]), 1;
  fclose(f);
  const float *logits;
  if (read_meta(argv[1], &meta) || shape(argv[2], &meta, &c) || fsdp_world_init(&world, NULL) ||
      fsdp_engine_create(world, &cfg, &eng) || fsdp_gpt2_create(eng, &c, &go, &gpt) ||
      fsdp_engine_materialize(eng, 1) || fsdp_ckpt_load(eng, argv[1], NULL, NULL, NULL, 0) ||
      fsdp_gpt2_forward(gpt, tok, NULL, B, T, NULL, &logits))
    return fprintf(stderr, "gpt2_logits: %s\n", fsdp_last_error()), 1;
  f = fopen(argv[6], "wb");
  size_t n = (size_t)B * T * c.vocab_size;
  if (!f || fwrite(logits, sizeof(float), n, f) != n || fclose(f))
    return fprintf(stderr, "gpt2_logits: cannot write %s\n", argv[6]), 1;
  printf("gpt2_logits: %d x %d tokens, vocabulary %d, %d layers, %d heads\n", B, T, c.vocab_size,
         c.n_layer, c.n_head);
  fsdp_gpt2_destroy(gpt);
  fsdp_engine_destroy(eng);
  fsdp_world_destroy(world);
  free(tok);
  return 0;
}
