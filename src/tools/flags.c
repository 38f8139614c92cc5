/* src/tools/flags.c — the tools' shared command-line parser (flags.h). */
#include "tools/flags.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_value(const char *tool, const flag_t *f, const char *flag, const char *v) {
  char *end;
  errno = 0;
  if (f->type == FLAG_STR) {
    *(const char **)f->ptr = v;
    return 0;
  }
  if (f->type == FLAG_F32) {
    float x = strtof(v, &end);
    if (*end || errno || end == v) goto bad;
    *(float *)f->ptr = x;
    return 0;
  }
  long long x = strtoll(v, &end, 10);
  if (*end || errno || end == v || x < 0) goto bad;
  if (f->type == FLAG_INT && x > INT32_MAX) goto bad;
  if (f->type == FLAG_INT) *(int *)f->ptr = (int)x;
  else if (f->type == FLAG_I64) *(int64_t *)f->ptr = x;
  else *(size_t *)f->ptr = (size_t)x;
  return 0;
bad:
  fprintf(stderr, "%s: %s '%s' is not a %s\n", tool, flag, v,
          f->type == FLAG_F32 ? "number" : "non-negative integer");
  return -1;
}

static const flag_t *lookup(const flag_t *table, size_t n, const char *a) {
  for (size_t k = 0; k < n; k++)
    if (!strcmp(a, table[k].name) || (table[k].alias && !strcmp(a, table[k].alias)))
      return &table[k];
  return NULL;
}

int flags_parse(const char *tool, const char *usage, int argc, char **argv, const flag_t *table,
                size_t n, flag_word_fn word, void *ctx) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return fputs(usage, stdout), 1;
    const flag_t *f = lookup(table, n, a);
    if (f && f->type == FLAG_SET) {
      *(int *)f->ptr = 1;
      continue;
    }
    if (f && f->type == FLAG_CLEAR) {
      *(const char **)f->ptr = NULL;
      continue;
    }
    if (!v) return fprintf(stderr, "%s: %s needs a value (see --help)\n", tool, a), -1;
    i++;
    if (f ? parse_value(tool, f, a, v) : word(ctx, a, v)) return -1;
  }
  return 0;
}
