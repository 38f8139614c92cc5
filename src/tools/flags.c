/* src/tools/flags.c — the tools' shared command-line parser (flags.h). */
#include "tools/flags.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
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
    if (!isfinite(x)) /* strtof takes "nan" and "inf" */
      return fprintf(stderr, "%s: %s '%.*s%s' is not a finite number\n", tool, flag,
                     FLAGS_ECHO, v, strlen(v) > FLAGS_ECHO ? "..." : ""), -1;
    *(float *)f->ptr = x;
    return 0;
  }
  long long x = strtoll(v, &end, 10);
  long long lo = f->type == FLAG_POS, hi = f->type == FLAG_I64 ? INT64_MAX
                                           : f->type == FLAG_SIZE ? LLONG_MAX : INT32_MAX;
  if (*end || errno || end == v) goto bad;
  if (x < lo || x > hi) {
    fprintf(stderr, "%s: %s '%.*s%s' is not an integer from %lld to %lld\n", tool, flag,
            FLAGS_ECHO, v, strlen(v) > FLAGS_ECHO ? "..." : "", lo, hi);
    return -1;
  }
  if (f->type == FLAG_INT || f->type == FLAG_POS) *(int *)f->ptr = (int)x;
  else if (f->type == FLAG_I64 || f->type == FLAG_I64_32) *(int64_t *)f->ptr = x;
  else *(size_t *)f->ptr = (size_t)x;
  return 0;
bad:
  fprintf(stderr, "%s: %s '%.*s%s' is not a %s\n", tool, flag, FLAGS_ECHO, v ? v : "",
          v && strlen(v) > FLAGS_ECHO ? "..." : "",
          f->type == FLAG_F32 ? "number" : "non-negative integer");
  return -1;
}

const flag_t *flags_lookup(const flag_t *table, size_t n, const char *a) {
  for (size_t k = 0; k < n; k++)
    if (!strcmp(a, table[k].name) || (table[k].alias && !strcmp(a, table[k].alias)))
      return &table[k];
  return NULL;
}

int flags_known(const char *flag, const char *const *names, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(flag, names[i])) return 1;
  return 0;
}

/* A value from a configuration file for a flag that takes none: true or false. */
static int file_bool(const char *tool, const char *flag, const char *v, int *out) {
  if (!strcmp(v, "true")) return *out = 1, 0;
  if (!strcmp(v, "false")) return *out = 0, 0;
  return fprintf(stderr, "%s: %s '%.*s%s' is not true or false\n", tool, flag, FLAGS_ECHO, v,
                 strlen(v) > FLAGS_ECHO ? "..." : ""), -1;
}

int flags_apply(const char *tool, const flag_t *table, size_t n, flag_word_fn word, void *ctx,
                const char *flag, const char *v, int from_file) {
  const flag_t *f = flags_lookup(table, n, flag);
  int on = 1;
  if (f && (f->type == FLAG_SET || f->type == FLAG_CLEAR) && from_file &&
      file_bool(tool, flag, v, &on))
    return -1;
  if (f && f->type == FLAG_SET) return *(int *)f->ptr = on, 0;
  if (f && f->type == FLAG_CLEAR) {
    if (on) *(const char **)f->ptr = NULL;
    return 0;
  }
  return f ? parse_value(tool, f, flag, v) : word(ctx, tool, flag, v);
}

int flags_takes_value(const flag_t *table, size_t n, const char *flag) {
  const flag_t *f = flags_lookup(table, n, flag);
  return !f || (f->type != FLAG_SET && f->type != FLAG_CLEAR);
}

int flags_parse(const char *tool, const char *usage, int argc, char **argv, const flag_t *table,
                size_t n, flag_word_fn word, void *ctx) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return fputs(usage, stdout), 1;
    if (!strcmp(a, "--print-config")) continue; /* read by cfg_path (config.c) */
    if (!strcmp(a, "--config") && !v)
      return fprintf(stderr, "%s: --config needs a file (see --help)\n", tool), -1;
    if (!strcmp(a, "--config")) {
      i++;
      continue;
    }
    if (a[0] != '-')
      return fprintf(stderr, "%s: unexpected argument '%s': %s takes only options (see --help)\n",
                     tool, a, tool), -1;
    int takes = flags_takes_value(table, n, a);
    if (takes && !v && !flags_lookup(table, n, a) && !word(ctx, tool, a, NULL))
      return fprintf(stderr, "%s: unknown option '%s' (see --help)\n", tool, a), -1;
    if (takes && !v) return fprintf(stderr, "%s: %s needs a value (see --help)\n", tool, a), -1;
    if (flags_apply(tool, table, n, word, ctx, a, v, 0)) return -1;
    i += takes;
  }
  return 0;
}

void flags_print(FILE *out, const flag_t *table, size_t n) {
  for (size_t k = 0; k < n; k++) {
    const flag_t *f = &table[k];
    const char *key = f->name + 2;
    switch (f->type) {
    case FLAG_INT:
    case FLAG_POS: fprintf(out, "%s: %d\n", key, *(int *)f->ptr); break;
    case FLAG_I64:
    case FLAG_I64_32:
      /* a negative value is an unset default the flag cannot be given */
      if (*(int64_t *)f->ptr < 0) fprintf(out, "# %s: (the default)\n", key);
      else fprintf(out, "%s: %lld\n", key, (long long)*(int64_t *)f->ptr);
      break;
    case FLAG_SIZE: fprintf(out, "%s: %zu\n", key, *(size_t *)f->ptr); break;
    case FLAG_F32: fprintf(out, "%s: %.9g\n", key, (double)*(float *)f->ptr); break;
    case FLAG_SET: fprintf(out, "%s: %s\n", key, *(int *)f->ptr ? "true" : "false"); break;
    case FLAG_STR:
      if (*(const char **)f->ptr) flags_print_str(out, key, *(const char **)f->ptr);
      break;
    case FLAG_CLEAR: break; /* its target prints under its own key */
    }
  }
}

void flags_print_str(FILE *out, const char *key, const char *v) {
  fprintf(out, "%s: \"", key);
  for (const char *c = v; *c; c++)
    if (*c == '"' || *c == '\\') fprintf(out, "\\%c", *c);
    else fputc(*c, out);
  fprintf(out, "\"\n");
}

static int dtype_word(const char *v, fsdp_dtype_t *out) {
  if (!strcmp(v, "f32") || !strcmp(v, "fp32")) return *out = FSDP_F32, 0;
  if (!strcmp(v, "bf16")) return *out = FSDP_BF16, 0;
  if (!strcmp(v, "f16") || !strcmp(v, "fp16")) return *out = FSDP_F16, 0;
  return -1;
}

int flags_config_word(const char *tool, const char *flag, const char *v, fsdp_config_t *cfg) {
  int rc;
  if (!strcmp(flag, "--device")) {
    rc = !strcmp(v, "cpu") || !strcmp(v, "cuda") ? 0 : -1;
    if (rc == 0) cfg->device = !strcmp(v, "cuda") ? FSDP_DEVICE_CUDA : FSDP_DEVICE_CPU;
  } else if (!strcmp(flag, "--dtype")) {
    rc = dtype_word(v, &cfg->param_dtype);
  } else if (!strcmp(flag, "--reduce-dtype")) {
    rc = dtype_word(v, &cfg->reduce_dtype);
  } else {
    return 1;
  }
  if (rc) fprintf(stderr, "%s: %s '%.*s%s': use %s\n", tool, flag, FLAGS_ECHO, v,
                  strlen(v) > FLAGS_ECHO ? "..." : "",
                  strcmp(flag, "--device") ? "f32, bf16 or f16" : "cpu or cuda");
  return rc;
}

int flags_select_device(const char *tool, fsdp_world_t world, const fsdp_config_t *cfg) {
  if (cfg->device != FSDP_DEVICE_CUDA) return 0;
  int n = fsdp_cuda_device_count();
  if (n < 1)
    return fprintf(stderr, "%s: --device cuda: no usable CUDA device (fsdp built without "
                   "CUDA, or no GPU visible to this process)\n", tool), -1;
  if (fsdp_cuda_set_device(fsdp_world_local_rank(world) % n))
    return fprintf(stderr, "%s: %s\n", tool, fsdp_last_error()), -1;
  return 0;
}
