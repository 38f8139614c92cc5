/* src/tools/fsdp_eval.c — fsdp-eval: loads a GPT-2 or Llama checkpoint at any
 * rank count and scores data, writes logits or samples (eval_run.c). A tool of its
 * own rather than a mode of fsdp-train: it takes no optimizer, schedule or
 * saving flags, holds no optimizer state, and reads the model's shape from
 * the checkpoint instead of from flags. Launch with mpirun -np N or alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/eval.h"
#include "tools/flags.h"

static const char usage_text[] =
    "usage: fsdp-eval --checkpoint PATH [options]   on several ranks: under fsdp-run or mpirun\n"
    "  --checkpoint PATH         a step directory, or a save directory (its latest step)\n"
    "  --data PATH               token file or directory of .bin shards, or text\n"
    "                            (file or directory; default the fortunes)\n"
    "  --split val|train|all     what to score (default val: the last 10%, as fsdp-train)\n"
    "  --tokenizer DIR           vocab.json + merges.txt: bits per byte on token data,\n"
    "                            --prompt text, samples as text\n"
    "scoring\n"
    "  --seq-len T               window length (default: the checkpoint's, else the context)\n"
    "  --global-batch B          windows per forward over all ranks (default 8 x ranks)\n"
    "  --max-windows N           score only the first N windows (default all)\n"
    "  --match-train             fsdp-train's validation estimate instead: its random windows\n"
    "                            (seed, batch, eval batches, T from the checkpoint)\n"
    "  --no-score                skip scoring (logits or sampling only)\n"
    "  --logits K --logits-out FILE.npy   logits of the split's first K positions, float32 (K, V)\n"
    "sampling\n"
    "  --sample N                N new tokens (bytes for a byte model) after the prompt\n"
    "  --prompt TEXT | --prompt-tokens a,b,c   (default <|endoftext|>, or a newline)\n"
    "  --temperature X (0.8)  --top-k K (0: all)  --seed N (1)\n"
    "model and engine\n"
    "  --preset NAME --heads N   for GPT-2 checkpoints that do not record the model's shape\n"
    "                            (a Llama's checkpoint records its configuration)\n"
    "  --strategy zero3|zero2|noshard  --dtype f32|bf16  --device cpu|cuda\n"
    "  --json                    one JSON object per result\n";

static int parse_word(void *ctx, const char *tool, const char *a, const char *v) {
  eval_opts_t *o = ctx;
  static const char *const known[] = {"--strategy", "--preset", "--device", "--dtype",
                                      "--reduce-dtype"};
  (void)tool;
  if (!v) return flags_known(a, known, sizeof known / sizeof known[0]);
  if (!strcmp(a, "--strategy") || !strcmp(a, "--preset")) {
    fsdp_status_t st = !strcmp(a, "--strategy") ? fsdp_strategy_parse(v, &o->cfg.strategy)
                                                : fsdp_gpt2_preset(v, &o->gpt);
    if (st == FSDP_SUCCESS) return o->preset = !strcmp(a, "--preset") ? v : o->preset, 0;
    return fprintf(stderr, "fsdp-eval: %s\n", fsdp_last_error()), -1;
  }
  int taken = flags_config_word("fsdp-eval", a, v, &o->cfg);
  if (taken <= 0) return taken;
  return fprintf(stderr, "fsdp-eval: unknown option '%s' (see --help)\n", a), -1;
}

static int parse(int argc, char **argv, eval_opts_t *o) {
  const flag_t table[] = {
      {"--checkpoint", NULL, FLAG_STR, &o->ckpt}, {"--data", NULL, FLAG_STR, &o->data},
      {"--split", NULL, FLAG_STR, &o->split}, {"--tokenizer", NULL, FLAG_STR, &o->tokenizer},
      {"--seq-len", NULL, FLAG_INT, &o->seq_len},
      {"--global-batch", NULL, FLAG_I64, &o->global_batch},
      {"--max-windows", NULL, FLAG_I64, &o->max_windows},
      {"--match-train", NULL, FLAG_SET, &o->match_train},
      {"--no-score", NULL, FLAG_SET, &o->no_score}, {"--logits", NULL, FLAG_INT, &o->logits_k},
      {"--logits-out", NULL, FLAG_STR, &o->logits_out}, {"--sample", NULL, FLAG_INT, &o->sample},
      {"--prompt", NULL, FLAG_STR, &o->prompt},
      {"--prompt-tokens", NULL, FLAG_STR, &o->prompt_tokens},
      {"--temperature", NULL, FLAG_F32, &o->temperature}, {"--top-k", NULL, FLAG_INT, &o->top_k},
      {"--seed", NULL, FLAG_I64, &o->seed}, {"--heads", NULL, FLAG_INT, &o->gpt.n_head},
      {"--json", NULL, FLAG_SET, &o->json},
  };
  int p = flags_parse("fsdp-eval", usage_text, argc, argv, table, sizeof table / sizeof table[0],
                      parse_word, o);
  if (p) return p;
  if (!o->ckpt) return fprintf(stderr, "fsdp-eval: --checkpoint PATH is required\n"), -1;
  if (strcmp(o->split, "val") && strcmp(o->split, "train") && strcmp(o->split, "all"))
    return fprintf(stderr, "fsdp-eval: --split '%s': use val, train or all\n", o->split), -1;
  if ((o->logits_k > 0) != (o->logits_out != NULL))
    return fprintf(stderr, "fsdp-eval: --logits K and --logits-out FILE go together\n"), -1;
  if (o->prompt && o->prompt_tokens)
    return fprintf(stderr, "fsdp-eval: pass --prompt or --prompt-tokens, not both\n"), -1;
  return 0;
}

/* A Llama: the configuration its manifest records. */
static int llama_from_ckpt(eval_opts_t *o, fsdp_ckpt_t ck) {
  if (fsdp_ckpt_llama_config(ck, &o->llama)) return -1;
  o->is_llama = 1;
  o->gpt.vocab_size = o->llama.vocab_size;
  o->gpt.block_size = o->llama.max_seq_len < FSDP_ATTENTION_MAX_T ? o->llama.max_seq_len
                                                                   : FSDP_ATTENTION_MAX_T;
  return 0;
}

/* The model's shape: the checkpoint's record, else its tensors' shapes with
 * n_head from --preset/--heads. Local (every rank reads the manifest). */
static int model_from_ckpt(evaluator_t *e, eval_opts_t *o) {
  fsdp_ckpt_t ck;
  if (fsdp_ckpt_open(o->ckpt, &ck)) return -1;
  fsdp_ckpt_info_t info;
  if (fsdp_ckpt_info(ck, &info)) return fsdp_ckpt_close(ck), -1;
  e->meta = *info.meta;
  e->step = info.step;
  if (!strcmp(fsdp_ckpt_family(ck), "llama")) {
    int rc = llama_from_ckpt(o, ck);
    fsdp_ckpt_close(ck);
    return rc;
  }
  const char *keys[] = {"gpt2.n_layer", "gpt2.n_head", "gpt2.n_embd", "gpt2.block_size",
                        "gpt2.vocab_size"};
  int *fields[] = {&o->gpt.n_layer, &o->gpt.n_head, &o->gpt.n_embd, &o->gpt.block_size,
                   &o->gpt.vocab_size};
  for (int i = 0; i < 5; i++) {
    int64_t v;
    if (eval_meta(e, keys[i], &v)) *fields[i] = (int)v;
  }
  int layers = 0;
  for (int i = 0; i < info.n_tensors; i++) { /* shapes win: they are what loads */
    fsdp_ckpt_tensor_t t;
    if (fsdp_ckpt_tensor(ck, i, &t)) break;
    if (!strcmp(t.name, "wte")) o->gpt.vocab_size = (int)t.shape[0], o->gpt.n_embd = (int)t.shape[1];
    if (!strcmp(t.name, "wpe")) o->gpt.block_size = (int)t.shape[0];
    if (strstr(t.name, ".ln_1.weight")) layers++;
  }
  o->gpt.n_layer = layers;
  fsdp_ckpt_close(ck);
  if (fsdp_gpt2_config_check(&o->gpt)) {
    if (e->rank == 0)
      fprintf(stderr, "fsdp-eval: %s: %s\nfsdp-eval: this checkpoint does not record the number "
              "of heads: pass --heads N (or --preset NAME)\n", o->ckpt, fsdp_last_error());
    return -2;
  }
  return 0;
}

/* Text or token data, checked against the model's vocabulary. */
static int load_data(evaluator_t *e) {
  const eval_opts_t *o = e->o;
  const char *path = o->data ? o->data : "/usr/share/games/fortunes";
  e->is_tokens = fsdp_tokens_probe(path);
  if (!e->is_tokens) return fsdp_text_load(path, 0.1, &e->text) ? -1 : 0;
  if (fsdp_tokens_load(path, 0.1, &e->toks)) return -1;
  return fsdp_tokens_check_vocab(&e->toks, o->gpt.vocab_size) ? -1 : 0;
}

static int setup(evaluator_t *e, eval_opts_t *o) {
  int rc = model_from_ckpt(e, o);
  if (rc) return rc;
  int64_t v;
  if (!o->seq_len) o->seq_len = eval_meta(e, "seq_len", &v) ? (int)v : o->gpt.block_size;
  e->T = o->seq_len;
  if (o->tokenizer && fsdp_tokenizer_load(o->tokenizer, &e->tok)) return -1;
  if (e->tok && fsdp_tokenizer_vocab_size(e->tok) > o->gpt.vocab_size) {
    if (e->rank == 0)
      fprintf(stderr, "fsdp-eval: %s has %d tokens but the model's vocabulary is %d\n",
              o->tokenizer, fsdp_tokenizer_vocab_size(e->tok), o->gpt.vocab_size);
    return -2;
  }
  if ((!o->no_score || o->logits_k) && load_data(e)) return -1;
  e->have_data = !o->no_score || o->logits_k;
  /* fsdp-train's validation batch when matching it, else --global-batch. */
  e->global_batch = o->global_batch ? o->global_batch : 8 * (int64_t)e->nranks;
  if (o->match_train && !eval_meta(e, "eval_global_batch", &e->global_batch) &&
      !eval_meta(e, "global_batch", &e->global_batch)) {
    if (e->rank == 0) fprintf(stderr, "fsdp-eval: --match-train: %s does not record fsdp-train's "
                              "batch\n", o->ckpt);
    return -2;
  }
  if (fsdp_engine_create(e->world, &o->cfg, &e->eng) ||
      fsdp_engine_shard_batch(e->eng, e->global_batch, &e->micro, &e->offset))
    return -1;
  e->lm = lm_pick(o->is_llama ? "llama" : "gpt2", &o->gpt, &o->llama);
  lm_layout_t y;
  lm_layout(&e->lm, &y);
  fsdp_gpt2_opts_t w = {.wrap_kinds = y.layer_kind, .max_batch = (int)e->micro, .max_T = e->T};
  fsdp_ckpt_load_opts_t lo = FSDP_CKPT_LOAD_OPTS_INIT;
  lo.reset_optim = 1; /* eval holds no optimizer state */
  if (lm_create(&e->lm, e->eng, &w) ||
      fsdp_engine_materialize(e->eng, 1) || fsdp_ckpt_load(e->eng, o->ckpt, &lo, NULL, NULL, 0))
    return -1;
  e->ids = malloc((size_t)e->micro * (size_t)e->T * sizeof(int));
  e->tgt = malloc((size_t)e->micro * (size_t)e->T * sizeof(int));
  return e->ids && e->tgt ? 0 : -1;
}

int main(int argc, char **argv) {
  eval_opts_t o = {.cfg = FSDP_CONFIG_INIT, .split = "val", .temperature = 0.8f, .seed = 1};
  o.cfg.optim.kind = FSDP_OPTIM_SGD; /* momentum 0: no optimizer state */
  o.cfg.optim.momentum = 0.0f;
  o.cfg.max_live_units = 3; /* the root stays gathered beside a block and its prefetch */
  int p = parse(argc, argv, &o);
  if (p) return p > 0 ? 0 : 2;
  evaluator_t e = {.o = &o};
  int rc = 1;
  if (fsdp_world_init(&e.world, NULL)) goto fail;
  e.rank = fsdp_world_rank(e.world);
  e.nranks = fsdp_world_size(e.world);
  if (flags_select_device("fsdp-eval", e.world, &o.cfg)) goto done;
  int r = setup(&e, &o);
  if (r == 0 && !o.no_score) r = eval_score(&e);
  if (r == 0 && o.logits_k) r = eval_logits(&e);
  if (r == 0 && o.sample) r = eval_sample(&e);
  if (r == -2) goto done; /* said */
  if (r) goto fail;
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "fsdp-eval: rank %d: %s\n", e.rank, fsdp_last_error());
done:
  free(e.ids);
  free(e.tgt);
  lm_destroy(&e.lm);
  fsdp_engine_destroy(e.eng);
  fsdp_tokenizer_free(e.tok);
  fsdp_text_free(&e.text);
  fsdp_tokens_free(&e.toks);
  fsdp_world_destroy(e.world);
  return rc;
}
