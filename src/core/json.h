/* src/core/json.h — a small, strict JSON reader and writer, shared by the
 * checkpoint layer (manifests, safetensors headers) and the tokenizer
 * (vocab.json, tokenizer.json). Not installed.
 *
 * Strict: RFC 8259 only (no comments, trailing commas, NaN, leading zeros or
 * control characters in strings), duplicate object keys and keys holding U+0000
 * (\u0000: keys are C strings) are errors, nesting
 * is bounded, and the text after the root value may only be whitespace. Every
 * value remembers the line and column it started at, so callers can name where
 * a field that parsed but is wrong lives. Numbers keep their literal text: an
 * integer is read exactly (int64), never through a double. */
#ifndef FSDP_CORE_JSON_H
#define FSDP_CORE_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/core.h"

typedef enum { JSON_NULL = 0, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type_t;

typedef struct json json_t;
struct json {
  json_type_t type;
  int line, col;  /* where the value starts, 1-based */
  int boolean;    /* JSON_BOOL */
  char *text;     /* JSON_STRING: decoded UTF-8 (NUL-terminated); JSON_NUMBER: the literal */
  size_t len;     /* JSON_STRING: bytes of text (it may hold NUL) */
  size_t n;       /* JSON_ARRAY / JSON_OBJECT: number of items */
  json_t *items;  /* (n) values */
  char **keys;    /* JSON_OBJECT: (n) keys, in file order */
};

/* Parses text[0..len). On error returns FSDP_ERR_FORMAT with "<what>: line L,
 * column C: <problem>" (what names the file), or FSDP_ERR_OUT_OF_MEMORY; *out is
 * written only on success and freed with json_free. */
fsdp_status_t json_parse(const char *text, size_t len, const char *what, json_t **out);
void json_free(json_t *v);

/* The member `key` of an object, or NULL (also when v is not an object). */
const json_t *json_get(const json_t *v, const char *key);
/* 1 and *out when v is an integer literal that fits int64, else 0. */
int json_int(const json_t *v, int64_t *out);
/* 1 and *out when v is a number whose nearest float is finite (an integer
 * literal too; one past float's range is 0), else 0. */
int json_float(const json_t *v, float *out);

/* A growable text buffer for writers. Functions are no-ops once an allocation
 * failed; sb_failed reports it at the end. */
typedef struct {
  char *buf;
  size_t len, cap;
  int failed;
} sbuf_t;

void sb_printf(sbuf_t *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as a JSON string literal, quotes and escapes included. */
void sb_json_str(sbuf_t *sb, const char *s);
/* Appends a finite x as the shortest decimal that strtof reads back as x
 * ("1e-05", "0.25"; integral values below 1e15 without an exponent:
 * "500000"): a valid JSON number. */
void sb_json_float(sbuf_t *sb, float x);
void sb_free(sbuf_t *sb);

#endif
