/* src/device/stream_impl.h — the stream and event structs and the tables
 * through which the stream kinds, CPU (cpu_stream.c) and CUDA
 * (cuda_stream.c), meet: neither calls the other. Not installed.
 *
 * A CPU stream is a worker thread with a FIFO of tasks and two ticket
 * counters; an event recorded on it is (stream, ticket). A CUDA stream wraps a
 * cudaStream_t; an event recorded on it holds a reference to a record, a
 * cudaEvent made for that record, so a CPU worker that captured it waits
 * for exactly that point even if the fsdp_event is recorded again. */
#ifndef FSDP_DEVICE_STREAM_IMPL_H
#define FSDP_DEVICE_STREAM_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "fsdp/device.h"

#define STREAM_NAME_MAX 16 /* pthread names are at most 15 chars + NUL */
#define STREAM_ERROR_MAX 1024

/* A point recorded on a stream whose work runs off the host (CUDA: a
 * reference-counted cudaEvent_t, cuda_stream.c). It carries the functions
 * that use it, so the CPU side holds, waits for and drops one knowing no
 * CUDA. A kind's record struct begins with this one. */
typedef struct record {
  const struct record_ops *ops;
} record_t;

typedef struct record_ops {
  record_t *(*ref)(record_t *r);      /* a new reference to r, returned */
  void (*unref)(record_t *r);         /* drops one reference */
  fsdp_status_t (*wait)(record_t *r); /* blocks until the point is reached */
  int (*done)(record_t *r);           /* 1 once it is reached; never waits */
} record_ops_t;

/* A queued unit of work: a host function, or (fn == NULL) a wait for another
 * stream to reach a ticket, or for a record (wait_rec, a reference this task
 * owns). Capturing the target at enqueue time, rather than the event,
 * means the event may be re-recorded or destroyed right away. */
typedef struct task {
  struct task *next;
  fsdp_host_fn fn;
  fsdp_host_fn on_skip; /* releases arg when the task is skipped; may be NULL */
  void *arg;
  struct fsdp_stream *wait_stream;
  uint64_t wait_ticket;
  record_t *wait_rec;
  struct fsdp_stream *owner; /* CUDA host functions: the stream they ran on */
} task_t;

typedef struct stream_ops {
  fsdp_status_t (*enqueue)(struct fsdp_stream *s, task_t *t);
  fsdp_status_t (*synchronize)(struct fsdp_stream *s);
  void (*destroy)(struct fsdp_stream *s);
  /* Kinds that record their own points (CUDA): record one into e (its record
   * replaced, its stream set to s), and order later work on s after record r.
   * NULL for the CPU kind, whose events are tickets and whose waits are tasks. */
  fsdp_status_t (*record)(struct fsdp_event *e, struct fsdp_stream *s);
  fsdp_status_t (*wait_record)(struct fsdp_stream *s, record_t *r);
} stream_ops_t;

struct fsdp_stream {
  const stream_ops_t *ops;
  fsdp_device_kind_t kind;
  char name[STREAM_NAME_MAX];
  pthread_t thread;        /* CPU: the worker */
  void *cuda;              /* CUDA: the cudaStream_t */
  int device;              /* CUDA: the device it was created on */
  pthread_mutex_t mu;      /* guards everything below */
  pthread_cond_t work_cv;  /* worker: a task arrived or stop was asked */
  pthread_cond_t done_cv;  /* waiters: `completed` advanced */
  task_t *head, *tail;     /* unbounded FIFO */
  uint64_t enqueued;       /* tasks ever queued */
  uint64_t completed;      /* tasks ever run or skipped */
  int stopping;
  /* Sticky error: the first failure and its text, taken on the worker thread
   * (CUDA: in the host function's callback). */
  fsdp_status_t error;
  char error_msg[STREAM_ERROR_MAX];
};

struct fsdp_event {
  pthread_mutex_t mu; /* record and wait may happen on different threads */
  struct fsdp_stream *stream; /* NULL: never recorded or host stream (complete) */
  uint64_t ticket;            /* CPU stream */
  record_t *rec;              /* CUDA stream: the record (one reference) */
};

/* Shared by both kinds (stream_impl.c). */
fsdp_status_t fsdp_stream_init_sync(struct fsdp_stream *s);
void fsdp_stream_fini_sync(struct fsdp_stream *s);
/* Runs a task's host function, returning its status; on failure fills msg. */
fsdp_status_t fsdp_task_call(struct fsdp_stream *s, task_t *t, char *msg);
/* Records st/msg as s's sticky error if it has none yet (caller holds s->mu). */
void fsdp_stream_set_sticky(struct fsdp_stream *s, fsdp_status_t st, const char *msg);
/* Returns the sticky error, moving its text into this thread's last error. */
fsdp_status_t fsdp_stream_sticky(struct fsdp_stream *s);
/* Returns st, moving msg into this thread's last error when st is a failure. */
fsdp_status_t fsdp_stream_report_sticky(fsdp_status_t st, const char *msg);

#endif
