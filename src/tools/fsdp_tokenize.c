/* src/tools/fsdp_tokenize.c — fsdp-tokenize: text files to llm.c token files
 * with a byte-level BPE vocabulary (GPT-2's vocab.json + merges.txt, or a
 * Hugging Face tokenizer.json); also prints the ids of text (--ids) and the
 * text of a token file (--decode). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/data.h"
#include "fsdp/tokenizer.h"
#include "tools/flags.h"

static const char usage_text[] =
    "usage: fsdp-tokenize --vocab DIR --out FILE [options] INPUT...\n"
    "       fsdp-tokenize --vocab DIR --ids INPUT...        print each input's ids\n"
    "       fsdp-tokenize --vocab DIR --decode FILE.bin     print a token file's text\n"
    "INPUTs are text files or directories (their regular files in name order; hidden\n"
    "files, symlinks and names ending in .dat or .u8 are skipped, as fsdp-train does).\n"
    "  --vocab DIR             byte-level BPE: DIR/vocab.json and DIR/merges.txt (GPT-2's),\n"
    "                          or DIR/tokenizer.json or that file (GPT-2, Llama 3, SmolLM,\n"
    "                          Qwen2: its NFC normalizer)\n"
    "  --out FILE              the token file, llm.c's format: GPT-2's (uint16 tokens) for\n"
    "                          vocabularies of up to 65536 ids, else Llama 3's (uint32)\n"
    "  --shard-tokens N        write FILE_000000.bin, FILE_000001.bin, ... of N tokens each\n"
    "  --doc-separator LINE    lines equal to LINE separate documents (% for fortunes);\n"
    "                          default: each file is one document\n"
    "  --no-eot                no document token (<|endoftext|>, else tokenizer.json's\n"
    "                          leading special token: <|begin_of_text|>) before each document\n"
    "  --special               special tokens written in the text are those tokens\n"
    "  --overwrite             replace existing output files\n";

typedef struct {
  const char *vocab, *out, *decode;
  int ids, no_eot, special;
  fsdp_tokenize_opts_t t;
  const char *inputs[256];
  int n_inputs;
} opts_t;

/* Moves the inputs (arguments that are not flags or their values) out of argv. */
static int split_inputs(int *argc, char **argv, const flag_t *table, size_t n, opts_t *o) {
  int kept = 1;
  for (int i = 1; i < *argc; i++) {
    const flag_t *f = NULL;
    for (size_t k = 0; k < n && !f; k++) f = !strcmp(argv[i], table[k].name) ? &table[k] : NULL;
    if (argv[i][0] == '-') {
      argv[kept++] = argv[i];
      if (f && f->type != FLAG_SET && i + 1 < *argc) argv[kept++] = argv[++i];
    } else if (o->n_inputs < 256) {
      o->inputs[o->n_inputs++] = argv[i];
    } else {
      return fprintf(stderr, "fsdp-tokenize: more than 256 inputs: pass directories\n"), -1;
    }
  }
  *argc = kept;
  return 0;
}

static int unknown(void *ctx, const char *tool, const char *a, const char *v) {
  (void)ctx, (void)tool;
  if (!v) return 0; /* a last flag of no table's: unknown */
  return fprintf(stderr, "fsdp-tokenize: unknown option '%s' (see --help)\n", a), -1;
}

static int parse(int argc, char **argv, opts_t *o) {
  const flag_t table[] = {
      {"--vocab", NULL, FLAG_STR, &o->vocab},       {"--out", "-o", FLAG_STR, &o->out},
      {"--decode", NULL, FLAG_STR, &o->decode},     {"--ids", NULL, FLAG_SET, &o->ids},
      {"--shard-tokens", NULL, FLAG_SIZE, &o->t.shard_tokens},
      {"--doc-separator", NULL, FLAG_STR, &o->t.doc_separator},
      {"--no-eot", NULL, FLAG_SET, &o->no_eot},     {"--special", NULL, FLAG_SET, &o->special},
      {"--overwrite", NULL, FLAG_SET, &o->t.overwrite},
  };
  size_t n = sizeof table / sizeof table[0];
  if (split_inputs(&argc, argv, table, n, o)) return -1;
  int p = flags_parse("fsdp-tokenize", usage_text, argc, argv, table, n, unknown, o);
  if (p) return p;
  if (!o->vocab) return fprintf(stderr, "fsdp-tokenize: --vocab DIR is required\n"), -1;
  if (!o->decode && !o->n_inputs)
    return fprintf(stderr, "fsdp-tokenize: no inputs (see --help)\n"), -1;
  if (!o->decode && !o->ids && !o->out)
    return fprintf(stderr, "fsdp-tokenize: --out FILE is required\n"), -1;
  o->t.eot = !o->no_eot;
  o->t.flags = o->special ? FSDP_TOKENIZE_ALLOW_SPECIAL : 0;
  return 0;
}

/* --ids: one line of ids per input file, as encoded with --special's flags. */
static int print_ids(fsdp_tokenizer_t tok, const opts_t *o) {
  for (int i = 0; i < o->n_inputs; i++) {
    fsdp_text_t text;
    if (fsdp_text_load(o->inputs[i], 0.0, &text)) return -1;
    fsdp_token_buf_t ids = {0};
    fsdp_status_t st = fsdp_tokenizer_encode(tok, (const char *)text.bytes, text.n, o->t.flags, &ids);
    fsdp_text_free(&text);
    for (size_t k = 0; !st && k < ids.n; k++) printf(k ? " %d" : "%d", ids.ids[k]);
    printf("\n");
    fsdp_token_buf_free(&ids);
    if (st) return -1;
  }
  return 0;
}

/* --decode: the text of every token of a token file, to stdout. */
static int print_text(fsdp_tokenizer_t tok, const char *path) {
  fsdp_tokens_t t;
  if (fsdp_tokens_load(path, 0.0, &t)) return -1;
  int rc = 0;
  for (size_t i = 0; i < t.n && !rc; i++) {
    size_t len;
    const char *s = fsdp_tokenizer_token(tok, fsdp_tokens_at(&t, i), &len);
    if (!s) {
      fprintf(stderr, "fsdp-tokenize: %s: token %zu is %d, outside the vocabulary of %d\n", path,
              i, fsdp_tokens_at(&t, i), fsdp_tokenizer_vocab_size(tok));
      rc = -2; /* said */
    } else {
      fwrite(s, 1, len, stdout);
    }
  }
  fsdp_tokens_free(&t);
  return rc;
}

static int tokenize(fsdp_tokenizer_t tok, const opts_t *o) {
  fsdp_tokenize_stats_t s;
  double t0 = fsdp_time_now();
  if (fsdp_tokenize_files(tok, o->inputs, o->n_inputs, o->out, &o->t, &s)) return -1;
  double secs = fsdp_time_now() - t0;
  printf("fsdp-tokenize: %zu files, %zu documents, %zu bytes -> %zu tokens (%.2f bytes/token, "
         "largest id %d, vocabulary %d) in %d %sfile%s %s%s in %.2f s (%.2f MB/s)\n", s.files,
         s.documents, s.bytes, s.tokens, s.tokens ? (double)s.bytes / (double)s.tokens : 0.0,
         s.max_id, fsdp_tokenizer_vocab_size(tok), s.shards, s.width == 4 ? "uint32 " : "",
         s.shards == 1 ? "" : "s", o->out,
         o->t.shard_tokens ? "_*.bin" : "", secs, (double)s.bytes / secs / 1e6);
  return 0;
}

int main(int argc, char **argv) {
  opts_t o = {0};
  int p = parse(argc, argv, &o);
  if (p) return p > 0 ? 0 : 2;
  fsdp_tokenizer_t tok;
  if (fsdp_tokenizer_load(o.vocab, &tok)) {
    fprintf(stderr, "fsdp-tokenize: %s\n", fsdp_last_error());
    return 1;
  }
  int rc = o.decode ? print_text(tok, o.decode) : o.ids ? print_ids(tok, &o) : tokenize(tok, &o);
  if (rc == -1) fprintf(stderr, "fsdp-tokenize: %s\n", fsdp_last_error());
  fsdp_tokenizer_free(tok);
  return rc ? 1 : 0;
}
