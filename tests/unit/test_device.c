/* tests/unit/test_device.c — CPU streams and events (src/device/cpu_stream.c):
 * FIFO order, events across streams, sticky errors, host stream, teardown.
 * Ordering is proven with gates the test thread opens, never with sleeps. */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/check_run.h"
#include "core/internal.h"
#include "device/stream_internal.h"
#include "fsdp/device.h"

/* A gate blocks tasks on a worker until the test thread opens it. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
} gate_t;

static void gate_init(gate_t *g) {
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->open = 0;
}

static void gate_open(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void gate_fini(gate_t *g) {
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

static fsdp_status_t gate_wait_task(void *arg) {
  gate_t *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  return FSDP_SUCCESS;
}

/* Counters touched only by stream workers; read after a synchronisation. */
static fsdp_status_t incr_task(void *arg) {
  (*(int *)arg)++;
  return FSDP_SUCCESS;
}

static fsdp_status_t fail_task(void *arg) {
  return fsdp_error(FSDP_ERR_COMM, "boom %d", *(int *)arg);
}

static fsdp_stream_t make_stream(const char *name) {
  fsdp_stream_t s = NULL;
  ck_assert_int_eq(fsdp_stream_create(name, &s), FSDP_SUCCESS);
  ck_assert_ptr_nonnull(s);
  return s;
}

static fsdp_event_t make_event(void) {
  fsdp_event_t e = NULL;
  ck_assert_int_eq(fsdp_event_create(&e), FSDP_SUCCESS);
  return e;
}

/* ---- order --------------------------------------------------------------- */

enum { N_ORDER = 20000 };
typedef struct {
  int log[N_ORDER];
  int n;
} order_t;
static order_t order_state;
static int order_ids[N_ORDER];

static fsdp_status_t append_task(void *arg) {
  order_state.log[order_state.n++] = *(int *)arg;
  return FSDP_SUCCESS;
}

START_TEST(fifo_order_across_many_tasks) {
  fsdp_stream_t s = make_stream("fifo");
  order_state.n = 0;
  for (int i = 0; i < N_ORDER; i++) {
    order_ids[i] = i;
    ck_assert_int_eq(fsdp_stream_launch(s, append_task, &order_ids[i]), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_stream_synchronize(s), FSDP_SUCCESS);
  ck_assert_int_eq(order_state.n, N_ORDER);
  for (int i = 0; i < N_ORDER; i++) ck_assert_int_eq(order_state.log[i], i);
  fsdp_stream_destroy(s);
}
END_TEST

/* ---- events -------------------------------------------------------------- */

START_TEST(record_then_synchronize) {
  fsdp_stream_t s = make_stream("rec");
  fsdp_event_t e = make_event();
  int count = 0;
  for (int i = 0; i < 100; i++) fsdp_stream_launch(s, incr_task, &count);
  ck_assert_int_eq(fsdp_event_record(e, s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_event_synchronize(e), FSDP_SUCCESS);
  ck_assert_int_eq(count, 100);
  ck_assert_int_eq(fsdp_event_query(e), 1);
  fsdp_event_destroy(e);
  fsdp_stream_destroy(s);
}
END_TEST

START_TEST(query_does_not_block) {
  fsdp_stream_t s = make_stream("query");
  fsdp_event_t e = make_event();
  ck_assert_int_eq(fsdp_event_query(e), 1); /* never recorded: complete */
  gate_t g;
  gate_init(&g);
  fsdp_stream_launch(s, gate_wait_task, &g);
  fsdp_event_record(e, s);
  ck_assert_int_eq(fsdp_event_query(e), 0); /* the gate holds the stream */
  gate_open(&g);
  ck_assert_int_eq(fsdp_event_synchronize(e), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_event_query(e), 1);
  fsdp_event_destroy(e);
  fsdp_stream_destroy(s);
  gate_fini(&g);
}
END_TEST

/* B's work is held by a gate; A waits for B's event, then observes B's flag. */
typedef struct {
  int b_done;
  int a_saw;
} xstream_t;

static fsdp_status_t b_finish(void *arg) {
  ((xstream_t *)arg)->b_done = 1;
  return FSDP_SUCCESS;
}

/* Queues on s the closed gate g, then x's b_finish, then a record of e: the
 * event completes, with x->b_done set, only once g opens. */
static void queue_gated_finish(fsdp_stream_t s, gate_t *g, xstream_t *x, fsdp_event_t e) {
  gate_init(g);
  fsdp_stream_launch(s, gate_wait_task, g);
  fsdp_stream_launch(s, b_finish, x);
  fsdp_event_record(e, s);
}

static fsdp_status_t a_observe(void *arg) {
  xstream_t *x = arg;
  x->a_saw = x->b_done;
  return FSDP_SUCCESS;
}

START_TEST(stream_waits_for_event_on_other_stream) {
  fsdp_stream_t a = make_stream("stream-a"), b = make_stream("stream-b");
  fsdp_event_t eb = make_event(), ea = make_event();
  gate_t g;
  xstream_t x = {0, 0};
  queue_gated_finish(b, &g, &x, eb);
  ck_assert_int_eq(fsdp_stream_wait_event(a, eb), FSDP_SUCCESS);
  fsdp_stream_launch(a, a_observe, &x);
  fsdp_event_record(ea, a);
  /* Re-recording eb must not change what A already waits for. */
  fsdp_event_record(eb, NULL);
  ck_assert_int_eq(fsdp_event_query(ea), 0); /* A is stuck behind B's gate */
  gate_open(&g);
  ck_assert_int_eq(fsdp_event_synchronize(ea), FSDP_SUCCESS);
  ck_assert_int_eq(x.a_saw, 1);
  fsdp_event_destroy(ea);
  fsdp_event_destroy(eb);
  fsdp_stream_destroy(a);
  fsdp_stream_destroy(b);
  gate_fini(&g);
}
END_TEST

/* A ping-pong chain: each hop waits for the other stream's last event. */
START_TEST(ping_pong_chain_keeps_order) {
  fsdp_stream_t s[2] = {make_stream("ping"), make_stream("pong")};
  fsdp_event_t e = make_event();
  order_state.n = 0;
  for (int i = 0; i < 1000; i++) {
    fsdp_stream_t cur = s[i % 2];
    order_ids[i] = i;
    ck_assert_int_eq(fsdp_stream_wait_event(cur, e), FSDP_SUCCESS);
    fsdp_stream_launch(cur, append_task, &order_ids[i]);
    fsdp_event_record(e, cur);
  }
  fsdp_stream_synchronize(s[0]);
  fsdp_stream_synchronize(s[1]);
  ck_assert_int_eq(order_state.n, 1000);
  for (int i = 0; i < 1000; i++) ck_assert_int_eq(order_state.log[i], i);
  fsdp_event_destroy(e);
  fsdp_stream_destroy(s[0]);
  fsdp_stream_destroy(s[1]);
}
END_TEST

START_TEST(wait_on_own_event_does_not_deadlock) {
  fsdp_stream_t s = make_stream("self-wait");
  fsdp_event_t e = make_event();
  int count = 0;
  fsdp_stream_launch(s, incr_task, &count);
  fsdp_event_record(e, s);
  ck_assert_int_eq(fsdp_stream_wait_event(s, e), FSDP_SUCCESS);
  fsdp_stream_launch(s, incr_task, &count);
  ck_assert_int_eq(fsdp_stream_synchronize(s), FSDP_SUCCESS);
  ck_assert_int_eq(count, 2);
  fsdp_event_destroy(e);
  fsdp_stream_destroy(s);
}
END_TEST

/* ---- sticky errors ------------------------------------------------------- */

START_TEST(sticky_error_reaches_every_waiter) {
  fsdp_stream_t s = make_stream("failing"), dep = make_stream("dependent");
  fsdp_event_t e = make_event();
  int code = 42, after = 0, dep_count = 0;
  fsdp_stream_launch(s, fail_task, &code);
  fsdp_stream_launch(s, incr_task, &after); /* must be skipped */
  fsdp_event_record(e, s);
  fsdp_stream_wait_event(dep, e);
  fsdp_stream_launch(dep, incr_task, &dep_count); /* skipped: dep inherits the error */

  fsdp_error_set("");
  ck_assert_int_eq(fsdp_stream_synchronize(s), FSDP_ERR_COMM);
  ck_assert_str_eq(fsdp_last_error(), "boom 42");
  ck_assert_int_eq(after, 0);

  fsdp_error_set("");
  ck_assert_int_eq(fsdp_event_synchronize(e), FSDP_ERR_COMM);
  ck_assert_str_eq(fsdp_last_error(), "boom 42");

  fsdp_error_set("");
  ck_assert_int_eq(fsdp_stream_synchronize(dep), FSDP_ERR_COMM);
  ck_assert_str_eq(fsdp_last_error(), "boom 42");
  ck_assert_int_eq(dep_count, 0);

  /* Sticky: later work is still skipped and later waits still fail. */
  fsdp_stream_launch(s, incr_task, &after);
  ck_assert_int_eq(fsdp_stream_synchronize(s), FSDP_ERR_COMM);
  ck_assert_int_eq(after, 0);
  fsdp_event_destroy(e);
  fsdp_stream_destroy(dep);
  fsdp_stream_destroy(s);
}
END_TEST

static fsdp_status_t silent_fail_task(void *arg) {
  (void)arg;
  return FSDP_ERR_INTERNAL; /* no message set */
}

START_TEST(failure_without_message_gets_one) {
  fsdp_stream_t s = make_stream("silent");
  int code = 1;
  /* A stale message on the worker thread must not be reported for the later one. */
  fsdp_stream_launch(s, fail_task, &code);
  ck_assert_int_eq(fsdp_stream_synchronize(s), FSDP_ERR_COMM);
  fsdp_stream_destroy(s);
  s = make_stream("silent");
  fsdp_stream_launch(s, silent_fail_task, NULL);
  ck_assert_int_eq(fsdp_stream_synchronize(s), FSDP_ERR_INTERNAL);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "stream 'silent'"));
  fsdp_stream_destroy(s);
}
END_TEST

static int skipped_releases;
static fsdp_status_t release_task(void *arg) {
  (void)arg;
  skipped_releases++;
  return FSDP_SUCCESS;
}

START_TEST(owned_launch_releases_skipped_work) {
  fsdp_stream_t s = make_stream("owned");
  int code = 7, ran = 0;
  skipped_releases = 0;
  fsdp_stream_launch_owned(s, incr_task, release_task, &ran);
  fsdp_stream_launch(s, fail_task, &code);
  fsdp_stream_launch_owned(s, incr_task, release_task, &ran);
  fsdp_stream_launch_owned(s, incr_task, release_task, &ran);
  ck_assert_int_eq(fsdp_stream_synchronize(s), FSDP_ERR_COMM);
  ck_assert_int_eq(ran, 1);
  ck_assert_int_eq(skipped_releases, 2);
  fsdp_stream_destroy(s);
}
END_TEST

/* ---- host stream ----------------------------------------------------------- */

static void *open_gate_thread(void *arg) {
  gate_open(arg);
  return NULL;
}

START_TEST(host_stream_runs_now) {
  int count = 0, code = 9;
  ck_assert_int_eq(fsdp_stream_launch(FSDP_HOST_STREAM, incr_task, &count), FSDP_SUCCESS);
  ck_assert_int_eq(count, 1);
  ck_assert_int_eq(fsdp_stream_launch(FSDP_HOST_STREAM, fail_task, &code), FSDP_ERR_COMM);
  ck_assert_str_eq(fsdp_last_error(), "boom 9");
  ck_assert_int_eq(fsdp_stream_synchronize(FSDP_HOST_STREAM), FSDP_SUCCESS);

  fsdp_event_t e = make_event();
  ck_assert_int_eq(fsdp_event_record(e, FSDP_HOST_STREAM), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_event_query(e), 1);
  ck_assert_int_eq(fsdp_event_synchronize(e), FSDP_SUCCESS);
  fsdp_event_destroy(e);
}
END_TEST

START_TEST(host_wait_event_blocks_caller) {
  fsdp_stream_t s = make_stream("host-wait");
  fsdp_event_t e = make_event();
  gate_t g;
  xstream_t x = {0, 0};
  queue_gated_finish(s, &g, &x, e);
  pthread_t opener;
  ck_assert_int_eq(pthread_create(&opener, NULL, open_gate_thread, &g), 0);
  ck_assert_int_eq(fsdp_stream_wait_event(FSDP_HOST_STREAM, e), FSDP_SUCCESS);
  ck_assert_int_eq(x.b_done, 1);
  pthread_join(opener, NULL);
  fsdp_event_destroy(e);
  fsdp_stream_destroy(s);
  gate_fini(&g);
}
END_TEST

/* ---- lifetime and arguments ---------------------------------------------- */

START_TEST(destroy_drains_queue) {
  fsdp_stream_t s = make_stream("drain");
  gate_t g;
  gate_init(&g);
  int count = 0;
  fsdp_stream_launch(s, gate_wait_task, &g);
  for (int i = 0; i < 5000; i++) fsdp_stream_launch(s, incr_task, &count);
  gate_open(&g);
  fsdp_stream_destroy(s); /* joins only after all 5000 ran */
  ck_assert_int_eq(count, 5000);
  gate_fini(&g);
}
END_TEST

static char seen_name[32];
static fsdp_status_t name_task(void *arg) {
  (void)arg;
  pthread_getname_np(pthread_self(), seen_name, sizeof seen_name);
  return FSDP_SUCCESS;
}

START_TEST(worker_thread_is_named) {
  fsdp_stream_t s = make_stream("a-very-long-stream-name");
  fsdp_stream_launch(s, name_task, NULL);
  fsdp_stream_synchronize(s);
  ck_assert_str_eq(seen_name, "a-very-long-str"); /* 15 characters */
  fsdp_stream_destroy(s);
}
END_TEST

START_TEST(invalid_arguments_are_reported) {
  ck_assert_int_eq(fsdp_stream_create("x", NULL), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "stream"));
  ck_assert_int_eq(fsdp_event_create(NULL), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_stream_launch(FSDP_HOST_STREAM, NULL, NULL), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_event_record(NULL, FSDP_HOST_STREAM), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_event_synchronize(NULL), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_stream_wait_event(FSDP_HOST_STREAM, NULL), FSDP_ERR_INVALID_ARGUMENT);
  fsdp_stream_destroy(NULL);
  fsdp_event_destroy(NULL);
}
END_TEST

/* Pinned memory: a round trip through device memory on a CUDA stream where a
 * GPU is usable; elsewhere a refusal that says what could not be pinned. */
START_TEST(pinned_memory_round_trip_or_clear_refusal) {
  void *p = &p;
  ck_assert_int_eq(fsdp_pinned_alloc(0, &p), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(p);
  ck_assert_int_eq(fsdp_pinned_alloc(64, NULL), FSDP_ERR_INVALID_ARGUMENT);
  enum { N = 4096 };
  fsdp_status_t st = fsdp_pinned_alloc(2 * N, &p);
  if (fsdp_cuda_device_count() == 0) {
    ck_assert_int_ne(st, FSDP_SUCCESS);
    ck_assert_ptr_null(p);
    ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "pin"));
    fsdp_pinned_free(NULL);
    return;
  }
  ck_assert_int_eq(st, FSDP_SUCCESS);
  unsigned char *h = p, *d = NULL;
  for (int i = 0; i < N; i++) h[i] = (unsigned char)(i * 7 + 3), h[N + i] = 0;
  fsdp_stream_t s;
  ck_assert_int_eq(fsdp_device_alloc(FSDP_DEVICE_CUDA, N, (void **)&d), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_create_cuda("pinned", 0, &s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_device_copy(d, h, N, s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_device_copy(h + N, d, N, s), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_stream_synchronize(s), FSDP_SUCCESS);
  ck_assert_int_eq(memcmp(h, h + N, N), 0);
  ck_assert_int_eq(fsdp_is_device_pointer(h), 0);
  fsdp_stream_destroy(s);
  fsdp_device_free(FSDP_DEVICE_CUDA, d);
  fsdp_pinned_free(p);
}
END_TEST

static Suite *device_suite(void) {
  Suite *s = suite_create("device");
  TCase *tc = tcase_create("cpu_stream");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, fifo_order_across_many_tasks);
  tcase_add_test(tc, record_then_synchronize);
  tcase_add_test(tc, query_does_not_block);
  tcase_add_test(tc, stream_waits_for_event_on_other_stream);
  tcase_add_test(tc, ping_pong_chain_keeps_order);
  tcase_add_test(tc, wait_on_own_event_does_not_deadlock);
  tcase_add_test(tc, sticky_error_reaches_every_waiter);
  tcase_add_test(tc, failure_without_message_gets_one);
  tcase_add_test(tc, owned_launch_releases_skipped_work);
  tcase_add_test(tc, host_stream_runs_now);
  tcase_add_test(tc, host_wait_event_blocks_caller);
  tcase_add_test(tc, destroy_drains_queue);
  tcase_add_test(tc, worker_thread_is_named);
  tcase_add_test(tc, invalid_arguments_are_reported);
  tcase_add_test(tc, pinned_memory_round_trip_or_clear_refusal);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return check_run(device_suite()); }
