/* src/world/store.c — the store's client (world/store.h) and the socket helpers
 * both ends share. A client is one TCP connection doing one request at a time;
 * every wait has a deadline, and a get's wait happens on the server, so the
 * client only adds a margin for the network before it declares the server
 * gone. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "world/store.h"
#include "world/store_proto.h"

/* How long past a get's own timeout the client waits for the server's answer
 * before it declares the connection dead. */
#define STORE_NET_MARGIN_S 10.0

struct fsdp_store {
  int fd;
  char addr[300]; /* "host:port" for messages */
  pthread_mutex_t mu;
};

/* ---- sockets ------------------------------------------------------------- */

int fsdp_sock_tune(int fd) {
  int one = 1, fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return -1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* not on listeners: harmless */
  return 0;
}

/* Waits for events on fd until the deadline: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, double deadline) {
  for (;;) {
    double left = deadline - fsdp_time_now();
    if (left <= 0) return 0;
    struct pollfd p = {fd, events, 0};
    int rc = poll(&p, 1, (int)(left * 1000.0) + 1);
    if (rc > 0) return 1;
    if (rc < 0 && errno != EINTR) return -1;
  }
}

int fsdp_sock_send_all(int fd, const void *buf, size_t n, double deadline) {
  const char *p = buf;
  while (n) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EINTR) return -1;
    int w = wait_fd(fd, POLLOUT, deadline);
    if (w <= 0) return errno = w == 0 ? ETIMEDOUT : errno, -1;
  }
  return 0;
}

int fsdp_sock_recv_all(int fd, void *buf, size_t n, double deadline) {
  char *p = buf;
  while (n) {
    ssize_t k = recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k == 0) return errno = EPIPE, -1;
    if (errno != EAGAIN && errno != EINTR) return -1;
    int w = wait_fd(fd, POLLIN, deadline);
    if (w <= 0) return errno = w == 0 ? ETIMEDOUT : errno, -1;
  }
  return 0;
}

/* ---- connecting ---------------------------------------------------------- */

/* One attempt at each address of host:port, each bounded by the deadline.
 * Returns a connected, tuned socket or -1 with the reason in err. */
static int try_connect(const char *host, int port, double deadline, char *err, size_t errn) {
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  int rc = getaddrinfo(host, service, &hints, &res);
  if (rc) {
    snprintf(err, errn, "cannot resolve '%s': %s", host, gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0 || fsdp_sock_tune(fd)) goto next;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    if (errno != EINPROGRESS) goto next;
    int w = wait_fd(fd, POLLOUT, deadline), soerr = 0;
    socklen_t len = sizeof soerr;
    if (w == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0) break;
    errno = w == 0 ? ETIMEDOUT : soerr ? soerr : errno;
  next:;
    int saved = errno;
    snprintf(err, errn, "%s", strerror(saved));
    if (fd >= 0) close(fd);
    fd = -1;
    errno = saved;
  }
  int saved = errno; /* what the caller reads when fd < 0 */
  freeaddrinfo(res);
  errno = saved;
  return fd;
}

static void pause_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

/* Connects, retrying with a growing pause (the server may start later than
 * its clients) until the deadline. err keeps the most telling failure: an
 * attempt cut short by the deadline says less than a refusal before it. */
static int connect_retrying(const char *host, int port, double deadline, char *err, size_t n) {
  double pause = 0.05;
  for (int tries = 0;; tries++) {
    double left = deadline - fsdp_time_now();
    double attempt = fsdp_time_now() + (left < 2.0 ? left : 2.0);
    char why[256];
    int fd = try_connect(host, port, attempt, why, sizeof why);
    if (fd >= 0) return fd;
    if (tries == 0 || errno != ETIMEDOUT) snprintf(err, n, "%s", why);
    left = deadline - fsdp_time_now();
    if (left <= 0) return -1;
    pause_s(pause < left ? pause : left);
    pause = pause * 2 < 1.0 ? pause * 2 : 1.0;
  }
}

/* ---- requests ------------------------------------------------------------ */

typedef struct {
  int status;
  int64_t arg;
  char *val; /* NUL-terminated, fsdp_free; NULL when empty */
  size_t len;
} store_reply_t;

static fsdp_status_t io_error(fsdp_store_t *s, const char *what, const char *key, double waited) {
  if (errno == ETIMEDOUT)
    return fsdp_error(FSDP_ERR_COMM, "store %s: no answer to %s('%s') within %.1f s; the "
                      "store's server (rank 0) is stuck or unreachable", s->addr, what, key,
                      waited);
  return fsdp_error(FSDP_ERR_COMM, "store %s: %s('%s') failed: %s; the store's server "
                    "(rank 0) has exited or the network broke", s->addr, what, key,
                    errno == EPIPE ? "connection closed" : strerror(errno));
}

static fsdp_status_t recv_reply(fsdp_store_t *s, const char *what, const char *key,
                                double deadline, double waited, store_reply_t *r) {
  uint8_t h[STORE_REP_BYTES];
  if (fsdp_sock_recv_all(s->fd, h, sizeof h, deadline)) return io_error(s, what, key, waited);
  r->status = h[0];
  r->len = store_get_u32(h + 4);
  r->arg = store_get_i64(h + 8);
  r->val = NULL;
  if (r->len > FSDP_STORE_VALUE_MAX)
    return fsdp_error(FSDP_ERR_COMM, "store %s: %s('%s') got a %zu-byte value, more than "
                      "the protocol allows: the peer is not an fsdp store", s->addr, what, key,
                      r->len);
  if (!(r->val = fsdp_alloc(r->len + 1)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "store %s: %s('%s'): %zu bytes", s->addr, what,
                      key, r->len);
  if (fsdp_sock_recv_all(s->fd, r->val, r->len, deadline)) {
    fsdp_free(r->val);
    return io_error(s, what, key, waited);
  }
  return FSDP_SUCCESS;
}

/* Sends one request and waits for its reply; the server answers a get within
 * wait_s, so the client allows that plus a margin. */
static fsdp_status_t request(fsdp_store_t *s, int op, const char *what, const char *key,
                             const void *val, size_t vlen, int64_t arg, double wait_s,
                             store_reply_t *r) {
  size_t klen = key ? strlen(key) : 0;
  if (klen == 0 || klen > FSDP_STORE_KEY_MAX || vlen > FSDP_STORE_VALUE_MAX)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "store %s: %s: key of %zu bytes or value of "
                      "%zu bytes is outside 1..%d and 0..%u", s->addr, what, klen, vlen,
                      FSDP_STORE_KEY_MAX, FSDP_STORE_VALUE_MAX);
  uint8_t h[STORE_REQ_BYTES] = {0};
  h[0] = (uint8_t)op;
  store_put_u32(h + 4, (uint32_t)klen);
  store_put_u32(h + 8, (uint32_t)vlen);
  store_put_i64(h + 16, arg);
  double deadline = fsdp_time_now() + wait_s + STORE_NET_MARGIN_S;
  pthread_mutex_lock(&s->mu);
  fsdp_status_t st = FSDP_SUCCESS;
  if (fsdp_sock_send_all(s->fd, h, sizeof h, deadline) ||
      fsdp_sock_send_all(s->fd, key, klen, deadline) ||
      (vlen && fsdp_sock_send_all(s->fd, val, vlen, deadline)))
    st = io_error(s, what, key, wait_s + STORE_NET_MARGIN_S);
  if (st == FSDP_SUCCESS) st = recv_reply(s, what, key, deadline, wait_s + STORE_NET_MARGIN_S, r);
  /* A request cut short leaves the stream out of step: later ones fail fast. */
  if (st == FSDP_ERR_COMM) shutdown(s->fd, SHUT_RDWR);
  pthread_mutex_unlock(&s->mu);
  return st;
}

static int64_t ms_of(double s) { return s <= 0 ? 0 : (int64_t)(s * 1000.0) + 1; }

/* ---- public -------------------------------------------------------------- */

static fsdp_status_t hello(fsdp_store_t *s, const char *job) {
  store_reply_t r;
  FSDP_TRY(request(s, STORE_HELLO, "hello", STORE_MAGIC, job, strlen(job), 0, 0.0, &r));
  fsdp_status_t st = FSDP_SUCCESS;
  if (r.status == STORE_BAD && r.arg == 1)
    st = fsdp_error(FSDP_ERR_INVALID_USAGE, "store %s belongs to job '%.*s', not to this "
                    "process's job '%s' (FSDP_RUN_ID, fsdp-run --rdzv-id): two jobs use one "
                    "MASTER_PORT; give each job its own port (fsdp-run --master-port 0 picks "
                    "a free one)", s->addr, FSDP_STORE_JOB_MAX, r.val ? r.val : "", job);
  else if (r.status != STORE_OK || r.arg != 1)
    st = fsdp_error(FSDP_ERR_COMM, "store %s: the peer answered but is not an fsdp store "
                    "(is MASTER_PORT used by another service?)", s->addr);
  fsdp_free(r.val);
  return st;
}

fsdp_status_t fsdp_store_connect(const char *host, int port, const char *job, double timeout_s,
                                 fsdp_store_t **out) {
  if (!host || !*host || port <= 0 || port > 65535 || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "store: address '%s' port %d is not a "
                      "host name and a port in 1..65535", host ? host : "(null)", port);
  if (!job) job = "";
  if (strlen(job) > FSDP_STORE_JOB_MAX)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "store: job id '%.40s...' is longer than %d "
                      "bytes", job, FSDP_STORE_JOB_MAX);
  fsdp_store_t *s = calloc(1, sizeof *s);
  if (!s) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "store: cannot allocate a client");
  snprintf(s->addr, sizeof s->addr, "%s:%d", host, port);
  pthread_mutex_init(&s->mu, NULL);
  char err[256] = "no attempt made";
  double t0 = fsdp_time_now();
  s->fd = connect_retrying(host, port, t0 + timeout_s, err, sizeof err);
  fsdp_status_t st = FSDP_SUCCESS;
  if (s->fd < 0)
    st = fsdp_error(FSDP_ERR_TIMEOUT, "store: cannot reach %s within %.1f s (last error: %s)",
                    s->addr, fsdp_time_now() - t0, err);
  else
    st = hello(s, job);
  if (st != FSDP_SUCCESS) {
    fsdp_store_close(s);
    return st;
  }
  *out = s;
  return FSDP_SUCCESS;
}

void fsdp_store_close(fsdp_store_t *s) {
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  pthread_mutex_destroy(&s->mu);
  free(s);
}


fsdp_status_t fsdp_store_set(fsdp_store_t *s, const char *key, const void *value, size_t len) {
  store_reply_t r;
  FSDP_TRY(request(s, STORE_SET, "set", key, value, len, 0, 0.0, &r));
  fsdp_free(r.val);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_store_get(fsdp_store_t *s, const char *key, double timeout_s, char **value,
                             size_t *len) {
  store_reply_t r;
  FSDP_TRY(request(s, STORE_GET, "get", key, NULL, 0, ms_of(timeout_s), timeout_s, &r));
  if (r.status != STORE_OK) {
    fsdp_free(r.val);
    return fsdp_error(FSDP_ERR_TIMEOUT, "store %s: key '%s' was not set within %.1f s",
                      s->addr, key, timeout_s);
  }
  *value = r.val;
  if (len) *len = r.len;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_store_wait(fsdp_store_t *s, const char *const *keys, int n, double timeout_s,
                              int *first_missing) {
  double deadline = fsdp_time_now() + timeout_s;
  for (int i = 0; i < n; i++) {
    char *v = NULL;
    double left = deadline - fsdp_time_now();
    fsdp_status_t st = fsdp_store_get(s, keys[i], left > 0 ? left : 0, &v, NULL);
    fsdp_free(v);
    if (st == FSDP_ERR_TIMEOUT) {
      if (first_missing) *first_missing = i;
      return fsdp_error(st, "store %s: key '%s' (%d of %d awaited) was not set within %.1f s",
                        s->addr, keys[i], i + 1, n, timeout_s);
    }
    FSDP_TRY(st);
  }
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_store_add(fsdp_store_t *s, const char *key, int64_t delta, int64_t *value) {
  store_reply_t r;
  FSDP_TRY(request(s, STORE_ADD, "add", key, NULL, 0, delta, 0.0, &r));
  fsdp_free(r.val);
  if (r.status != STORE_OK)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "store %s: add('%s'): the key holds a value "
                      "that is not a decimal counter", s->addr, key);
  if (value) *value = r.arg;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_store_check(fsdp_store_t *s, const char *key, int *exists) {
  store_reply_t r;
  FSDP_TRY(request(s, STORE_CHECK, "check", key, NULL, 0, 0, 0.0, &r));
  fsdp_free(r.val);
  *exists = r.arg != 0;
  return FSDP_SUCCESS;
}
