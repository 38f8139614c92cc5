/* src/device/cpu_stream.c — CPU streams and events (include/fsdp/device.h).
 *
 * A stream is a worker thread draining a FIFO of host functions. Progress is two
 * monotonic ticket counters per stream: `enqueued` (tasks ever queued) and
 * `completed` (tasks ever finished or skipped). An event is (stream, ticket): the
 * value of `enqueued` when it was recorded; it is complete once the stream's
 * `completed` reaches that ticket. Nothing polls or sleeps: workers wait on
 * `work_cv` for tasks, and everyone waiting for progress waits on `done_cv`.
 *
 * The public functions dispatch through a small ops table so that a CUDA stream
 * (cudaLaunchHostFunc, cudaEventRecord, cudaStreamWaitEvent) can slot in beside
 * this one without the callers changing; its event records reach this file
 * through their own table (stream_impl.h), never by name. */
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "core/internal.h"
#include "device/stream_impl.h"
#include "device/stream_internal.h"
#include "fsdp/device.h"

/* ---- worker side --------------------------------------------------------- */

/* Blocks until s has completed `ticket` tasks; returns its sticky error and
 * copies the message into msg (STREAM_ERROR_MAX bytes) when there is one. */
static fsdp_status_t stream_wait_ticket(struct fsdp_stream *s, uint64_t ticket, char *msg) {
  pthread_mutex_lock(&s->mu);
  while (s->completed < ticket) pthread_cond_wait(&s->done_cv, &s->mu);
  fsdp_status_t st = s->error;
  if (st != FSDP_SUCCESS) memcpy(msg, s->error_msg, STREAM_ERROR_MAX);
  pthread_mutex_unlock(&s->mu);
  return st;
}

static fsdp_status_t task_run(struct fsdp_stream *s, task_t *t, char *msg) {
  if (t->wait_rec) {
    fsdp_status_t st = t->wait_rec->ops->wait(t->wait_rec);
    if (st != FSDP_SUCCESS) snprintf(msg, STREAM_ERROR_MAX, "%s", fsdp_last_error());
    return st;
  }
  if (!t->fn) {
    if (t->wait_stream == s) return FSDP_SUCCESS; /* FIFO already orders it */
    return stream_wait_ticket(t->wait_stream, t->wait_ticket, msg);
  }
  return fsdp_task_call(s, t, msg);
}

static void task_free(task_t *t) {
  if (t->wait_rec) t->wait_rec->ops->unref(t->wait_rec);
  fsdp_free(t);
}

static void *stream_worker(void *arg) {
  struct fsdp_stream *s = arg;
  char msg[STREAM_ERROR_MAX];
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stopping) pthread_cond_wait(&s->work_cv, &s->mu);
    if (!s->head) break; /* stopping and drained */
    task_t *t = s->head;
    s->head = t->next;
    if (!s->head) s->tail = NULL;
    int skip = s->error != FSDP_SUCCESS;
    pthread_mutex_unlock(&s->mu);

    fsdp_status_t st = FSDP_SUCCESS;
    if (!skip)
      st = task_run(s, t, msg);
    else if (t->on_skip)
      t->on_skip(t->arg);
    task_free(t);

    pthread_mutex_lock(&s->mu);
    fsdp_stream_set_sticky(s, st, msg);
    /* Skipped tasks count as completed so that no waiter hangs on a failure. */
    s->completed++;
    pthread_cond_broadcast(&s->done_cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* ---- CPU ops ------------------------------------------------------------- */

static fsdp_status_t cpu_enqueue(struct fsdp_stream *s, task_t *t) {
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = t;
  else
    s->head = t;
  s->tail = t;
  s->enqueued++;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  return FSDP_SUCCESS;
}

static fsdp_status_t cpu_synchronize(struct fsdp_stream *s) {
  char msg[STREAM_ERROR_MAX];
  pthread_mutex_lock(&s->mu);
  uint64_t ticket = s->enqueued;
  pthread_mutex_unlock(&s->mu);
  return fsdp_stream_report_sticky(stream_wait_ticket(s, ticket, msg), msg);
}

static void cpu_destroy(struct fsdp_stream *s) {
  pthread_mutex_lock(&s->mu);
  s->stopping = 1;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL); /* the worker drains the queue before it exits */
  fsdp_stream_fini_sync(s);
  fsdp_free(s);
}

static const stream_ops_t cpu_ops = {
    .enqueue = cpu_enqueue,
    .synchronize = cpu_synchronize,
    .destroy = cpu_destroy,
};

/* ---- public API ---------------------------------------------------------- */

fsdp_status_t fsdp_stream_create(const char *name, fsdp_stream_t *stream) {
  if (!stream) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_stream_create: stream is NULL");
  const char *label = name && *name ? name : "fsdp-stream";
  struct fsdp_stream *s = fsdp_alloc(sizeof *s);
  if (!s)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "stream '%s': cannot allocate it", label);
  s->ops = &cpu_ops;
  s->kind = FSDP_DEVICE_CPU;
  snprintf(s->name, sizeof s->name, "%s", label); /* truncated to 15 chars */
  fsdp_status_t st = fsdp_stream_init_sync(s);
  if (st != FSDP_SUCCESS) {
    fsdp_free(s);
    return st;
  }
  int rc = pthread_create(&s->thread, NULL, stream_worker, s);
  if (rc != 0) {
    fsdp_stream_fini_sync(s);
    fsdp_free(s);
    return fsdp_error(FSDP_ERR_SYSTEM, "stream '%s': pthread_create failed (%s); check the "
                      "process thread limit (ulimit -u)", label, strerror(rc));
  }
  /* Naming is cosmetic (debuggers, top -H); its failure is not an error. */
  pthread_setname_np(s->thread, s->name);
  *stream = s;
  return FSDP_SUCCESS;
}

void fsdp_stream_destroy(fsdp_stream_t stream) {
  if (stream) stream->ops->destroy(stream);
}

fsdp_status_t fsdp_stream_synchronize(fsdp_stream_t stream) {
  if (!stream) return FSDP_SUCCESS; /* host work is done when its call returns */
  return stream->ops->synchronize(stream);
}

static fsdp_status_t stream_push(fsdp_stream_t stream, fsdp_host_fn fn,
                                 fsdp_host_fn on_skip, void *arg,
                                 struct fsdp_stream *wait_stream, uint64_t wait_ticket) {
  task_t *t = fsdp_alloc(sizeof *t);
  if (!t)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "stream '%s': cannot allocate a task",
                      stream->name);
  t->fn = fn;
  t->on_skip = on_skip;
  t->arg = arg;
  t->wait_stream = wait_stream;
  t->wait_ticket = wait_ticket;
  return stream->ops->enqueue(stream, t);
}

fsdp_status_t fsdp_stream_launch(fsdp_stream_t stream, fsdp_host_fn fn, void *arg) {
  if (!fn) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_stream_launch: fn is NULL");
  if (!stream) return fn(arg);
  return stream_push(stream, fn, NULL, arg, NULL, 0);
}

fsdp_status_t fsdp_stream_launch_owned(fsdp_stream_t stream, fsdp_host_fn fn,
                                       fsdp_host_fn on_skip, void *arg) {
  if (!fn) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_stream_launch_owned: fn is NULL");
  if (!stream) return fn(arg);
  return stream_push(stream, fn, on_skip, arg, NULL, 0);
}

fsdp_status_t fsdp_event_create(fsdp_event_t *event) {
  if (!event) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_event_create: event is NULL");
  struct fsdp_event *e = fsdp_alloc(sizeof *e);
  if (!e) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_event_create: cannot allocate an event");
  if (pthread_mutex_init(&e->mu, NULL) != 0) {
    fsdp_free(e);
    return fsdp_error(FSDP_ERR_SYSTEM, "fsdp_event_create: cannot create its mutex");
  }
  *event = e;
  return FSDP_SUCCESS;
}

/* Drops the record an event holds, if any; caller holds event->mu. */
static void event_drop_rec(fsdp_event_t event) {
  if (event->rec) event->rec->ops->unref(event->rec);
  event->rec = NULL;
}

void fsdp_event_destroy(fsdp_event_t event) {
  if (!event) return;
  event_drop_rec(event);
  pthread_mutex_destroy(&event->mu);
  fsdp_free(event);
}

fsdp_status_t fsdp_event_record(fsdp_event_t event, fsdp_stream_t stream) {
  if (!event) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_event_record: event is NULL");
  if (stream && stream->ops->record) return stream->ops->record(event, stream);
  uint64_t ticket = 0;
  if (stream) {
    pthread_mutex_lock(&stream->mu);
    ticket = stream->enqueued;
    pthread_mutex_unlock(&stream->mu);
  }
  pthread_mutex_lock(&event->mu);
  event_drop_rec(event);
  event->stream = stream;
  event->ticket = ticket;
  pthread_mutex_unlock(&event->mu);
  return FSDP_SUCCESS;
}

/* The (stream, ticket) an event names right now; stream NULL means complete.
 * When the last record was on a CUDA stream, *rec gets a reference to it (the
 * caller drops it) and the ticket is meaningless. */
static struct fsdp_stream *event_target(fsdp_event_t event, uint64_t *ticket,
                                        record_t **rec) {
  pthread_mutex_lock(&event->mu);
  struct fsdp_stream *s = event->stream;
  *ticket = event->ticket;
  *rec = event->rec ? event->rec->ops->ref(event->rec) : NULL;
  pthread_mutex_unlock(&event->mu);
  return s;
}

fsdp_status_t fsdp_event_synchronize(fsdp_event_t event) {
  if (!event)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_event_synchronize: event is NULL");
  uint64_t ticket;
  record_t *rec;
  struct fsdp_stream *s = event_target(event, &ticket, &rec);
  if (!s) return FSDP_SUCCESS;
  if (rec) {
    fsdp_status_t st = rec->ops->wait(rec);
    rec->ops->unref(rec);
    return st != FSDP_SUCCESS ? st : fsdp_stream_sticky(s);
  }
  char msg[STREAM_ERROR_MAX];
  return fsdp_stream_report_sticky(stream_wait_ticket(s, ticket, msg), msg);
}

fsdp_status_t fsdp_stream_wait_event(fsdp_stream_t stream, fsdp_event_t event) {
  if (!event)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_stream_wait_event: event is NULL");
  if (!stream) return fsdp_event_synchronize(event);
  uint64_t ticket;
  record_t *rec;
  struct fsdp_stream *s = event_target(event, &ticket, &rec);
  if (!s) return FSDP_SUCCESS; /* already complete: nothing to order against */
  if (stream->ops->wait_record) {
    if (!rec) return fsdp_event_synchronize(event); /* a CPU event: the host waits */
    fsdp_status_t st = stream->ops->wait_record(stream, rec);
    rec->ops->unref(rec);
    return st;
  }
  if (rec) { /* a CPU worker waits for a CUDA record: the task owns the reference */
    task_t *t = fsdp_alloc(sizeof *t);
    if (!t) {
      rec->ops->unref(rec);
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "stream '%s': cannot allocate a task",
                        stream->name);
    }
    t->wait_rec = rec;
    return stream->ops->enqueue(stream, t);
  }
  return stream_push(stream, NULL, NULL, NULL, s, ticket);
}

int fsdp_event_query(fsdp_event_t event) {
  if (!event) return 1;
  uint64_t ticket;
  record_t *rec;
  struct fsdp_stream *s = event_target(event, &ticket, &rec);
  if (!s) return 1;
  if (rec) {
    int done = rec->ops->done(rec);
    rec->ops->unref(rec);
    return done;
  }
  pthread_mutex_lock(&s->mu);
  int done = s->completed >= ticket;
  pthread_mutex_unlock(&s->mu);
  return done;
}
