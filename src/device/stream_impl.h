/* src/device/stream_impl.h — the stream and event structs, shared by the CPU
 * streams (cpu_stream.c) and the CUDA streams (cuda_stream.c). Not installed.
 *
 * A CPU stream is a worker thread with a FIFO of tasks and two ticket
 * counters; an event recorded on it is (stream, ticket). A CUDA stream wraps a
 * cudaStream_t; an event recorded on it holds a reference to a cudaEvent made
 * for that record (struct cu_event), so a CPU worker that captured it waits
 * for exactly that point even if the fsdp_event is recorded again. */
#ifndef FSDP_DEVICE_STREAM_IMPL_H
#define FSDP_DEVICE_STREAM_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "fsdp/device.h"
#include "fsdp_config.h"

#define STREAM_NAME_MAX 16 /* pthread names are at most 15 chars + NUL */
#define STREAM_ERROR_MAX 1024

struct cu_event; /* cuda_stream.c: a reference-counted cudaEvent_t */

/* A queued unit of work: a host function, or (fn == NULL) a wait for another
 * stream to reach a ticket, or for a CUDA event (wait_cu, a reference this
 * task owns). Capturing the target at enqueue time, rather than the event,
 * means the event may be re-recorded or destroyed right away. */
typedef struct task {
  struct task *next;
  fsdp_host_fn fn;
  fsdp_host_fn on_skip; /* releases arg when the task is skipped; may be NULL */
  void *arg;
  struct fsdp_stream *wait_stream;
  uint64_t wait_ticket;
  struct cu_event *wait_cu;
  struct fsdp_stream *owner; /* CUDA host functions: the stream they ran on */
} task_t;

typedef struct stream_ops {
  fsdp_status_t (*enqueue)(struct fsdp_stream *s, task_t *t);
  fsdp_status_t (*synchronize)(struct fsdp_stream *s);
  void (*destroy)(struct fsdp_stream *s);
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
  struct cu_event *cu;        /* CUDA stream: the record's cudaEvent (one reference) */
};

/* Shared by both kinds (cpu_stream.c). */
fsdp_status_t fsdp_stream_init_sync(struct fsdp_stream *s);
void fsdp_stream_fini_sync(struct fsdp_stream *s);
/* Runs a task's host function, returning its status; on failure fills msg. */
fsdp_status_t fsdp_task_call(struct fsdp_stream *s, task_t *t, char *msg);
/* Records st/msg as s's sticky error if it has none yet (caller holds s->mu). */
void fsdp_stream_set_sticky(struct fsdp_stream *s, fsdp_status_t st, const char *msg);
/* Returns the sticky error, moving its text into this thread's last error. */
fsdp_status_t fsdp_stream_sticky(struct fsdp_stream *s);

#if FSDP_HAVE_CUDA
/* cuda_stream.c */
fsdp_status_t fsdp_cu_event_record(struct fsdp_event *e, struct fsdp_stream *s);
/* A new reference to e->cu (NULL when the last record was not on CUDA);
 * caller holds e->mu. */
struct cu_event *fsdp_cu_event_ref(struct fsdp_event *e);
void fsdp_cu_event_unref(struct cu_event *c);
/* Blocks until the record c names is done (cudaEventSynchronize). */
fsdp_status_t fsdp_cu_event_wait(struct cu_event *c);
int fsdp_cu_event_done(struct cu_event *c);
/* Later work on CUDA stream s waits for c (cudaStreamWaitEvent). */
fsdp_status_t fsdp_cu_stream_wait(struct fsdp_stream *s, struct cu_event *c);
#endif

#endif
