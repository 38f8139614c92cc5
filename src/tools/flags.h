/* src/tools/flags.h — the command-line parser the tools share (fsdp-train,
 * fsdp-bench): a table of flags bound to variables, and a callback for flags
 * whose values are words or lists. */
#ifndef FSDP_TOOLS_FLAGS_H
#define FSDP_TOOLS_FLAGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fsdp/fsdp.h"

typedef enum {
  FLAG_INT,   /* int, >= 0 */
  FLAG_POS,   /* int, >= 1 (a model dimension) */
  FLAG_I64,   /* int64_t, >= 0 */
  FLAG_I64_32, /* int64_t, from 0 to INT32_MAX (a count that becomes an int) */
  FLAG_SIZE,  /* size_t */
  FLAG_F32,   /* float */
  FLAG_STR,   /* const char *, pointing into argv */
  FLAG_SET,   /* int set to 1; takes no value */
  FLAG_CLEAR  /* const char * set to NULL; takes no value */
} flag_type_t;

typedef struct {
  const char *name, *alias; /* alias may be NULL */
  flag_type_t type;
  void *ptr;
} flag_t;

/* Flags not in the table arrive here with their value; return 0 when taken,
 * -1 (after printing "<tool>: why") when not. tool is what to begin an error
 * with: the tool's name, or "<tool>: FILE:LINE" for a configuration file.
 * A flag that ends the command line arrives with value NULL: return 1 if it
 * is one of yours (it then "needs a value"), 0 if not (an unknown option),
 * printing nothing. */
typedef int (*flag_word_fn)(void *ctx, const char *tool, const char *flag, const char *value);

/* 1 when flag is one of names[0..n), else 0: a flag_word_fn's answer for a
 * value-less last flag. */
int flags_known(const char *flag, const char *const *names, size_t n);

/* Values in messages: at most FLAGS_ECHO bytes of a value are printed, then
 * "...", so that a huge bad value does not flood stderr. */
#define FLAGS_ECHO 64

/* Returns 0 when parsed, 1 after printing usage for --help/-h, -1 after
 * printing "<tool>: <what is wrong>" to stderr. --config FILE and
 * --print-config are skipped (tools/config.h handles them). */
int flags_parse(const char *tool, const char *usage, int argc, char **argv, const flag_t *table,
                size_t n, flag_word_fn word, void *ctx);

/* The engine-config words both tools take: --device cpu|cuda, --dtype
 * f32|bf16|f16 (what parameters are gathered and computed in) and
 * --reduce-dtype (the same words; the engine reduces in f32 or bf16).
 * Returns 0 when taken, -1 after printing why the value is bad, 1 when the
 * flag is none of these. */
int flags_config_word(const char *tool, const char *flag, const char *v, fsdp_config_t *cfg);

/* On a CUDA config, makes device local_rank % count current for this thread,
 * as the engine wants before fsdp_engine_create. 0, or -1 after printing why. */
int flags_select_device(const char *tool, fsdp_world_t world, const fsdp_config_t *cfg);

/* One flag with its value (v unused for flags that take none on the command
 * line; from a file they take true or false). 0, or -1 after printing why. */
int flags_apply(const char *tool, const flag_t *table, size_t n, flag_word_fn word, void *ctx,
                const char *flag, const char *v, int from_file);
/* The table's flag named flag (its name or alias), or NULL. */
const flag_t *flags_lookup(const flag_t *table, size_t n, const char *flag);
/* 0 for a table flag that takes no value (FLAG_SET, FLAG_CLEAR), else 1. */
int flags_takes_value(const flag_t *table, size_t n, const char *flag);

/* The table's values as configuration-file lines "key: value" (key: the flag
 * without "--"); unset strings are left out, FLAG_CLEAR flags too. Floats with
 * 9 significant digits, so they read back bit for bit. */
void flags_print(FILE *out, const flag_t *table, size_t n);
/* key: "value", quoted and escaped for YAML. */
void flags_print_str(FILE *out, const char *key, const char *v);

#endif
