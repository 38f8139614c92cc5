/* tests/ckpt/test_llama_hf.c — a Llama through import and export --hf
 * (src/ckpt/llama_hf.c, import.c, hf.c) on one rank, without transformers: a
 * hand-written LlamaForCausalLM directory (config.json as transformers v4
 * and v5 write it, one file or shards with an index) imports with every
 * value and the configuration kept, reshards and exports with that
 * configuration; every defect of the config, the tensors and the index is
 * refused naming what is wrong, leaving nothing behind; the manifest's
 * "model" record round-trips through save (and is absent without one),
 * and a corrupt record is refused. tests/interop/llama_interop.py holds the
 * same against transformers itself. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/check_run.h"
#include "common/ckpt_model.h"
#include "common/solo_world.h"
#include "core/json.h"

static char tmp[64];

static void setup(void) {
  snprintf(tmp, sizeof tmp, "/tmp/fsdp-llama-hf-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmp));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  ck_assert_int_eq(system(cmd), 0);
}

static const char *path(const char *fmt, const char *a) {
  static char buf[4][512];
  static int k;
  char rel[256];
  snprintf(rel, sizeof rel, fmt, a);
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", tmp, rel);
  return buf[k];
}

static int exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0;
}

static void write_text(const char *file, const char *text) {
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static char *read_all(const char *file) {
  FILE *f = fopen(file, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  ck_assert_uint_eq(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = 0;
  fclose(f);
  return s;
}

/* ---- a small Llama written by hand ---------------------------------------------------
 * 1 layer, C 4, 2 heads of D 2 with 1 KV head, F 6, V 5: the tensors in HF's
 * names and (out, in) shapes, listed here independently of llama_hf.c. */
enum { C = 4, F = 6, V = 5, KV = 2 /* 1 KV head x D 2 */ };
static const struct { const char *name; int rows, cols; } tensors[] = {
    {"model.embed_tokens.weight", V, C},
    {"model.layers.0.input_layernorm.weight", C, 0},
    {"model.layers.0.self_attn.q_proj.weight", C, C},
    {"model.layers.0.self_attn.k_proj.weight", KV, C},
    {"model.layers.0.self_attn.v_proj.weight", KV, C},
    {"model.layers.0.self_attn.o_proj.weight", C, C},
    {"model.layers.0.post_attention_layernorm.weight", C, 0},
    {"model.layers.0.mlp.gate_proj.weight", F, C},
    {"model.layers.0.mlp.up_proj.weight", F, C},
    {"model.layers.0.mlp.down_proj.weight", C, F},
    {"model.norm.weight", C, 0},
    {"lm_head.weight", V, C},
};
enum { N_TENSORS = sizeof tensors / sizeof tensors[0], HEAD = N_TENSORS - 1 };

static size_t numel(int i) { return (size_t)tensors[i].rows * (size_t)(tensors[i].cols ? tensors[i].cols : 1); }
static int poisoned = -1; /* a tensor written with a NaN at element 3, -1 none */
static float value(int i, size_t j) {
  return i == poisoned && j == 3 ? NAN : (float)i + 0.001f * (float)j;
}

/* config.json: v4's keys (rope_theta, rope_scaling with llama3) */
static const char config_v4[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4,"
    " \"intermediate_size\": 6, \"num_hidden_layers\": 1, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"vocab_size\": 5, \"max_position_embeddings\": 8,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
    " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
    " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 4},"
    " \"attention_bias\": false, \"mlp_bias\": false, \"head_dim\": 2, \"hidden_act\": \"silu\","
    " \"torch_dtype\": \"bfloat16\"}";

/* Tensors [lo, hi) (skipping `skip`, -1 none) as one safetensors file; extra
 * a header entry appended (a tensor of 1 float at the end of the data, its
 * value extra_value). */
static void write_tensors(const char *file, int lo, int hi, int skip, const char *extra,
                          float extra_value) {
  char header[8192];
  size_t n = (size_t)snprintf(header, sizeof header, "{"), at = 0;
  for (int i = lo; i < hi; i++) {
    if (i == skip) continue;
    size_t bytes = numel(i) * 4;
    char shape[32];
    if (tensors[i].cols) snprintf(shape, sizeof shape, "[%d,%d]", tensors[i].rows, tensors[i].cols);
    else snprintf(shape, sizeof shape, "[%d]", tensors[i].rows);
    n += (size_t)snprintf(header + n, sizeof header - n, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":%s,"
                          "\"data_offsets\":[%zu,%zu]}", n > 1 ? "," : "", tensors[i].name, shape,
                          at, at + bytes);
    at += bytes;
  }
  if (extra)
    n += (size_t)snprintf(header + n, sizeof header - n, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[1],"
                          "\"data_offsets\":[%zu,%zu]}", n > 1 ? "," : "", extra, at, at + 4);
  snprintf(header + n, sizeof header - n, "}");
  FILE *f = fopen(file, "wb");
  ck_assert_ptr_nonnull(f);
  uint64_t len = strlen(header);
  for (int i = 0; i < 8; i++) fputc((int)(len >> (8 * i)) & 0xff, f);
  fputs(header, f);
  for (int i = lo; i < hi; i++)
    for (size_t j = 0; i != skip && j < numel(i); j++) {
      float x = value(i, j);
      fwrite(&x, 4, 1, f);
    }
  if (extra) fwrite(&extra_value, 4, 1, f);
  fclose(f);
}

/* A directory dir with config.json and the untied Llama in one file. */
static void write_dir(const char *dir, const char *config) {
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  char file[600];
  snprintf(file, sizeof file, "%s/config.json", dir);
  write_text(file, config);
  snprintf(file, sizeof file, "%s/model.safetensors", dir);
  write_tensors(file, 0, N_TENSORS, -1, NULL, 0);
}

/* Every imported value equals what was written, in the model's order. */
static void assert_values(const char *ckpt, int n_tensors) {
  fsdp_ckpt_t c;
  ck_assert_int_eq(fsdp_ckpt_open(ckpt, &c), FSDP_SUCCESS);
  fsdp_ckpt_info_t in;
  fsdp_ckpt_info(c, &in);
  ck_assert_int_eq(in.n_tensors, n_tensors);
  float got[64];
  for (int i = 0; i < n_tensors; i++) {
    fsdp_ckpt_tensor_t t;
    ck_assert_int_eq(fsdp_ckpt_tensor(c, i, &t), FSDP_SUCCESS);
    ck_assert_str_eq(t.name, tensors[i].name);
    ck_assert_uint_eq(t.numel, numel(i));
    ck_assert_int_eq(fsdp_ckpt_read(c, i, 0, 0, t.numel, got), FSDP_SUCCESS);
    for (size_t j = 0; j < t.numel; j++) ck_assert(got[j] == value(i, j));
  }
  fsdp_ckpt_close(c);
}

static void assert_config(const char *ckpt, int tied) {
  fsdp_ckpt_t c;
  fsdp_llama_config_t l;
  ck_assert_int_eq(fsdp_ckpt_open(ckpt, &c), FSDP_SUCCESS);
  ck_assert_str_eq(fsdp_ckpt_family(c), "llama");
  ck_assert_int_eq(fsdp_ckpt_llama_config(c, &l), FSDP_SUCCESS);
  fsdp_ckpt_close(c);
  const fsdp_llama_config_t want = {1, 2, 1, C, F, V, 8, 500000.0f, 1e-5f, tied,
                                    FSDP_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 4};
  ck_assert_msg(!memcmp(&l, &want, sizeof l), "recorded %d %d %d %d %d %d %d %g %g %d %d %g %g "
                "%g %d", l.n_layer, l.n_head, l.n_kv_head, l.n_embd, l.ffn_hidden, l.vocab_size,
                l.max_seq_len, (double)l.rope_theta, (double)l.rms_eps, l.tie_embeddings,
                (int)l.rope_type, (double)l.rope_factor, (double)l.rope_low_freq_factor,
                (double)l.rope_high_freq_factor, l.rope_original_max_pos);
}

/* ---- import, reshard, export ---------------------------------------------------------- */

START_TEST(test_round_trip) {
  write_dir(path("hf", ""), config_v4);
  fsdp_ckpt_io_summary_t sum;
  ck_assert_msg(fsdp_ckpt_import_hf(path("hf", ""), path("ck1", ""), NULL, 0, &sum) == FSDP_SUCCESS,
                "%s", fsdp_last_error());
  ck_assert_int_eq(sum.tensors, N_TENSORS);
  assert_values(path("ck1", ""), N_TENSORS);
  assert_config(path("ck1", ""), 0);
  fsdp_ckpt_t c;
  ck_assert_int_eq(fsdp_ckpt_open(path("ck1", ""), &c), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_reshard(c, 3, path("ck3", "")), FSDP_SUCCESS);
  fsdp_ckpt_close(c);
  assert_config(path("ck3", ""), 0);
  assert_values(path("ck3", ""), N_TENSORS);

  ck_assert_int_eq(fsdp_ckpt_open(path("ck3", ""), &c), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_export_hf(c, path("out", ""), 3, 0, NULL), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), "a Llama of 2 heads, not the 3"), "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_ckpt_export_hf(c, path("out", ""), 0, 0, NULL), FSDP_SUCCESS);
  fsdp_ckpt_close(c);
  /* what the export holds: the configuration, and tensors that import again */
  char *text = read_all(path("out/config.json", ""));
  json_t *cfg;
  ck_assert_int_eq(json_parse(text, strlen(text), "config.json", &cfg), FSDP_SUCCESS);
  const json_t *scaling = json_get(cfg, "rope_scaling");
  static const struct { const char *key, *text; } want[] = {
      {"num_key_value_heads", "1"}, {"head_dim", "2"}, {"intermediate_size", "6"},
      {"rms_norm_eps", "1e-05"}, {"rope_theta", "500000"}, {"max_position_embeddings", "8"}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    ck_assert_msg(json_get(cfg, want[i].key) && !strcmp(json_get(cfg, want[i].key)->text, want[i].text),
                  "%s", want[i].key);
  ck_assert_str_eq(json_get(cfg, "architectures")->items[0].text, "LlamaForCausalLM");
  ck_assert_str_eq(json_get(cfg, "model_type")->text, "llama");
  ck_assert(json_get(cfg, "tie_word_embeddings")->type == JSON_BOOL &&
            !json_get(cfg, "tie_word_embeddings")->boolean);
  ck_assert_str_eq(json_get(scaling, "rope_type")->text, "llama3");
  ck_assert_str_eq(json_get(scaling, "original_max_position_embeddings")->text, "4");
  json_free(cfg);
  free(text);
  ck_assert_int_eq(fsdp_ckpt_import_hf(path("out", ""), path("again", ""), NULL, 0, NULL),
                   FSDP_SUCCESS);
  assert_values(path("again", ""), N_TENSORS);
  assert_config(path("again", ""), 0);
}
END_TEST

/* v5's keys (rope_parameters, dtype), a tied head left out as save_pretrained
 * does, and an old checkpoint's rotary inv_freq buffer, which is skipped. */
START_TEST(test_tied_v5) {
  char cfg[2048];
  snprintf(cfg, sizeof cfg,
           "{\"model_type\": \"llama\", \"hidden_size\": 4, \"intermediate_size\": 6,"
           " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
           " \"vocab_size\": 5, \"max_position_embeddings\": 8, \"rms_norm_eps\": 1e-05,"
           " \"tie_word_embeddings\": true, \"dtype\": \"float32\", \"rope_parameters\":"
           " {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 8.0,"
           " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
           " \"original_max_position_embeddings\": 4}}");
  ck_assert_int_eq(mkdir(path("hf", ""), 0755), 0);
  write_text(path("hf/config.json", ""), cfg);
  write_tensors(path("hf/model.safetensors", ""), 0, HEAD, -1,
                "model.layers.0.self_attn.rotary_emb.inv_freq", 1.0f);
  ck_assert_msg(fsdp_ckpt_import_hf(path("hf", ""), path("ck", ""), NULL, 0, NULL) == FSDP_SUCCESS,
                "%s", fsdp_last_error());
  assert_values(path("ck", ""), HEAD);
  assert_config(path("ck", ""), 1);
  fsdp_ckpt_t c;
  ck_assert_int_eq(fsdp_ckpt_open(path("ck", ""), &c), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_export_hf(c, path("out", ""), 0, 0, NULL), FSDP_SUCCESS);
  fsdp_ckpt_close(c);
  char *text = read_all(path("out/config.json", ""));
  ck_assert_ptr_nonnull(strstr(text, "\"tie_word_embeddings\": true"));
  free(text);
  text = read_all(path("out/model.safetensors", ""));
  ck_assert_ptr_null(strstr(text + 8, "lm_head"));
  ck_assert_ptr_nonnull(strstr(text + 8, "\"model.norm.weight\""));
  free(text);
}
END_TEST

/* ---- sharded: an index and its files ------------------------------------------------- */

/* hf/model-0000{1,2}-of-00002.safetensors split at tensor 5 and the index;
 * `defect` spoils one thing. */
enum {
  SH_GOOD, SH_UNLISTED, SH_WRONG_FILE, SH_NOT_HELD, SH_PATH, SH_TWICE, SH_NAN, SH_MISSING_FILE,
  SH_CASES
};
static const char *const sh_problem[SH_CASES] = {
    NULL,
    "tensor 'model.norm.weight' of model-00002-of-00002.safetensors is not in the index's weight_map",
    "tensor 'lm_head.weight' is in model-00002-of-00002.safetensors, not in "
    "model-00001-of-00002.safetensors as the weight_map says",
    "tensor 'model.layers.0.mlp.up_proj.weight' is in the weight_map "
    "(model-00002-of-00002.safetensors) but that file does not hold it",
    "\"weight_map\".\"lm_head.weight\" must name a file in the index's directory",
    "tensor 'model.norm.weight' is in both model-00001-of-00002.safetensors and "
    "model-00002-of-00002.safetensors",
    "model-00002-of-00002.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' is nan at index 3",
    "model-00002-of-00002.safetensors: cannot open",
};

static void write_sharded(int defect) {
  ck_assert_int_eq(mkdir(path("hf", ""), 0755), 0);
  write_text(path("hf/config.json", ""), config_v4);
  const char *one = "model-00001-of-00002.safetensors", *two = "model-00002-of-00002.safetensors";
  write_tensors(path("hf/%s", one), 0, 5, -1, defect == SH_TWICE ? "model.norm.weight" : NULL, 1);
  poisoned = defect == SH_NAN ? 7 : -1;
  if (defect != SH_MISSING_FILE)
    write_tensors(path("hf/%s", two), 5, N_TENSORS, defect == SH_NOT_HELD ? 8 : -1, NULL, 0);
  poisoned = -1;
  char index[4096];
  size_t n = (size_t)snprintf(index, sizeof index, "{\"metadata\": {\"total_size\": 0}, "
                                                   "\"weight_map\": {");
  for (int i = 0; i < N_TENSORS; i++) {
    const char *file = i < 5 ? one : two;
    if (defect == SH_UNLISTED && i == 10) continue;
    if (defect == SH_WRONG_FILE && i == HEAD) file = one;
    if (defect == SH_PATH && i == HEAD) file = "../model-00002-of-00002.safetensors";
    n += (size_t)snprintf(index + n, sizeof index - n, "%s\"%s\": \"%s\"", i ? ", " : "",
                          tensors[i].name, file);
  }
  snprintf(index + n, sizeof index - n, "}}");
  write_text(path("hf/model.safetensors.index.json", ""), index);
}

START_TEST(test_sharded) {
  write_sharded(_i);
  fsdp_ckpt_io_summary_t sum;
  fsdp_status_t st = fsdp_ckpt_import_hf(path("hf", ""), path("ck", ""), NULL, 0, &sum);
  if (!sh_problem[_i]) {
    ck_assert_msg(st == FSDP_SUCCESS, "%s", fsdp_last_error());
    ck_assert_str_eq(sum.file, path("hf/model.safetensors.index.json", ""));
    assert_values(path("ck", ""), N_TENSORS);
    assert_config(path("ck", ""), 0);
    /* the index itself as the input names the same */
    ck_assert_int_eq(fsdp_ckpt_import_hf(path("hf/model.safetensors.index.json", ""),
                                         path("ck2", ""), NULL, 0, NULL), FSDP_SUCCESS);
    assert_values(path("ck2", ""), N_TENSORS);
    return;
  }
  ck_assert_int_ne(st, FSDP_SUCCESS);
  ck_assert_msg(strstr(fsdp_last_error(), sh_problem[_i]), "case %d: %s", _i, fsdp_last_error());
  ck_assert_msg(!exists(path("ck", "")), "case %d left the output", _i);
}
END_TEST

/* An index of 70,000 entries is refused before it is parsed, by the limit. */
START_TEST(test_index_limit) {
  ck_assert_int_eq(mkdir(path("hf", ""), 0755), 0);
  FILE *f = fopen(path("hf/model.safetensors.index.json", ""), "w");
  ck_assert_ptr_nonnull(f);
  fputs("{\"weight_map\": {", f);
  for (int i = 0; i < 70000; i++) fprintf(f, "%s\"t%d\": \"a.safetensors\"", i ? ", " : "", i);
  fputs("}}", f);
  fclose(f);
  ck_assert_int_eq(fsdp_ckpt_import_hf(path("hf", ""), path("ck", ""), NULL, 0, NULL),
                   FSDP_ERR_FORMAT);
  ck_assert_msg(strstr(fsdp_last_error(), "model.safetensors.index.json: holds more than 65536 "
                       "entries, the limit"), "%s", fsdp_last_error());
}
END_TEST

/* ---- refusals ------------------------------------------------------------------------- */

typedef struct {
  const char *from, *to; /* config_v4 with `from` replaced (NULL: no config.json) */
  const char *preset;
  int skip;              /* a tensor left out of the file, -1 none */
  const char *extra;     /* an extra tensor, NULL none */
  fsdp_status_t status;
  const char *problem;
} refusal_t;

static const refusal_t refusals[] = {
    {NULL, NULL, NULL, -1, NULL, FSDP_ERR_FORMAT, "holds a Llama (model.embed_tokens.weight) but "
     "no config.json"},
    {"\"num_hidden_layers\": 1", "\"num_hidden_layers\": 1", "tiny", -1, NULL, FSDP_ERR_FORMAT,
     "config.json's Llama is not Llama preset tiny: layers 1, not 2"},
    {"\"num_attention_heads\": 2", "\"num_attention_heads\": 3", NULL, -1, NULL, FSDP_ERR_FORMAT,
     "\"num_attention_heads\" 3 does not divide \"hidden_size\" 4"},
    {"\"num_key_value_heads\": 1", "\"num_key_value_heads\": 4", NULL, -1, NULL, FSDP_ERR_FORMAT,
     "n_kv_head 4 does not divide n_head 2"},
    {"\"rope_type\": \"llama3\"", "\"rope_type\": \"dynamic\"", NULL, -1, NULL,
     FSDP_ERR_UNSUPPORTED, "\"rope_scaling\" rope_type \"dynamic\" is not supported"},
    {"\"factor\": 8.0,", "", NULL, -1, NULL, FSDP_ERR_FORMAT, "\"rope_scaling\" (llama3) has no "
     "\"factor\""},
    {"\"mlp_bias\": false", "\"mlp_bias\": true", NULL, -1, NULL, FSDP_ERR_UNSUPPORTED,
     "\"mlp_bias\" is true"},
    {"\"head_dim\": 2", "\"head_dim\": 4", NULL, -1, NULL, FSDP_ERR_UNSUPPORTED, "\"head_dim\" 4"},
    {"\"torch_dtype\": \"bfloat16\"", "\"torch_dtype\": \"float8_e4m3fn\"", NULL, -1, NULL,
     FSDP_ERR_UNSUPPORTED, "\"torch_dtype\" float8_e4m3fn"},
    {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": \"small\"", NULL, -1, NULL, FSDP_ERR_FORMAT,
     "\"rms_norm_eps\" must be a finite number"},
    {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true", NULL, -1, NULL,
     FSDP_ERR_FORMAT, "'lm_head.weight' differs from 'model.embed_tokens.weight' at element 0"},
    {"", "", NULL, 3, NULL, FSDP_ERR_FORMAT, "tensor 'model.layers.0.self_attn.k_proj.weight' is "
     "missing"},
    {"", "", NULL, -1, "model.layers.1.mlp.up_proj.weight", FSDP_ERR_FORMAT,
     "tensor 'model.layers.1.mlp.up_proj.weight': is not a tensor of the Llama of"},
    {"\"intermediate_size\": 6", "\"intermediate_size\": 7", NULL, -1, NULL, FSDP_ERR_FORMAT,
     "tensor 'model.layers.0.mlp.gate_proj.weight': shape [6,4] is not the [7,4]"},
};

START_TEST(test_refused) {
  const refusal_t *r = &refusals[_i];
  ck_assert_int_eq(mkdir(path("hf", ""), 0755), 0);
  if (r->from) {
    char cfg[2048];
    const char *at = strstr(config_v4, r->from);
    ck_assert_ptr_nonnull(at);
    snprintf(cfg, sizeof cfg, "%.*s%s%s", (int)(at - config_v4), config_v4, r->to,
             at + strlen(r->from));
    write_text(path("hf/config.json", ""), cfg);
  }
  write_tensors(path("hf/model.safetensors", ""), 0, N_TENSORS, r->skip, r->extra, 0.5f);
  fsdp_status_t st = fsdp_ckpt_import_hf(path("hf", ""), path("ck", ""), r->preset, 0, NULL);
  ck_assert_msg(st == r->status && strstr(fsdp_last_error(), r->problem), "case %d: %d %s", _i,
                (int)st, fsdp_last_error());
  ck_assert_msg(!exists(path("ck", "")), "case %d left the output", _i);
}
END_TEST

/* The preset alone says what config.json would (without one beside the file). */
START_TEST(test_preset) {
  ck_assert_int_eq(mkdir(path("hf", ""), 0755), 0);
  write_tensors(path("hf/model.safetensors", ""), 0, N_TENSORS, -1, NULL, 0);
  ck_assert_int_eq(fsdp_ckpt_import_hf(path("hf/model.safetensors", ""), path("ck", ""), "tiny", 0,
                                       NULL), FSDP_ERR_FORMAT);
  ck_assert_msg(strstr(fsdp_last_error(), "tensor 'model.embed_tokens.weight': shape [5,4] is not "
                       "the [256,64] that the Llama of tiny needs"), "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_ckpt_import_hf(path("hf/model.safetensors", ""), path("ck", ""),
                                       "SmolLM-2", 0, NULL), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), "unknown Llama preset 'SmolLM-2'"), "%s",
                fsdp_last_error());
}
END_TEST

/* ---- the manifest's record ------------------------------------------------------------ */

/* manifest.json with `from` replaced by `to` and its CRC line made right. */
static void edit_manifest(const char *file, const char *from, const char *to) {
  char *text = read_all(file), out[65536];
  const char *at = strstr(text, from);
  ck_assert_ptr_nonnull(at);
  snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  char *key = strstr(out, "\n  \"manifest_crc32\": \"");
  ck_assert_ptr_nonnull(key);
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", (unsigned)crc32(0, (const Bytef *)out, (uInt)(key - out + 1)));
  memcpy(key + strlen("\n  \"manifest_crc32\": \""), hex, 8);
  write_text(file, out);
  free(text);
}

START_TEST(test_manifest_record) {
  fsdp_world_t world;
  ck_assert_int_eq(solo_world_init(&world), FSDP_SUCCESS);
  fsdp_engine_t e = ckm_create(world, FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, CKM_BASE, 5);
  ck_assert_ptr_nonnull(e);
  /* without a record: no "model" in the manifest, as before */
  ck_assert_int_eq(fsdp_ckpt_save(e, path("plain", ""), NULL, NULL, 0), FSDP_SUCCESS);
  char *text = read_all(path("plain/step-0/manifest.json", ""));
  ck_assert_ptr_null(strstr(text, "\"model\""));
  free(text);
  fsdp_ckpt_t c;
  ck_assert_int_eq(fsdp_ckpt_open(path("plain", ""), &c), FSDP_SUCCESS);
  ck_assert_str_eq(fsdp_ckpt_family(c), "gpt2"); /* the test model's wte and wpe */
  fsdp_llama_config_t got;
  ck_assert_int_eq(fsdp_ckpt_llama_config(c, &got), FSDP_ERR_INVALID_ARGUMENT);
  fsdp_ckpt_close(c);
  /* with one: recorded exactly; a bad one refused before anything is written */
  fsdp_llama_config_t l;
  ck_assert_int_eq(fsdp_llama_preset("Llama-3.2-1B", &l), FSDP_SUCCESS);
  fsdp_ckpt_save_opts_t o = FSDP_CKPT_SAVE_OPTS_INIT;
  o.llama = &l;
  l.n_kv_head = 5;
  ck_assert_int_eq(fsdp_ckpt_save(e, path("rec", ""), &o, NULL, 0), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), "n_kv_head 5"), "%s", fsdp_last_error());
  ck_assert(!exists(path("rec/step-0", "")));
  l.n_kv_head = 8;
  ck_assert_int_eq(fsdp_ckpt_save(e, path("rec", ""), &o, NULL, 0), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
  fsdp_world_destroy(world);
  ck_assert_int_eq(fsdp_ckpt_open(path("rec", ""), &c), FSDP_SUCCESS);
  ck_assert_str_eq(fsdp_ckpt_family(c), "llama");
  ck_assert_int_eq(fsdp_ckpt_llama_config(c, &got), FSDP_SUCCESS);
  ck_assert(!memcmp(&got, &l, sizeof l));
  /* its tensors are not that Llama's: export --hf says so */
  ck_assert_int_eq(fsdp_ckpt_export_hf(c, path("out", ""), 0, 0, NULL), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), "but the Llama it records (16 layers, tied head) has 146"),
                "%s", fsdp_last_error());
  fsdp_ckpt_close(c);
  /* a corrupt record (CRC made right) is refused naming the field */
  static const struct { const char *from, *to, *problem; } bad[] = {
      {"\"family\": \"llama\"", "\"family\": \"mamba\"", "field \"model.family\" must be"},
      {"\"n_kv_head\": 8", "\"n_kv_head\": 3", "is not a valid Llama: Llama config: n_kv_head 3"},
      {"\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"", "field \"model.rope_type\""},
      {"\"rms_eps\": 1e-05", "\"rms_eps\": 1e999", "field \"model.rms_eps\" must be a finite"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", path("bad", ""), path("rec", ""),
             path("bad", ""));
    ck_assert_int_eq(system(cmd), 0);
    edit_manifest(path("bad/step-0/manifest.json", ""), bad[i].from, bad[i].to);
    ck_assert_int_eq(fsdp_ckpt_open(path("bad", ""), &c), FSDP_ERR_FORMAT);
    ck_assert_msg(strstr(fsdp_last_error(), bad[i].problem), "%zu: %s", i, fsdp_last_error());
  }
}
END_TEST

static Suite *llama_hf_suite(void) {
  Suite *s = suite_create("llama_hf");
  TCase *tc = tcase_create("llama_hf");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_tied_v5);
  tcase_add_loop_test(tc, test_sharded, 0, SH_CASES);
  tcase_add_test(tc, test_index_limit);
  tcase_add_loop_test(tc, test_refused, 0, sizeof refusals / sizeof refusals[0]);
  tcase_add_test(tc, test_preset);
  tcase_add_test(tc, test_manifest_record);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return check_run(llama_hf_suite()); }
