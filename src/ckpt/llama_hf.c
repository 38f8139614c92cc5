/* src/ckpt/llama_hf.c — a Llama as Hugging Face writes it (llama_hf.h): the
 * tensor list of a configuration and config.json both ways. */
#include "ckpt/llama_hf.h"

#include <stdio.h>
#include <string.h>

#include "ckpt/llama_layout.h"

/* ---- the tensors ------------------------------------------------------------------ */

int llama_n_tensors(const fsdp_llama_config_t *c) {
  return 1 + c->n_layer * LLAMA_LAYER_TENSORS + 1 + !c->tie_embeddings;
}

void llama_tensor(const fsdp_llama_config_t *c, int i, char *name, size_t cap, int *ndim,
                  int64_t shape[2]) {
  const int layers = c->n_layer * LLAMA_LAYER_TENSORS;
  if (i == 0 || i == layers + 2) {
    snprintf(name, cap, "%s", i ? LLAMA_HEAD : LLAMA_EMBED);
    *ndim = 2, shape[0] = c->vocab_size, shape[1] = c->n_embd;
  } else if (i == layers + 1) {
    snprintf(name, cap, "%s", LLAMA_NORM);
    *ndim = 1, shape[0] = c->n_embd, shape[1] = 0;
  } else {
    int rows, cols, which = (i - 1) % LLAMA_LAYER_TENSORS;
    llama_layer_tensor_name((i - 1) / LLAMA_LAYER_TENSORS, which, name, cap);
    llama_layer_tensor_shape(c, which, &rows, &cols);
    *ndim = cols ? 2 : 1, shape[0] = rows, shape[1] = cols;
  }
}

/* ---- config.json in ---------------------------------------------------------------- */

/* An integer in [1, INT32_MAX]; absent or null: dflt (0: required). */
static fsdp_status_t hf_int(const char *file, const json_t *cfg, const char *key, int dflt,
                            int *out) {
  const json_t *v = json_get(cfg, key);
  int64_t x;
  if ((!v || v->type == JSON_NULL) && dflt) return *out = dflt, FSDP_SUCCESS;
  if (!v || !json_int(v, &x) || x < 1 || x > INT32_MAX)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"%s\" must be an integer from 1 to %d", file, key,
                      INT32_MAX);
  *out = (int)x;
  return FSDP_SUCCESS;
}

/* A finite number; absent (or null): dflt. */
static fsdp_status_t hf_float(const char *file, const json_t *obj, const char *where,
                              const char *key, float dflt, float *out) {
  const json_t *v = json_get(obj, key);
  if (!v || v->type == JSON_NULL) return *out = dflt, FSDP_SUCCESS;
  if (!json_float(v, out))
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"%s%s\" must be a finite number", file, where, key);
  return FSDP_SUCCESS;
}

/* A boolean; absent or null: 0. */
static fsdp_status_t hf_bool(const char *file, const json_t *cfg, const char *key, int *out) {
  const json_t *v = json_get(cfg, key);
  *out = 0;
  if (!v || v->type == JSON_NULL) return FSDP_SUCCESS;
  if (v->type != JSON_BOOL)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"%s\" must be true or false", file, key);
  *out = v->boolean;
  return FSDP_SUCCESS;
}

/* Features fsdp's Llama has no code for: refused by name. */
static fsdp_status_t check_supported(const char *file, const json_t *cfg, int C, int NH) {
  static const char *const biases[] = {"attention_bias", "mlp_bias"};
  for (int i = 0; i < 2; i++) {
    int on;
    FSDP_TRY(hf_bool(file, cfg, biases[i], &on));
    if (on)
      return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: \"%s\" is true: fsdp's Llama has no biases",
                        file, biases[i]);
  }
  const json_t *hd = json_get(cfg, "head_dim");
  int64_t d;
  if (hd && hd->type != JSON_NULL && (!json_int(hd, &d) || d != C / NH))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: \"head_dim\" %s is not hidden_size / "
                      "num_attention_heads = %d, the only head size fsdp's Llama has", file,
                      hd->text ? hd->text : "(not a number)", C / NH);
  const json_t *act = json_get(cfg, "hidden_act");
  if (act && (act->type != JSON_STRING || strcmp(act->text, "silu")))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: \"hidden_act\" %s%s%s is not \"silu\", the "
                      "activation of fsdp's SwiGLU", file, act->type == JSON_STRING ? "\"" : "",
                      act->type == JSON_STRING ? act->text : "(not a string)",
                      act->type == JSON_STRING ? "\"" : "");
  static const char *const dtype_keys[] = {"torch_dtype", "dtype"};
  for (int i = 0; i < 2; i++) {
    const json_t *v = json_get(cfg, dtype_keys[i]);
    if (v && v->type != JSON_NULL &&
        (v->type != JSON_STRING || (strcmp(v->text, "float32") && strcmp(v->text, "bfloat16") &&
                                    strcmp(v->text, "float16"))))
      return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: \"%s\" %s is not float32, bfloat16 or "
                        "float16 (the dtypes that import)", file, dtype_keys[i],
                        v->type == JSON_STRING ? v->text : "(not a string)");
  }
  return FSDP_SUCCESS;
}

/* RoPE: v4's rope_theta and rope_scaling, or v5's rope_parameters (which
 * holds rope_theta and rope_type "default" too). */
static fsdp_status_t read_rope(const char *file, const json_t *cfg, fsdp_llama_config_t *c) {
  const json_t *params = json_get(cfg, "rope_parameters"), *scaling = json_get(cfg, "rope_scaling");
  const char *where = params && params->type != JSON_NULL ? "rope_parameters" : "rope_scaling";
  const json_t *r = params && params->type != JSON_NULL ? params : scaling;
  FSDP_TRY(hf_float(file, cfg, "", "rope_theta", 10000.0f, &c->rope_theta));
  c->rope_type = FSDP_ROPE_DEFAULT;
  if (!r || r->type == JSON_NULL) return FSDP_SUCCESS;
  if (r->type != JSON_OBJECT)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"%s\" must be an object or null", file, where);
  char at[32];
  snprintf(at, sizeof at, "%s.", where);
  FSDP_TRY(hf_float(file, r, at, "rope_theta", c->rope_theta, &c->rope_theta));
  const json_t *type = json_get(r, "rope_type") ? json_get(r, "rope_type") : json_get(r, "type");
  if (!type || type->type != JSON_STRING)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"%s\" has no \"rope_type\" string", file, where);
  if (!strcmp(type->text, "default")) return FSDP_SUCCESS;
  if (strcmp(type->text, "llama3"))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: \"%s\" rope_type \"%s\" is not supported: "
                      "fsdp's Llama has default RoPE and llama3's scaling", file, where,
                      type->text);
  c->rope_type = FSDP_ROPE_LLAMA3;
  static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor"};
  float *outs[] = {&c->rope_factor, &c->rope_low_freq_factor, &c->rope_high_freq_factor};
  for (int i = 0; i < 3; i++) {
    if (!json_get(r, keys[i]))
      return fsdp_error(FSDP_ERR_FORMAT, "%s: \"%s\" (llama3) has no \"%s\"", file, where,
                        keys[i]);
    FSDP_TRY(hf_float(file, r, at, keys[i], 0.0f, outs[i]));
  }
  char key[64];
  snprintf(key, sizeof key, "%soriginal_max_position_embeddings", at);
  const json_t *old = json_get(r, "original_max_position_embeddings");
  int64_t x;
  if (!old || !json_int(old, &x) || x < 1 || x > INT32_MAX)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"%s\" must be an integer from 1 to %d", file, key,
                      INT32_MAX);
  c->rope_original_max_pos = (int)x;
  return FSDP_SUCCESS;
}

fsdp_status_t llama_config_from_hf(const char *file, const json_t *cfg, fsdp_llama_config_t *out) {
  fsdp_llama_config_t c = {0};
  if (!cfg || cfg->type != JSON_OBJECT)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: not a JSON object", file);
  FSDP_TRY(hf_int(file, cfg, "hidden_size", 0, &c.n_embd));
  FSDP_TRY(hf_int(file, cfg, "intermediate_size", 0, &c.ffn_hidden));
  FSDP_TRY(hf_int(file, cfg, "num_hidden_layers", 0, &c.n_layer));
  FSDP_TRY(hf_int(file, cfg, "num_attention_heads", 0, &c.n_head));
  FSDP_TRY(hf_int(file, cfg, "num_key_value_heads", c.n_head, &c.n_kv_head));
  FSDP_TRY(hf_int(file, cfg, "vocab_size", 0, &c.vocab_size));
  FSDP_TRY(hf_int(file, cfg, "max_position_embeddings", 2048, &c.max_seq_len));
  FSDP_TRY(hf_float(file, cfg, "", "rms_norm_eps", 1e-6f, &c.rms_eps));
  FSDP_TRY(hf_bool(file, cfg, "tie_word_embeddings", &c.tie_embeddings));
  FSDP_TRY(read_rope(file, cfg, &c));
  if (c.n_embd % c.n_head)
    return fsdp_error(FSDP_ERR_FORMAT, "%s: \"num_attention_heads\" %d does not divide "
                      "\"hidden_size\" %d", file, c.n_head, c.n_embd);
  FSDP_TRY(check_supported(file, cfg, c.n_embd, c.n_head));
  if (fsdp_llama_config_check(&c)) {
    char why[512]; /* the message is rewritten below: copied out first */
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_error(FSDP_ERR_FORMAT, "%s: %s", file, why);
  }
  *out = c;
  return FSDP_SUCCESS;
}

/* ---- config.json out --------------------------------------------------------------- */

static void put_float(sbuf_t *sb, const char *key, float x) {
  sb_printf(sb, "  \"%s\": ", key);
  sb_json_float(sb, x);
  sb_printf(sb, ",\n");
}

void llama_config_to_hf(const fsdp_llama_config_t *c, sbuf_t *sb) {
  sb_printf(sb, "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
            "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
            "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
            "  \"max_position_embeddings\": %d,\n  \"hidden_act\": \"silu\",\n", c->vocab_size,
            c->n_embd, c->ffn_hidden, c->n_layer, c->n_head, c->n_kv_head, c->n_embd / c->n_head,
            c->max_seq_len);
  put_float(sb, "rms_norm_eps", c->rms_eps);
  put_float(sb, "rope_theta", c->rope_theta);
  if (c->rope_type == FSDP_ROPE_LLAMA3) {
    sb_printf(sb, "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": ");
    sb_json_float(sb, c->rope_factor);
    sb_printf(sb, ", \"low_freq_factor\": ");
    sb_json_float(sb, c->rope_low_freq_factor);
    sb_printf(sb, ", \"high_freq_factor\": ");
    sb_json_float(sb, c->rope_high_freq_factor);
    sb_printf(sb, ", \"original_max_position_embeddings\": %d},\n", c->rope_original_max_pos);
  } else {
    sb_printf(sb, "  \"rope_scaling\": null,\n");
  }
  sb_printf(sb, "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n"
            "  \"mlp_bias\": false,\n  \"pretraining_tp\": 1,\n  \"initializer_range\": 0.02,\n"
            "  \"tie_word_embeddings\": %s,\n  \"use_cache\": true,\n"
            "  \"torch_dtype\": \"float32\"\n}\n", c->tie_embeddings ? "true" : "false");
}

fsdp_status_t llama_config_same(const char *a_what, const fsdp_llama_config_t *a,
                                const char *b_what, const fsdp_llama_config_t *b) {
  const struct { const char *name; double x, y; } f[] = {
      {"layers", a->n_layer, b->n_layer}, {"heads", a->n_head, b->n_head},
      {"KV heads", a->n_kv_head, b->n_kv_head}, {"width", a->n_embd, b->n_embd},
      {"FFN width", a->ffn_hidden, b->ffn_hidden}, {"vocabulary", a->vocab_size, b->vocab_size},
      {"context", a->max_seq_len, b->max_seq_len}, {"rope_theta", a->rope_theta, b->rope_theta},
      {"rms_eps", a->rms_eps, b->rms_eps}, {"tied head", a->tie_embeddings, b->tie_embeddings},
      {"rope type", a->rope_type, b->rope_type},
      {"rope factor", a->rope_factor, b->rope_factor},
      {"rope low_freq_factor", a->rope_low_freq_factor, b->rope_low_freq_factor},
      {"rope high_freq_factor", a->rope_high_freq_factor, b->rope_high_freq_factor},
      {"rope original context", a->rope_original_max_pos, b->rope_original_max_pos}};
  int n = a->rope_type == FSDP_ROPE_LLAMA3 && b->rope_type == FSDP_ROPE_LLAMA3 ? 15 : 11;
  for (int i = 0; i < n; i++)
    if (f[i].x != f[i].y)
      return fsdp_error(FSDP_ERR_FORMAT, "%s is not %s: %s %g, not %g", a_what, b_what,
                        f[i].name, f[i].x, f[i].y);
  return FSDP_SUCCESS;
}
