/* src/ckpt/hf.c — checkpoints as Hugging Face directories (export --hf):
 * GPT-2's shape (from tensors, trainer state, config.json or a preset), the
 * tensor shapes that shape implies and its config.json; a Llama's from the
 * configuration its manifest records (llama_hf.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/gpt2_layout.h"
#include "ckpt/hf.h"
#include "ckpt/llama_hf.h"
#include "fsdp/nn.h"

/* ---- the tensors a shape implies ---------------------------------------------------- */

_Static_assert(GPT2_BLOCK_TENSORS == 12, "HF_MAX_LAYERS counts 12 tensors a layer");

int hf_n_tensors(const hf_shape_t *s) { return 2 + s->n_layer * GPT2_BLOCK_TENSORS + 2; }

/* Tensor i of the model in fsdp's order (wte, wpe, h.0..., ln_f): our name
 * and shape. */
void hf_tensor(const hf_shape_t *s, int i, char *name, size_t cap, int *ndim, int64_t shape[2]) {
  int64_t C = s->n_embd;
  if (i < 2) {
    snprintf(name, cap, "%s", i ? "wpe" : "wte");
    *ndim = 2, shape[0] = i ? s->n_positions : s->vocab, shape[1] = C;
  } else if (i < 2 + s->n_layer * GPT2_BLOCK_TENSORS) {
    int l = (i - 2) / GPT2_BLOCK_TENSORS, k = (i - 2) % GPT2_BLOCK_TENSORS;
    const gpt2_block_tensor_t *t = &gpt2_block_tensors[k];
    snprintf(name, cap, "h.%d.%s", l, t->name);
    *ndim = t->cols ? 2 : 1;
    shape[0] = t->rows * C, shape[1] = t->cols * C;
  } else {
    snprintf(name, cap, "ln_f.%s", i == 2 + s->n_layer * GPT2_BLOCK_TENSORS ? "weight" : "bias");
    *ndim = 1, shape[0] = C;
  }
}

/* ---- the shape of a checkpoint ----------------------------------------------------- */

static const ckpt_tensor_t *find(const ckpt_manifest_t *m, const char *name) {
  for (int i = 0; i < m->n_tensors; i++)
    if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
  return NULL;
}

static fsdp_status_t shape_of(const ckpt_manifest_t *m, int n_head, hf_shape_t *s) {
  const ckpt_tensor_t *wte = find(m, "wte"), *wpe = find(m, "wpe");
  if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: not a GPT-2 checkpoint (no 2-D wte and wpe "
                      "tensors) and it records no Llama: export --hf writes GPT-2 and Llama models only",
                      m->dir);
  *s = (hf_shape_t){.vocab = wte->shape[0], .n_embd = wte->shape[1], .n_positions = wpe->shape[0]};
  char name[64];
  snprintf(name, sizeof name, "h.%d.ln_1.weight", 0);
  while (find(m, name)) snprintf(name, sizeof name, "h.%d.ln_1.weight", (int)++s->n_layer);
  int64_t h = 0;
  if (fsdp_ckpt_meta_get(&m->meta, "gpt2.n_head", &h) == FSDP_SUCCESS && n_head > 0 && h != n_head)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: the checkpoint records %lld heads, not the "
                      "%d asked for", m->dir, (long long)h, n_head);
  if (h > 0) s->n_head = h;
  else if (n_head > 0) s->n_head = n_head;
  else return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: the checkpoint does not record the "
                         "number of heads (trainer state gpt2.n_head; no tensor's shape holds it): "
                         "pass it (fsdp-ckpt export --hf DIR --n-head N)", m->dir);
  if (s->n_head < 1 || s->n_embd % s->n_head)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: n_head %lld does not divide n_embd %lld",
                      m->dir, (long long)s->n_head, (long long)s->n_embd);
  return FSDP_SUCCESS;
}

/* Every tensor of the checkpoint is one the shape implies, with that shape. */
static fsdp_status_t check_tensors(const ckpt_manifest_t *m, const hf_shape_t *s) {
  int n = hf_n_tensors(s);
  if (m->n_tensors != n)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: %d tensors, but a GPT-2 of %lld layers has "
                      "%d", m->dir, m->n_tensors, (long long)s->n_layer, n);
  for (int i = 0; i < n; i++) {
    char name[64];
    int ndim;
    int64_t shape[2];
    hf_tensor(s, i, name, sizeof name, &ndim, shape);
    const ckpt_tensor_t *t = find(m, name);
    if (!t || t->ndim != ndim || t->shape[0] != shape[0] || (ndim == 2 && t->shape[1] != shape[1]))
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: tensor %s is %s or misshapen for GPT-2 "
                        "(n_embd %lld)", m->dir, name, t ? "there" : "missing",
                        (long long)s->n_embd);
  }
  return FSDP_SUCCESS;
}

/* ---- config.json ------------------------------------------------------------------- */

/* transformers' GPT2Config for fsdp's GPT-2: tanh GELU ("gelu_new"), layer
 * norm epsilon 1e-5, no dropout (fsdp trains without it), tied head. */
static void config_json(const hf_shape_t *s, sbuf_t *sb) {
  sb_printf(sb, "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
            "  \"vocab_size\": %lld,\n  \"n_positions\": %lld,\n  \"n_ctx\": %lld,\n"
            "  \"n_embd\": %lld,\n  \"n_layer\": %lld,\n  \"n_head\": %lld,\n  \"n_inner\": null,\n"
            "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
            "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
            "  \"initializer_range\": 0.02,\n  \"scale_attn_weights\": true,\n"
            "  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\",\n"
            "  \"bos_token_id\": %lld,\n  \"eos_token_id\": %lld\n}\n",
            (long long)s->vocab, (long long)s->n_positions, (long long)s->n_positions,
            (long long)s->n_embd, (long long)s->n_layer, (long long)s->n_head,
            (long long)s->vocab - 1, (long long)s->vocab - 1);
}

static fsdp_status_t write_text(const char *path, const char *text, size_t len) {
  char tmp[CKPT_PATH_MAX];
  ckpt_writer_t w;
  FSDP_TRY(ckpt_path(tmp, sizeof tmp, "%s.tmp", path));
  FSDP_TRY(ckpt_writer_open(&w, tmp, NULL));
  fsdp_status_t st = ckpt_write(&w, text, len);
  if (st) ckpt_writer_abort(&w);
  else st = ckpt_writer_close(&w);
  if (!st && rename(tmp, path) != 0)
    st = fsdp_error(FSDP_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
  if (st) unlink(tmp);
  return st;
}

static fsdp_status_t make_dir(const char *dir) {
  struct stat sb;
  if (mkdir(dir, 0777) == 0 || (errno == EEXIST && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)))
    return FSDP_SUCCESS;
  return fsdp_error(FSDP_ERR_IO, "%s: cannot create the directory: %s", dir,
                    errno == EEXIST ? "a file is in the way" : strerror(errno));
}

/* Every tensor of the checkpoint is one its Llama implies, with that shape. */
static fsdp_status_t check_llama(const ckpt_manifest_t *m, int n_head) {
  const fsdp_llama_config_t *c = &m->llama;
  int n = llama_n_tensors(c);
  if (n_head > 0 && n_head != c->n_head)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: the checkpoint records a Llama of %d heads, "
                      "not the %d asked for", m->dir, c->n_head, n_head);
  if (m->n_tensors != n)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: %d tensors, but the Llama it records (%d "
                      "layers, %s head) has %d", m->dir, m->n_tensors, c->n_layer,
                      c->tie_embeddings ? "tied" : "untied", n);
  for (int i = 0; i < n; i++) {
    char name[96];
    int ndim;
    int64_t shape[2];
    llama_tensor(c, i, name, sizeof name, &ndim, shape);
    const ckpt_tensor_t *t = find(m, name);
    if (!t || t->ndim != ndim || t->shape[0] != shape[0] || (ndim == 2 && t->shape[1] != shape[1]))
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: tensor %s is %s for the Llama the "
                        "checkpoint records", m->dir, name, t ? "misshapen" : "missing");
  }
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_ckpt_export_hf(fsdp_ckpt_t c, const char *out_dir, int n_head, int flags,
                                  fsdp_ckpt_io_summary_t *sum) {
  if (!c || !out_dir || !out_dir[0])
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "export --hf: no checkpoint or directory");
  hf_shape_t s;
  char model[CKPT_PATH_MAX], config[CKPT_PATH_MAX];
  struct stat sb;
  int llama = c->m.has_llama;
  if (llama) FSDP_TRY(check_llama(&c->m, n_head));
  else FSDP_TRY(shape_of(&c->m, n_head, &s));
  if (!llama) FSDP_TRY(check_tensors(&c->m, &s));
  FSDP_TRY(ckpt_path(model, sizeof model, "%s/model.safetensors", out_dir));
  FSDP_TRY(ckpt_path(config, sizeof config, "%s/config.json", out_dir));
  if (!(flags & FSDP_CKPT_OVERWRITE) && stat(config, &sb) == 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s already exists: refusing to overwrite it (ask "
                      "for overwrite, e.g. fsdp-ckpt export --overwrite, or write elsewhere)",
                      config);
  FSDP_TRY(make_dir(out_dir));
  fsdp_ckpt_io_summary_t local;
  FSDP_TRY(ckpt_write_safetensors(c, model, llama ? CKPT_ST_LLAMA : CKPT_ST_HF, flags,
                                  sum ? sum : &local));
  sbuf_t sb_json = {0};
  if (llama) llama_config_to_hf(&c->m.llama, &sb_json);
  else config_json(&s, &sb_json);
  fsdp_status_t st = sb_json.failed ? fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "config.json")
                                    : write_text(config, sb_json.buf, sb_json.len);
  sb_free(&sb_json);
  if (!st && sum) snprintf(sum->out, sizeof sum->out, "%s", out_dir);
  return st;
}
