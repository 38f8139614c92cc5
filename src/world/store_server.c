/* src/world/store_server.c — the store's server (world/store.h): one thread
 * polling a listening socket and its clients. Requests are answered in order
 * per client; a get for a missing key parks its client (nothing more is read
 * from it) until a set or add creates the key or the get's deadline passes, so
 * waiting costs neither polling nor a thread per client. Replies go through a
 * per-client output buffer, so a slow reader never stalls the others. A
 * client that breaks the protocol is disconnected; the server keeps going. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/internal.h"
#include "world/store.h"
#include "world/store_proto.h"

typedef struct {
  char *key, *val;
  size_t len;
} kv_t;

typedef struct {
  int fd;
  int hello;          /* the handshake is done */
  uint8_t *in;        /* bytes received, not yet processed */
  size_t in_len, in_cap;
  uint8_t *out;       /* reply bytes not yet sent: [out_off, out_len) */
  size_t out_len, out_off, out_cap;
  char *wait_key;     /* a parked get: its key and deadline */
  double deadline;
} client_t;

struct fsdp_store_server {
  int listen_fd, wake_rd, wake_wr, port;
  char job[FSDP_STORE_JOB_MAX + 1]; /* clients must bring this id */
  pthread_t thread;
  /* Touched by the server thread only. */
  kv_t *kv;
  size_t n_kv, cap_kv;
  client_t *cl;
  size_t n_cl, cap_cl;
};

/* ---- table --------------------------------------------------------------- */

static kv_t *kv_find(struct fsdp_store_server *s, const char *key) {
  for (size_t i = 0; i < s->n_kv; i++)
    if (strcmp(s->kv[i].key, key) == 0) return &s->kv[i];
  return NULL;
}

/* Takes ownership of val (malloc'ed, len bytes + NUL). 0 or -1 (no memory). */
static int kv_put(struct fsdp_store_server *s, const char *key, char *val, size_t len) {
  kv_t *e = kv_find(s, key);
  if (!e) {
    if (s->n_kv == s->cap_kv) {
      size_t cap = s->cap_kv ? 2 * s->cap_kv : 64;
      kv_t *grown = realloc(s->kv, cap * sizeof *grown);
      if (!grown) return -1;
      s->kv = grown;
      s->cap_kv = cap;
    }
    e = &s->kv[s->n_kv];
    if (!(e->key = fsdp_strdup(key))) return -1;
    e->val = NULL;
    s->n_kv++;
  }
  free(e->val);
  e->val = val;
  e->len = len;
  return 0;
}

/* ---- replies ------------------------------------------------------------- */

static int out_reserve(client_t *c, size_t more) {
  if (c->out_len + more <= c->out_cap) return 0;
  size_t cap = c->out_cap ? c->out_cap : 256;
  while (cap < c->out_len + more) cap *= 2;
  uint8_t *grown = realloc(c->out, cap);
  if (!grown) return -1;
  c->out = grown;
  c->out_cap = cap;
  return 0;
}

static int reply(client_t *c, int status, int64_t arg, const void *val, size_t len) {
  if (out_reserve(c, STORE_REP_BYTES + len)) return -1;
  uint8_t *h = c->out + c->out_len;
  memset(h, 0, STORE_REP_BYTES);
  h[0] = (uint8_t)status;
  store_put_u32(h + 4, (uint32_t)len);
  store_put_i64(h + 8, arg);
  if (len) memcpy(h + STORE_REP_BYTES, val, len);
  c->out_len += STORE_REP_BYTES + len;
  return 0;
}

/* Answers every get parked on key now that it exists. */
static int wake_waiters(struct fsdp_store_server *s, const kv_t *e) {
  for (size_t i = 0; i < s->n_cl; i++) {
    client_t *c = &s->cl[i];
    if (!c->wait_key || strcmp(c->wait_key, e->key) != 0) continue;
    free(c->wait_key);
    c->wait_key = NULL;
    if (reply(c, STORE_OK, 0, e->val, e->len)) return -1;
  }
  return 0;
}

/* ---- requests ------------------------------------------------------------ */

static char *copy_bytes(const uint8_t *p, size_t n) {
  char *b = malloc(n + 1);
  if (b) {
    memcpy(b, p, n);
    b[n] = '\0';
  }
  return b;
}

static int do_add(struct fsdp_store_server *s, client_t *c, const char *key, int64_t delta) {
  kv_t *e = kv_find(s, key);
  int64_t v = 0;
  if (e) {
    char *end;
    errno = 0;
    long long x = strtoll(e->val, &end, 10);
    if (errno || end == e->val || *end) return reply(c, STORE_BAD, 0, NULL, 0);
    v = x;
  }
  v += delta;
  char text[32];
  int n = snprintf(text, sizeof text, "%" PRId64, v);
  char *val = copy_bytes((const uint8_t *)text, (size_t)n);
  if (!val || kv_put(s, key, val, (size_t)n)) return free(val), -1;
  if (reply(c, STORE_OK, v, NULL, 0)) return -1;
  return wake_waiters(s, kv_find(s, key));
}

static int do_get(struct fsdp_store_server *s, client_t *c, const char *key, int64_t wait_ms) {
  kv_t *e = kv_find(s, key);
  if (e) return reply(c, STORE_OK, 0, e->val, e->len);
  if (wait_ms <= 0) return reply(c, STORE_MISSING, 0, NULL, 0);
  if (!(c->wait_key = fsdp_strdup(key))) return -1;
  c->deadline = fsdp_time_now() + (double)wait_ms / 1000.0;
  return 0;
}

/* Handles one complete request. -1 drops the client. */
static int handle(struct fsdp_store_server *s, client_t *c, int op, const char *key,
                  const uint8_t *val, size_t vlen, int64_t arg) {
  if (!c->hello) { /* a stranger stays un-greeted: its next request drops it */
    if (op != STORE_HELLO || strcmp(key, STORE_MAGIC) != 0) return -1;
    if (vlen != strlen(s->job) || memcmp(val, s->job, vlen) != 0)
      return reply(c, STORE_BAD, 1, s->job, strlen(s->job));
    c->hello = 1;
    return reply(c, STORE_OK, 1, NULL, 0);
  }
  switch (op) {
  case STORE_SET: {
    char *v = copy_bytes(val, vlen);
    if (!v || kv_put(s, key, v, vlen)) return free(v), -1;
    if (reply(c, STORE_OK, 0, NULL, 0)) return -1;
    return wake_waiters(s, kv_find(s, key));
  }
  case STORE_GET:
    return do_get(s, c, key, arg);
  case STORE_ADD:
    return do_add(s, c, key, arg);
  case STORE_CHECK:
    return reply(c, STORE_OK, kv_find(s, key) != NULL, NULL, 0);
  }
  return -1;
}

/* Processes the complete requests buffered for c, stopping at a parked get. */
static int process(struct fsdp_store_server *s, client_t *c) {
  size_t off = 0;
  int rc = 0;
  while (!c->wait_key && c->in_len - off >= STORE_REQ_BYTES) {
    const uint8_t *h = c->in + off;
    uint32_t klen = store_get_u32(h + 4), vlen = store_get_u32(h + 8);
    if (klen == 0 || klen > FSDP_STORE_KEY_MAX || vlen > FSDP_STORE_VALUE_MAX) return -1;
    size_t need = STORE_REQ_BYTES + (size_t)klen + vlen;
    if (c->in_len - off < need) break;
    char *key = copy_bytes(h + STORE_REQ_BYTES, klen);
    if (!key || strlen(key) != klen) return free(key), -1; /* no NULs inside keys */
    rc = handle(s, c, h[0], key, h + STORE_REQ_BYTES + klen, vlen, store_get_i64(h + 16));
    free(key);
    if (rc) return rc;
    off += need;
  }
  memmove(c->in, c->in + off, c->in_len - off);
  c->in_len -= off;
  return 0;
}

/* ---- connections --------------------------------------------------------- */

static void client_drop(struct fsdp_store_server *s, size_t i) {
  client_t *c = &s->cl[i];
  close(c->fd);
  free(c->in);
  free(c->out);
  free(c->wait_key);
  s->cl[i] = s->cl[--s->n_cl];
}

static void accept_client(struct fsdp_store_server *s) {
  int fd = accept(s->listen_fd, NULL, NULL);
  if (fd < 0) return; /* the peer gave up already, or we are out of descriptors */
  if (fsdp_sock_tune(fd)) {
    close(fd);
    return;
  }
  if (s->n_cl == s->cap_cl) {
    size_t cap = s->cap_cl ? 2 * s->cap_cl : 16;
    client_t *grown = realloc(s->cl, cap * sizeof *grown);
    if (!grown) {
      close(fd);
      return;
    }
    s->cl = grown;
    s->cap_cl = cap;
  }
  s->cl[s->n_cl++] = (client_t){.fd = fd};
}

/* Reads what is available; 0 keeps the client, -1 drops it. */
static int client_read(struct fsdp_store_server *s, client_t *c) {
  if (c->in_cap - c->in_len < 65536) {
    size_t cap = c->in_cap ? 2 * c->in_cap : 65536;
    if (cap > STORE_REQ_BYTES + FSDP_STORE_KEY_MAX + FSDP_STORE_VALUE_MAX + 65536) return -1;
    uint8_t *grown = realloc(c->in, cap);
    if (!grown) return -1;
    c->in = grown;
    c->in_cap = cap;
  }
  ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return -1;
  if (n > 0) c->in_len += (size_t)n;
  return process(s, c);
}

static int client_write(client_t *c) {
  while (c->out_off < c->out_len) {
    ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
    c->out_off += (size_t)n;
  }
  c->out_off = c->out_len = 0;
  return 0;
}

/* Answers parked gets whose deadline passed; returns the poll timeout (ms)
 * until the next deadline, or -1 when nobody waits. */
static int expire_waiters(struct fsdp_store_server *s) {
  double now = fsdp_time_now(), next = -1.0;
  for (size_t i = 0; i < s->n_cl; i++) {
    client_t *c = &s->cl[i];
    if (!c->wait_key) continue;
    if (c->deadline <= now) {
      free(c->wait_key);
      c->wait_key = NULL;
      reply(c, STORE_MISSING, 0, NULL, 0); /* clients wait for it: nothing else is queued */
      continue;
    }
    if (next < 0 || c->deadline - now < next) next = c->deadline - now;
  }
  return next < 0 ? -1 : (int)(next * 1000.0) + 1;
}

/* ---- the thread ---------------------------------------------------------- */

/* One poll round over the wake pipe, the listener and every client. 0 to go
 * on, 1 when asked to stop. */
static int serve_once(struct fsdp_store_server *s, struct pollfd *pf, int timeout_ms) {
  size_t n = s->n_cl;
  pf[0] = (struct pollfd){s->wake_rd, POLLIN, 0};
  pf[1] = (struct pollfd){s->listen_fd, POLLIN, 0};
  for (size_t i = 0; i < n; i++)
    pf[2 + i] = (struct pollfd){s->cl[i].fd,
                                (short)(POLLIN | (s->cl[i].out_len ? POLLOUT : 0)), 0};
  if (poll(pf, 2 + n, timeout_ms) < 0) return errno == EINTR ? 0 : 1;
  if (pf[0].revents) return 1;
  /* Backwards, because dropping a client moves the last one into its place. */
  for (size_t i = n; i-- > 0;) {
    client_t *c = &s->cl[i];
    int bad = (pf[2 + i].revents & (POLLERR | POLLNVAL)) != 0;
    if (!bad && (pf[2 + i].revents & (POLLIN | POLLHUP))) bad = client_read(s, c) != 0;
    if (!bad) bad = client_write(c) != 0;
    if (bad) client_drop(s, i);
  }
  if (pf[1].revents & POLLIN) accept_client(s);
  return 0;
}

static void *server_main(void *arg) {
  struct fsdp_store_server *s = arg;
  struct pollfd *pf = NULL;
  size_t pf_cap = 0;
  for (;;) {
    int timeout_ms = expire_waiters(s);
    for (size_t i = 0; i < s->n_cl; i++) client_write(&s->cl[i]);
    if (pf_cap < s->n_cl + 2) {
      pf_cap = 2 * (s->n_cl + 2);
      struct pollfd *grown = realloc(pf, pf_cap * sizeof *pf);
      if (!grown) break;
      pf = grown;
    }
    if (serve_once(s, pf, timeout_ms)) break;
  }
  free(pf);
  return NULL;
}

/* ---- lifetime ------------------------------------------------------------ */

static fsdp_status_t listen_on(int port, int *fd_out, int *bound) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0), v6 = fd >= 0;
  if (!v6) fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return fsdp_error(FSDP_ERR_SYSTEM, "store: socket() failed: %s", strerror(errno));
  int one = 1, zero = 0;
  /* Restarted jobs reuse the port while old connections sit in TIME_WAIT. */
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_storage ss = {0};
  socklen_t len;
  if (v6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); /* IPv4 too */
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons((uint16_t)port);
    len = sizeof *a;
  } else {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons((uint16_t)port);
    len = sizeof *a;
  }
  if (bind(fd, (struct sockaddr *)&ss, len) || listen(fd, 1024) || fsdp_sock_tune(fd)) {
    int err = errno;
    close(fd);
    return fsdp_error(FSDP_ERR_COMM, "store: cannot serve on port %d: %s%s", port,
                      strerror(err), err == EADDRINUSE ? " (another job or a leftover "
                      "process holds it; choose another MASTER_PORT)" : "");
  }
  len = sizeof ss;
  getsockname(fd, (struct sockaddr *)&ss, &len);
  *bound = ntohs(v6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                    : ((struct sockaddr_in *)&ss)->sin_port);
  *fd_out = fd;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_store_server_start(int port, const char *job, fsdp_store_server_t **out,
                                      int *bound_port) {
  if (!out || port < 0 || port > 65535)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "store: port %d is not 0..65535", port);
  if (job && strlen(job) > FSDP_STORE_JOB_MAX)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "store: job id '%.40s...' is longer than %d "
                      "bytes", job, FSDP_STORE_JOB_MAX);
  struct fsdp_store_server *s = calloc(1, sizeof *s);
  if (!s) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "store: cannot allocate the server");
  snprintf(s->job, sizeof s->job, "%s", job ? job : "");
  int pipefd[2];
  fsdp_status_t st = listen_on(port, &s->listen_fd, &s->port);
  if (st != FSDP_SUCCESS) goto fail_listen;
  if (pipe2(pipefd, O_CLOEXEC)) {
    st = fsdp_error(FSDP_ERR_SYSTEM, "store: pipe() failed: %s", strerror(errno));
    goto fail_pipe;
  }
  s->wake_rd = pipefd[0];
  s->wake_wr = pipefd[1];
  int rc = pthread_create(&s->thread, NULL, server_main, s);
  if (rc) {
    st = fsdp_error(FSDP_ERR_SYSTEM, "store: cannot start the server thread: %s", strerror(rc));
    goto fail_thread;
  }
  pthread_setname_np(s->thread, "fsdp-store");
  if (bound_port) *bound_port = s->port;
  *out = s;
  return FSDP_SUCCESS;
fail_thread:
  close(s->wake_rd);
  close(s->wake_wr);
fail_pipe:
  close(s->listen_fd);
fail_listen:
  free(s);
  return st;
}

void fsdp_store_server_stop(fsdp_store_server_t *s) {
  if (!s) return;
  char b = 1;
  while (write(s->wake_wr, &b, 1) < 0 && errno == EINTR) {
  }
  pthread_join(s->thread, NULL);
  while (s->n_cl) client_drop(s, s->n_cl - 1);
  free(s->cl);
  for (size_t i = 0; i < s->n_kv; i++) {
    free(s->kv[i].key);
    free(s->kv[i].val);
  }
  free(s->kv);
  close(s->listen_fd);
  close(s->wake_rd);
  close(s->wake_wr);
  free(s);
}
