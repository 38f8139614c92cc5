/* tests/common/tok_vocab.h — writes the tiny GPT-2-style vocabularies the
 * tokenizer tests use: the 256 byte tokens in GPT-2's byte alphabet, one
 * token per merge, then "<|endoftext|>". Header-only: test_bpe.c and
 * test_tokens.c include it. */
#ifndef FSDP_TESTS_COMMON_TOK_VOCAB_H
#define FSDP_TESTS_COMMON_TOK_VOCAB_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* GPT-2's spelling of byte b, as UTF-8, into out (at least 3 bytes + NUL). */
static inline void tok_byte_spelling(int b, char *out) {
  int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  int cp = b;
  if (!keep) {
    cp = 256;
    for (int c = 0; c < b; c++) cp += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
  }
  if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
  else out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
}

/* The spelling of a byte string (e.g. " he" -> "Ġhe"). */
static inline void tok_spell(const char *bytes, char *out) {
  out[0] = 0;
  for (const unsigned char *p = (const unsigned char *)bytes; *p; p++)
    tok_byte_spelling(*p, out + strlen(out));
}

static inline void tok_json_key(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

/* dir/vocab.json and dir/merges.txt for merges given as byte strings
 * ("a", "b" means merge a and b, making "ab"), best first. Ids: bytes 0..255,
 * then each merge's result in order (a result seen before keeps its id), then
 * "<|endoftext|>". Returns the vocabulary size. */
static inline int tok_write_vocab(const char *dir, const char *const (*merges)[2], int n) {
  mkdir(dir, 0755);
  char path[512], a[256], b[256], ab[512];
  snprintf(path, sizeof path, "%s/vocab.json", dir);
  FILE *v = fopen(path, "w");
  snprintf(path, sizeof path, "%s/merges.txt", dir);
  FILE *m = fopen(path, "w");
  ck_assert(v && m);
  fprintf(v, "{");
  for (int i = 0; i < 256; i++) {
    tok_byte_spelling(i, a);
    fprintf(v, i ? ",\n" : "\n");
    tok_json_key(v, a);
    fprintf(v, ": %d", i);
  }
  fprintf(m, "#version: 0.2\n");
  int id = 256;
  for (int k = 0; k < n; k++) {
    char joined[512];
    snprintf(joined, sizeof joined, "%s%s", merges[k][0], merges[k][1]);
    tok_spell(merges[k][0], a);
    tok_spell(merges[k][1], b);
    tok_spell(joined, ab);
    fprintf(m, "%s %s\n", a, b);
    int seen = 0;
    for (int j = 0; j < k && !seen; j++) {
      char other[512];
      snprintf(other, sizeof other, "%s%s", merges[j][0], merges[j][1]);
      seen = !strcmp(other, joined);
    }
    if (seen) continue;
    fprintf(v, ",\n");
    tok_json_key(v, ab);
    fprintf(v, ": %d", id++);
  }
  fprintf(v, ",\n\"<|endoftext|>\": %d\n}\n", id++);
  ck_assert_int_eq(fclose(v), 0);
  ck_assert_int_eq(fclose(m), 0);
  return id;
}

#endif
