/* tests/launch/test_store.c — the env:// key-value store (src/world/store.h)
 * in one process: a server thread and clients on loopback. Values round-trip
 * byte for byte, a get waits for a set from another client, counters add up
 * under concurrent clients, every deadline is honoured and named, and a
 * client that reaches nothing, or something that is not a store, or another
 * job's store, or a server that went away, fails with a message saying so. */
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/check_run.h"
#include "core/internal.h"
#include "world/store.h"

static fsdp_store_server_t *server;
static int port;
static fsdp_store_t *client;

static void setup(void) {
  ck_assert_int_eq(fsdp_store_server_start(0, NULL, &server, &port), FSDP_SUCCESS);
  ck_assert_int_gt(port, 0);
  ck_assert_int_eq(fsdp_store_connect("127.0.0.1", port, NULL, 5.0, &client), FSDP_SUCCESS);
}

static void teardown(void) {
  fsdp_store_close(client);
  fsdp_store_server_stop(server);
}

START_TEST(values_round_trip) {
  const char bytes[] = {'a', 0, 'b', (char)0xff, 0};
  char *v = NULL;
  size_t n = 0;
  ck_assert_int_eq(fsdp_store_set(client, "k", bytes, sizeof bytes), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_store_get(client, "k", 0, &v, &n), FSDP_SUCCESS);
  ck_assert_uint_eq(n, sizeof bytes);
  ck_assert_int_eq(memcmp(v, bytes, n), 0);
  fsdp_free(v);
  ck_assert_int_eq(fsdp_store_set(client, "k", "xyz", 3), FSDP_SUCCESS); /* overwrite */
  ck_assert_int_eq(fsdp_store_get(client, "k", 0, &v, &n), FSDP_SUCCESS);
  ck_assert_str_eq(v, "xyz");
  fsdp_free(v);
  ck_assert_int_eq(fsdp_store_set(client, "empty", "", 0), FSDP_SUCCESS);
  int exists = 0;
  ck_assert_int_eq(fsdp_store_check(client, "empty", &exists), FSDP_SUCCESS);
  ck_assert_int_eq(exists, 1);
  ck_assert_int_eq(fsdp_store_check(client, "nothing", &exists), FSDP_SUCCESS);
  ck_assert_int_eq(exists, 0);
}
END_TEST

/* A get for a missing key answers at once with timeout 0, or after (not
 * much after) its timeout, and says which key on which store. */
START_TEST(missing_key_times_out) {
  char *v = NULL;
  double t0 = fsdp_time_now();
  ck_assert_int_eq(fsdp_store_get(client, "absent", 0, &v, NULL), FSDP_ERR_TIMEOUT);
  ck_assert_double_lt(fsdp_time_now() - t0, 1.0);
  t0 = fsdp_time_now();
  ck_assert_int_eq(fsdp_store_get(client, "absent", 0.3, &v, NULL), FSDP_ERR_TIMEOUT);
  double waited = fsdp_time_now() - t0;
  ck_assert_double_ge(waited, 0.3);
  ck_assert_double_lt(waited, 2.0);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "'absent'"));
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "127.0.0.1"));
  const char *keys[] = {"present", "absent"};
  int missing = -1;
  ck_assert_int_eq(fsdp_store_set(client, "present", "1", 1), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_store_wait(client, keys, 2, 0.2, &missing), FSDP_ERR_TIMEOUT);
  ck_assert_int_eq(missing, 1);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "'absent' (2 of 2 awaited)"));
}
END_TEST

/* Another client: announces itself, then waits for a key the test sets. */
static void *get_late(void *arg) {
  char **out = arg;
  fsdp_store_t *other = NULL;
  if (fsdp_store_connect("127.0.0.1", port, NULL, 5.0, &other) == FSDP_SUCCESS &&
      fsdp_store_set(other, "ready", "1", 1) == FSDP_SUCCESS)
    fsdp_store_get(other, "late", 10.0, out, NULL);
  fsdp_store_close(other);
  return NULL;
}

/* A get parked on the server is answered by another client's set (or, when
 * the set wins the race, answered at once: both orders must work). */
START_TEST(get_waits_for_a_set) {
  pthread_t t;
  char *got = NULL, *ready = NULL;
  ck_assert_int_eq(pthread_create(&t, NULL, get_late, &got), 0);
  ck_assert_int_eq(fsdp_store_get(client, "ready", 10.0, &ready, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_store_set(client, "late", "here", 4), FSDP_SUCCESS);
  pthread_join(t, NULL);
  ck_assert_ptr_nonnull(got);
  ck_assert_str_eq(got, "here");
  fsdp_free(got);
  fsdp_free(ready);
}
END_TEST

#define ADDERS 4
#define ADDS 200

static void *add_many(void *arg) {
  fsdp_store_t *c = NULL;
  int *failures = arg;
  if (fsdp_store_connect("127.0.0.1", port, NULL, 5.0, &c) != FSDP_SUCCESS) {
    (*failures)++;
    return NULL;
  }
  for (int i = 0; i < ADDS; i++)
    if (fsdp_store_add(c, "counter", 1, NULL) != FSDP_SUCCESS) (*failures)++;
  fsdp_store_close(c);
  return NULL;
}

START_TEST(counters_add_up_across_clients) {
  pthread_t t[ADDERS];
  int failures[ADDERS] = {0};
  for (int i = 0; i < ADDERS; i++) ck_assert_int_eq(pthread_create(&t[i], NULL, add_many, &failures[i]), 0);
  for (int i = 0; i < ADDERS; i++) {
    pthread_join(t[i], NULL);
    ck_assert_int_eq(failures[i], 0);
  }
  int64_t v = 0;
  ck_assert_int_eq(fsdp_store_add(client, "counter", -1, &v), FSDP_SUCCESS);
  ck_assert_int_eq(v, ADDERS * ADDS - 1);
  char *text = NULL;
  ck_assert_int_eq(fsdp_store_get(client, "counter", 0, &text, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(atoll(text), ADDERS * ADDS - 1);
  fsdp_free(text);
  ck_assert_int_eq(fsdp_store_set(client, "word", "abc", 3), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_store_add(client, "word", 1, NULL), FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "'word'"));
}
END_TEST

START_TEST(bad_keys_are_refused_before_sending) {
  char big[FSDP_STORE_KEY_MAX + 2];
  memset(big, 'k', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  ck_assert_int_eq(fsdp_store_set(client, big, "v", 1), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_store_set(client, "", "v", 1), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_store_set(client, "fine", "v", 1), FSDP_SUCCESS); /* still in step */
}
END_TEST

/* The server going away fails the next request with a clear message. */
START_TEST(lost_server_is_named) {
  fsdp_store_server_stop(server);
  server = NULL;
  ck_assert_int_eq(fsdp_store_set(client, "k", "v", 1), FSDP_ERR_COMM);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "rank 0"));
}
END_TEST

/* ---- without a fixture --------------------------------------------------- */

START_TEST(nothing_listening_times_out) {
  int p = 0;
  fsdp_store_server_t *s = NULL;
  ck_assert_int_eq(fsdp_store_server_start(0, NULL, &s, &p), FSDP_SUCCESS);
  fsdp_store_server_stop(s); /* now nothing listens on p */
  fsdp_store_t *c = NULL;
  double t0 = fsdp_time_now();
  ck_assert_int_eq(fsdp_store_connect("127.0.0.1", p, NULL, 0.5, &c), FSDP_ERR_TIMEOUT);
  ck_assert_double_lt(fsdp_time_now() - t0, 3.0);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "cannot reach 127.0.0.1"));
  ck_assert_int_eq(fsdp_store_connect("no-such-host.invalid", p, NULL, 0.2, &c), FSDP_ERR_TIMEOUT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "no-such-host.invalid"));
}
END_TEST

/* A service that reads the request, answers something else, and closes
 * only after the client has. */
static void *answer_garbage(void *arg) {
  int fd = accept(*(int *)arg, NULL, NULL);
  if (fd >= 0) {
    char junk[64];
    if (read(fd, junk, sizeof junk) > 0) {
      memset(junk, 'H', sizeof junk); /* what an HTTP server might start with */
      if (write(fd, junk, sizeof junk) < 0) {
      }
      while (read(fd, junk, sizeof junk) > 0) {
      }
    }
    close(fd);
  }
  return NULL;
}

START_TEST(another_service_is_not_a_store) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  ck_assert_int_eq(bind(l, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(listen(l, 1), 0);
  getsockname(l, (struct sockaddr *)&a, &len);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, answer_garbage, &l), 0);
  fsdp_store_t *c = NULL;
  fsdp_status_t st = fsdp_store_connect("127.0.0.1", ntohs(a.sin_port), NULL, 2.0, &c);
  pthread_join(t, NULL);
  close(l);
  ck_assert_int_eq(st, FSDP_ERR_COMM);
  ck_assert_msg(strstr(fsdp_last_error(), "not an fsdp store") ||
                    strstr(fsdp_last_error(), "more than the protocol allows"),
                "message: %s", fsdp_last_error());
}
END_TEST

START_TEST(busy_port_is_named) {
  fsdp_store_server_t *s = NULL, *again = NULL;
  int p = 0;
  ck_assert_int_eq(fsdp_store_server_start(0, NULL, &s, &p), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_store_server_start(p, NULL, &again, NULL), FSDP_ERR_COMM);
  char want[32];
  snprintf(want, sizeof want, "port %d", p);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), want));
  fsdp_store_server_stop(s);
}
END_TEST

/* A store serves its own job only: a client of another job (or of none) is
 * turned away at once, naming both ids, and never touches the job's keys. */
START_TEST(another_job_is_turned_away) {
  fsdp_store_server_t *s = NULL;
  fsdp_store_t *mine = NULL, *stranger = NULL;
  int p = 0;
  ck_assert_int_eq(fsdp_store_server_start(0, "job-a", &s, &p), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_store_connect("127.0.0.1", p, "job-a", 5.0, &mine), FSDP_SUCCESS);
  double t0 = fsdp_time_now();
  ck_assert_int_eq(fsdp_store_connect("127.0.0.1", p, "job-b", 5.0, &stranger),
                   FSDP_ERR_INVALID_USAGE);
  ck_assert_double_lt(fsdp_time_now() - t0, 2.0); /* refused, not retried until 5 s */
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "belongs to job 'job-a'"));
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "job 'job-b'"));
  ck_assert_int_eq(fsdp_store_connect("127.0.0.1", p, NULL, 5.0, &stranger),
                   FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "job ''"));
  int64_t claims = 0;
  ck_assert_int_eq(fsdp_store_add(mine, "rdzv/claim/1", 1, &claims), FSDP_SUCCESS);
  ck_assert_int_eq(claims, 1);
  fsdp_store_close(mine);
  fsdp_store_server_stop(s);
}
END_TEST

static Suite *store_suite(void) {
  Suite *s = suite_create("store");
  TCase *tc = tcase_create("server");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, values_round_trip);
  tcase_add_test(tc, missing_key_times_out);
  tcase_add_test(tc, get_waits_for_a_set);
  tcase_add_test(tc, counters_add_up_across_clients);
  tcase_add_test(tc, bad_keys_are_refused_before_sending);
  tcase_add_test(tc, lost_server_is_named);
  suite_add_tcase(s, tc);
  TCase *bare = tcase_create("connect");
  tcase_add_test(bare, nothing_listening_times_out);
  tcase_add_test(bare, another_service_is_not_a_store);
  tcase_add_test(bare, busy_port_is_named);
  tcase_add_test(bare, another_job_is_turned_away);
  suite_add_tcase(s, bare);
  return s;
}

int main(void) { return check_run(store_suite()); }
