/* src/device/stream_impl.c — what every stream kind shares (stream_impl.h):
 * the stream's lock and condition variables, running a task's host function,
 * and the sticky error. The kinds (cpu_stream.c, cuda_stream.c) build on it. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "device/stream_impl.h"

fsdp_status_t fsdp_stream_init_sync(struct fsdp_stream *s) {
  if (pthread_mutex_init(&s->mu, NULL) != 0) goto fail_mu;
  if (pthread_cond_init(&s->work_cv, NULL) != 0) goto fail_work;
  if (pthread_cond_init(&s->done_cv, NULL) != 0) goto fail_done;
  return FSDP_SUCCESS;
fail_done:
  pthread_cond_destroy(&s->work_cv);
fail_work:
  pthread_mutex_destroy(&s->mu);
fail_mu:
  return fsdp_error(FSDP_ERR_SYSTEM, "stream '%s': cannot create its mutex or condition "
                    "variables", s->name);
}

void fsdp_stream_fini_sync(struct fsdp_stream *s) {
  pthread_cond_destroy(&s->done_cv);
  pthread_cond_destroy(&s->work_cv);
  pthread_mutex_destroy(&s->mu);
}

/* Runs one task on the worker; returns its status and fills msg on failure. */
fsdp_status_t fsdp_task_call(struct fsdp_stream *s, task_t *t, char *msg) {
  fsdp_error_set(""); /* so a failure that sets no message is not given a stale one */
  fsdp_status_t st = t->fn(t->arg);
  if (st == FSDP_SUCCESS) return st;
  if (fsdp_last_error()[0])
    snprintf(msg, STREAM_ERROR_MAX, "%s", fsdp_last_error());
  else
    snprintf(msg, STREAM_ERROR_MAX, "stream '%s': a queued function failed (%s) without "
             "setting an error message", s->name, fsdp_status_string(st));
  return st;
}

void fsdp_stream_set_sticky(struct fsdp_stream *s, fsdp_status_t st, const char *msg) {
  if (st == FSDP_SUCCESS || s->error != FSDP_SUCCESS) return;
  s->error = st;
  snprintf(s->error_msg, STREAM_ERROR_MAX, "%s", msg);
}

/* Returns the sticky error, moving its text into this thread's last error. */
fsdp_status_t fsdp_stream_report_sticky(fsdp_status_t st, const char *msg) {
  if (st != FSDP_SUCCESS) fsdp_error_set(msg);
  return st;
}

fsdp_status_t fsdp_stream_sticky(struct fsdp_stream *s) {
  char msg[STREAM_ERROR_MAX];
  pthread_mutex_lock(&s->mu);
  fsdp_status_t st = s->error;
  if (st != FSDP_SUCCESS) memcpy(msg, s->error_msg, STREAM_ERROR_MAX);
  pthread_mutex_unlock(&s->mu);
  return fsdp_stream_report_sticky(st, msg);
}

