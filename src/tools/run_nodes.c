/* src/tools/run_nodes.c — fsdp-run's agents of an elastic job over several
 * nodes talking to each other (run_nodes.h): node 0's agent serves a small
 * line protocol at --master-port, the other agents connect to it, and node
 * 0's agent alone decides every world: the first one (once --nnodes MIN:MAX
 * nodes have joined), the survivors' after a loss, the larger one that admits
 * a node joining late. Workers never see this link; each agent passes its
 * workers their part of a world on their control pipes (run_group.c).
 *
 * Lines, agent -> node 0: "hello JOB NODE NPROC", "alive N" (after a loss it
 * has N live workers), "bye" (its workers succeeded). Node 0 -> agent:
 * "start|join|world G SIZE PORT FIRST COUNT" (world G of SIZE ranks meeting at
 * MASTER_ADDR:PORT, this node's workers are ranks FIRST..FIRST+COUNT-1;
 * start: spawn them, join: spawn them as joiners, world: tell the live ones),
 * "end WHY" (the job cannot go on), "bye" (node 0's workers succeeded).
 *
 * Node 0 serves every world's store (its rank 0 does), so a job whose node 0
 * is lost, or keeps no rank, ends. An agent whose connection closes without
 * "bye" is lost with every worker it had (TCP keep-alive notices a host that
 * vanished without closing it).
 *
 * A connection has HELLO_TIMEOUT_S to say hello (a port scan or a health
 * check never does) and is closed after, so that such connections cannot
 * hold the MAX_NEWCOMERS slots before an agent's. A line the peer does not
 * take within SEND_TIMEOUT_S (its host stopped reading) loses that peer. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tools/run_nodes.h"

enum { PEER_ABSENT, PEER_WAITING, PEER_IN, PEER_GONE };

typedef struct {
  int fd;            /* the link; -1 none */
  int state;         /* PEER_*: node 0's view of that node */
  int alive;         /* its live workers (node 0's view) */
  char buf[1024];    /* a line not yet ended */
  size_t have;
  double hello_by;   /* a newcomer: closed when it said no hello by then (now_s) */
} peer_t;

#define MAX_NEWCOMERS 16
#define HELLO_TIMEOUT_S 5
#define SEND_TIMEOUT_S 5

struct run_nodes {
  const run_opts_t *o;
  int stop_fd;       /* readable when fsdp-run got a signal: stop waiting */
  int listen_fd;     /* node 0: the agents' port; -1 elsewhere */
  peer_t *peer;      /* node 0: by node rank; elsewhere peer[0] is the link to node 0 */
  int *order;        /* node 0: node ranks in rank order of the current world */
  int n_order;
  int generation, size;
  int settling;      /* node 0: a new world is being made; admit nobody until it resumed */
  int finished;      /* node 0 said bye: its exit is no loss */
  peer_t newcomers[MAX_NEWCOMERS]; /* node 0: connections not yet introduced; fd -1 none */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int run_nodes_elastic(const run_opts_t *o) { return o->nnodes > 1 && o->min_nproc > 0; }

/* Sends a whole line on the non-blocking fd, waiting up to SEND_TIMEOUT_S
 * for room. A peer that is gone, or does not take the line in time, has its
 * link shut down: the next read sees its end, and it is lost as any closed
 * one is (node: the peer's node rank, for the message). */
static void send_line(int fd, int node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void send_line(int fd, int node, const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  double deadline = now_s() + SEND_TIMEOUT_S;
  for (int sent = 0; fd >= 0 && sent < n;) {
    ssize_t got = send(fd, line + sent, (size_t)(n - sent), MSG_NOSIGNAL);
    const int e = got < 0 ? errno : 0;
    if (got > 0) {
      sent += (int)got;
      continue;
    }
    double left = deadline - now_s();
    struct pollfd pf = {fd, POLLOUT, 0};
    if (e == EINTR) continue;
    if (e == EAGAIN && left > 0) {
      poll(&pf, 1, (int)(left * 1000) + 1);
      continue;
    }
    char who[64] = "a connection not yet introduced";
    if (node >= 0) snprintf(who, sizeof who, "node %d's agent", node);
    if (e == EAGAIN)
      fprintf(stderr, "fsdp-run: %s took %d of the %d bytes of '%.*s' in %d s (its host "
              "stopped reading): treating it as lost\n", who, sent, n, n - 1, line,
              SEND_TIMEOUT_S);
    shutdown(fd, SHUT_RDWR); /* gone, or now lost: the next read says so */
    return;
  }
}

/* Keep-alive probes: a host that vanishes (power, network) without closing
 * the connection is noticed within about 11 s. */
static void keepalive(int fd) {
  int on = 1, idle = 5, intvl = 2, cnt = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

/* Reads what p's link holds; a complete line into line (1), none yet (0),
 * or the link closed or broken (-1). */
static int read_line(peer_t *p, char *line, size_t n) {
  for (;;) {
    char *nl = memchr(p->buf, '\n', p->have);
    if (nl) {
      size_t len = (size_t)(nl - p->buf);
      snprintf(line, n, "%.*s", (int)len, p->buf);
      p->have -= len + 1;
      memmove(p->buf, nl + 1, p->have);
      return 1;
    }
    if (p->have == sizeof p->buf) return -1; /* not our protocol */
    ssize_t got = recv(p->fd, p->buf + p->have, sizeof p->buf - p->have, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (got <= 0) return -1;
    p->have += (size_t)got;
  }
}

/* ---- node 0: deciding worlds --------------------------------------------- */

/* The world of every node still in it with live workers, in rank order;
 * kind "start", "join" for the nodes just admitted, "world" for the rest.
 * *mine: node 0's part. -1 (and "end" to every agent) when it cannot be made. */
static int decide(run_nodes_t *n, const char *why, int admitted_from, run_word_t *mine) {
  int total = 0, kept = 0, port = run_free_port(), from = admitted_from;
  for (int k = 0; k < n->n_order; k++) {
    peer_t *p = &n->peer[n->order[k]];
    if (p->state == PEER_IN && p->alive > 0) {
      n->order[kept++] = n->order[k];
      total += p->alive;
    } else if (k < from) {
      admitted_from--;
    }
  }
  n->n_order = kept;
  char end[512] = "";
  if (n->peer[0].alive == 0)
    snprintf(end, sizeof end, "node 0 has no rank left, and node 0's rank 0 serves every "
             "world's store: the job cannot go on");
  else if (total < n->o->min_nproc)
    snprintf(end, sizeof end, "%d rank%s left on %d node%s, fewer than --min-nproc %d", total,
             total == 1 ? "" : "s", kept, kept == 1 ? "" : "s", n->o->min_nproc);
  else if (port < 0)
    snprintf(end, sizeof end, "no free port for the next world: %s", strerror(errno));
  if (end[0]) {
    fprintf(stderr, "fsdp-run: ending the job: %s\n", end);
    for (int k = 1; k < n->o->nnodes; k++) send_line(n->peer[k].fd, k, "end %s\n", end);
    *mine = (run_word_t){.kind = RUN_WORD_END};
    snprintf(mine->why, sizeof mine->why, "%s", end);
    return -1;
  }
  int old = n->size;
  n->generation += n->size > 0;
  n->size = total;
  if (why)
    fprintf(stderr, "fsdp-run: %s %d of %d ranks (world %d, --min-nproc %d, %d node%s): %s; "
            "the ranks meet at port %d\n", total > old ? "growing to" : "going on with", total,
            old, n->generation, n->o->min_nproc, kept, kept == 1 ? "" : "s", why, port);
  for (int k = 0, first = 0; k < kept; k++) {
    int node = n->order[k];
    peer_t *p = &n->peer[node];
    const char *kind = !why ? "start" : k >= admitted_from ? "join" : "world";
    if (node == 0)
      *mine = (run_word_t){.kind = !why ? RUN_WORD_START : RUN_WORD_WORLD,
                           .generation = n->generation, .size = total, .port = port,
                           .first = first, .count = p->alive};
    else
      send_line(p->fd, node, "%s %d %d %d %d %d\n", kind, n->generation, total, port, first,
                p->alive);
    first += p->alive;
  }
  n->settling = why != NULL;
  return 0;
}

/* Admits every node waiting to join (none while a world is being made). */
static int admit(run_nodes_t *n, run_word_t *mine) {
  int from = n->n_order, count = 0;
  char names[256] = "";
  for (int k = 1; k < n->o->nnodes && !n->settling; k++) {
    peer_t *p = &n->peer[k];
    if (p->state != PEER_WAITING) continue;
    p->state = PEER_IN;
    n->order[n->n_order++] = k;
    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%d", count ? ", " : "", k);
    count++;
  }
  if (!count) return 0;
  char why[400];
  snprintf(why, sizeof why, "node%s %s joined; the ranks running move into the larger world "
           "at their next snapshot", count == 1 ? "" : "s", names);
  return decide(n, why, from, mine) ? -1 : 1;
}

/* Whether a waiting node's connection is still open: its agent may have
 * died and been started again, the new one's hello coming before node 0
 * read the old one's end. A closed one is forgotten. */
static int still_waiting(peer_t *p) {
  char c;
  ssize_t got = p->state == PEER_WAITING ? recv(p->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) : 1;
  if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR))) return 1;
  close(p->fd);
  *p = (peer_t){.fd = -1, .state = PEER_GONE};
  return 0;
}

/* A "hello" from a new connection: which node it is, checked. */
static void hello(run_nodes_t *n, int fd, const char *line) {
  char job[256];
  int node, nproc;
  const char *bad = NULL;
  char text[640];
  if (sscanf(line, "hello %255s %d %d", job, &node, &nproc) != 3) {
    bad = "not fsdp-run's protocol";
  } else if (strcmp(job, n->o->run_id)) {
    snprintf(text, sizeof text, "it is of job '%s', this is job '%s' (--rdzv-id)", job,
             n->o->run_id);
    bad = text;
  } else if (node <= 0 || node >= n->o->nnodes) {
    snprintf(text, sizeof text, "its --node-rank %d is not in 1..%d", node, n->o->nnodes - 1);
    bad = text;
  } else if (nproc != n->o->nproc) {
    snprintf(text, sizeof text, "node %d has --nproc-per-node %d, node 0 has %d (every node "
             "needs the same)", node, nproc, n->o->nproc);
    bad = text;
  } else if ((n->peer[node].state == PEER_WAITING && still_waiting(&n->peer[node])) ||
             n->peer[node].state == PEER_IN) {
    snprintf(text, sizeof text, "node %d is in the job already", node);
    bad = text;
  }
  if (bad) {
    fprintf(stderr, "fsdp-run: turned away an agent: %s\n", bad);
    send_line(fd, -1, "end turned away by node 0: %s\n", bad);
    close(fd);
    return;
  }
  peer_t *p = &n->peer[node];
  *p = (peer_t){.fd = fd, .state = PEER_WAITING, .alive = nproc};
}

/* A free slot for a connection not yet introduced; -1 when all are taken. */
static int free_newcomer(const run_nodes_t *n) {
  for (int k = 0; k < MAX_NEWCOMERS; k++)
    if (n->newcomers[k].fd < 0) return k;
  return -1;
}

/* Reads a newcomer's hello; frees its slot once it said one, broke, or
 * said none by its deadline (then closed, told why). */
static void introduce(run_nodes_t *n, peer_t *c) {
  char line[1024];
  int got = read_line(c, line, sizeof line);
  if (got == 0 && now_s() < c->hello_by) return;
  if (got > 0) {
    hello(n, c->fd, line);
  } else {
    if (got == 0) {
      fprintf(stderr, "fsdp-run: closed a connection to port %d that said no hello within %d s "
              "(not an fsdp-run agent)\n", n->o->master_port, HELLO_TIMEOUT_S);
      send_line(c->fd, -1, "end node 0 closed this connection: no hello within %d s\n",
                HELLO_TIMEOUT_S);
    }
    close(c->fd);
  }
  c->fd = -1;
}

/* Reads the hellos of the connections not yet introduced, then takes those
 * waiting while a slot is free (the others wait in the listen backlog, as
 * many agents connect at once when a job starts). */
static void accept_agents(run_nodes_t *n) {
  for (int k = 0; k < MAX_NEWCOMERS; k++)
    if (n->newcomers[k].fd >= 0) introduce(n, &n->newcomers[k]);
  for (int k, fd; (k = free_newcomer(n)) >= 0;) {
    fd = accept4(n->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) break;
    keepalive(fd);
    n->newcomers[k] = (peer_t){.fd = fd, .hello_by = now_s() + HELLO_TIMEOUT_S};
    introduce(n, &n->newcomers[k]);
  }
}

/* Node 0: what the introduced agents sent; the losses of nodes in the
 * world are appended to why (size bytes). A node waiting to be admitted
 * whose connection closed is forgotten, so that its agent, started again,
 * is welcome. */
static void read_peers(run_nodes_t *n, char *why, size_t size) {
  for (int k = 1; k < n->o->nnodes; k++) {
    peer_t *p = &n->peer[k];
    char line[1024];
    int got, alive;
    while (p->fd >= 0 && (got = read_line(p, line, sizeof line)) != 0) {
      int end = 0;
      if (got > 0 && p->state == PEER_IN && sscanf(line, "alive %d%n", &alive, &end) == 1 &&
          !line[end] && alive >= 0 && alive <= p->alive) {
        snprintf(why + strlen(why), size - strlen(why), "%snode %d lost %d worker%s",
                 why[0] ? "; " : "", k, p->alive - alive, p->alive - alive == 1 ? "" : "s");
        p->alive = alive;
        continue;
      }
      /* Anything else but "bye" is not an agent of this job speaking: it is
       * dropped, as if its connection had closed, rather than trusted. */
      const int bad = got > 0 && strcmp(line, "bye");
      if (bad) {
        fprintf(stderr, "fsdp-run: node %d's agent sent '%.200s', which is not fsdp-run's "
                "protocol here (expected %s'bye'): dropping node %d\n", k, line,
                p->state == PEER_IN ? "'alive N', N at most its live workers, or " : "", k);
        send_line(p->fd, k, "end node 0 dropped this node: its agent sent '%.200s', not "
                  "fsdp-run's protocol\n", line);
      }
      if ((got < 0 || bad) && p->state == PEER_IN && p->alive > 0)
        snprintf(why + strlen(why), size - strlen(why), "%slost node %d: %s (the agent "
                 "and its %d worker%s are gone)", why[0] ? "; " : "", k,
                 bad ? "its agent broke the protocol" : "its agent's connection closed", p->alive,
                 p->alive == 1 ? "" : "s");
      p->alive = 0; /* gone, or done ("bye") */
      p->state = PEER_GONE;
      close(p->fd);
      p->fd = -1;
    }
  }
}

/* Node 0: what the agents sent. 1 when *mine holds a new word for node 0. */
static int coordinate(run_nodes_t *n, run_word_t *mine) {
  char why[600] = "";
  read_peers(n, why, sizeof why);
  accept_agents(n);
  if (why[0]) {
    decide(n, why, n->n_order, mine);
    return 1;
  }
  return admit(n, mine) != 0;
}

/* ---- opening ------------------------------------------------------------- */

static int listen_agents(run_nodes_t *n) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), on = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)n->o->master_port),
                          .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 64)) {
    fprintf(stderr, "fsdp-run: node 0 cannot serve the agents at port %d: %s\n",
            n->o->master_port, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  n->listen_fd = fd;
  return 0;
}

/* A signal came while the agents meet: nothing is started yet. */
static int interrupted(run_nodes_t *n) {
  fprintf(stderr, "fsdp-run: interrupted while node %d waited for %s\n", n->o->node_rank,
          n->o->node_rank ? "node 0's agent" : "the other nodes");
  for (int k = 1; k < n->o->nnodes; k++)
    send_line(n->peer[k].fd, k, "end node 0's fsdp-run was interrupted\n");
  return -1;
}

/* Node 0: waits up to --rdzv-timeout for --nnodes MAX nodes, then starts
 * with what came when that is at least MIN. */
static int meet(run_nodes_t *n, run_word_t *mine) {
  double deadline = now_s() + n->o->rdzv_timeout_s;
  const int max = 1 + run_nodes_max_fds(n);
  struct pollfd *pf = calloc((size_t)max, sizeof *pf);
  if (!pf) return fprintf(stderr, "fsdp-run: out of memory\n"), -1;
  for (;;) {
    char why[8]; /* nobody is in the world yet: no loss to say */
    accept_agents(n);
    read_peers(n, why, sizeof why); /* after the hellos: an agent gone since is not counted */
    int in = 1;
    for (int k = 1; k < n->o->nnodes; k++) in += n->peer[k].state == PEER_WAITING;
    double left = deadline - now_s();
    if (in == n->o->nnodes || (left <= 0 && in >= n->o->nnodes_min)) break;
    if (left <= 0) {
      char miss[256] = "";
      for (int k = 1; k < n->o->nnodes; k++)
        if (n->peer[k].state != PEER_WAITING)
          snprintf(miss + strlen(miss), sizeof miss - strlen(miss), " %d", k);
      fprintf(stderr, "fsdp-run: only %d of the %d nodes --nnodes needs joined within "
              "--rdzv-timeout %g s; missing node ranks:%s. Start fsdp-run on every node with "
              "the same --master-addr, --master-port and --rdzv-id\n", in, n->o->nnodes_min,
              n->o->rdzv_timeout_s, miss);
      for (int k = 1; k < n->o->nnodes; k++)
        send_line(n->peer[k].fd, k, "end node 0 gave up waiting for the other nodes\n");
      free(pf);
      return -1;
    }
    pf[0] = (struct pollfd){n->stop_fd, POLLIN, 0};
    int m = 1 + run_nodes_fds(n, pf + 1, max - 1), ms = run_nodes_timeout_ms(n);
    if (ms < 0 || ms > (int)(left * 1000) + 1) ms = (int)(left * 1000) + 1;
    if (poll(pf, (nfds_t)m, ms) > 0 && pf[0].revents) {
      free(pf);
      return interrupted(n);
    }
  }
  free(pf);
  n->order[n->n_order++] = 0;
  for (int k = 1; k < n->o->nnodes; k++)
    if (n->peer[k].state == PEER_WAITING) {
      n->peer[k].state = PEER_IN;
      n->order[n->n_order++] = k;
    }
  return decide(n, NULL, n->n_order, mine);
}

/* Connects fd to a by the deadline: 0 connected, -1 not (*err why), 1 when
 * stop_fd became readable first (a signal). A host that drops the SYN (a
 * firewall, a full backlog) is waited for only until the deadline. */
static int connect_by(int fd, const struct addrinfo *a, double deadline, int stop_fd,
                      const char **err) {
  if (!connect(fd, a->ai_addr, a->ai_addrlen)) return 0;
  if (errno != EINPROGRESS) return *err = strerror(errno), -1;
  for (;;) {
    double left = deadline - now_s();
    if (left <= 0) return *err = "no answer (the connection timed out)", -1;
    struct pollfd pf[2] = {{fd, POLLOUT, 0}, {stop_fd, POLLIN, 0}};
    int rc = poll(pf, 2, (int)(left * 1000) + 1);
    if (rc > 0 && pf[1].revents) return 1;
    if (rc > 0 && pf[0].revents) {
      int e = 0;
      socklen_t len = sizeof e;
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len)) e = errno;
      return e ? (*err = strerror(e), -1) : 0;
    }
  }
}

static int connect_node0(run_nodes_t *n) {
  char port[16];
  snprintf(port, sizeof port, "%d", n->o->master_port);
  double deadline = now_s() + n->o->rdzv_timeout_s;
  const char *err = "no address";
  for (;;) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(n->o->master_addr, port, &hints, &res), fd = -1;
    if (rc) err = gai_strerror(rc);
    int stopped = 0;
    for (struct addrinfo *a = rc ? NULL : res; a && fd < 0 && !stopped; a = a->ai_next) {
      fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        err = strerror(errno);
        continue;
      }
      int c = connect_by(fd, a, deadline, n->stop_fd, &err);
      if (c) {
        close(fd);
        fd = -1;
        stopped = c > 0;
      }
    }
    if (res) freeaddrinfo(res);
    if (stopped) return interrupted(n);
    if (fd >= 0) {
      keepalive(fd);
      n->peer[0] = (peer_t){.fd = fd, .state = PEER_IN};
      send_line(fd, 0, "hello %s %d %d\n", n->o->run_id, n->o->node_rank, n->o->nproc);
      return 0;
    }
    if (now_s() >= deadline) break;
    /* node 0's agent may not listen yet: try again in 0.1 s, or stop on a signal */
    struct pollfd stop = {n->stop_fd, POLLIN, 0};
    if (poll(&stop, 1, 100) > 0) return interrupted(n);
  }
  fprintf(stderr, "fsdp-run: node %d cannot reach node 0's agent at %s:%d within --rdzv-timeout "
          "%g s: %s\n", n->o->node_rank, n->o->master_addr, n->o->master_port,
          n->o->rdzv_timeout_s, err);
  return -1;
}

/* Parses a line from node 0 for a node of nproc workers: 1 when it is a
 * word, 0 (*w an END naming the line) when it is not fsdp-run's protocol or
 * gives this node a part it cannot have. */
static int parse_word(const char *line, int nproc, run_word_t *w) {
  char kind[16];
  int end = 0;
  *w = (run_word_t){.kind = RUN_WORD_NONE};
  if (!strncmp(line, "end ", 4)) {
    w->kind = RUN_WORD_END;
    snprintf(w->why, sizeof w->why, "%.500s", line + 4);
    return 1;
  }
  if (!strcmp(line, "bye")) return w->kind = RUN_WORD_BYE, 1;
  if (sscanf(line, "%15s %d %d %d %d %d%n", kind, &w->generation, &w->size, &w->port, &w->first,
             &w->count, &end) == 6 && !line[end])
    w->kind = !strcmp(kind, "start") ? RUN_WORD_START
              : !strcmp(kind, "join") ? RUN_WORD_JOIN
              : !strcmp(kind, "world") ? RUN_WORD_WORLD
                                        : RUN_WORD_NONE;
  /* start and join spawn all nproc workers; a world keeps some of them */
  if (w->kind != RUN_WORD_NONE && w->generation >= 0 && w->port > 0 && w->port < 65536 &&
      w->first >= 0 && w->count > 0 && w->count <= w->size - w->first &&
      (w->kind == RUN_WORD_WORLD ? w->count <= nproc : w->count == nproc))
    return 1;
  *w = (run_word_t){.kind = RUN_WORD_END};
  snprintf(w->why, sizeof w->why, "node 0's agent sent '%.200s', which is not fsdp-run's "
           "protocol for a node of %d worker%s (expected 'start|join|world G SIZE PORT FIRST "
           "COUNT', 'end WHY' or 'bye')", line, nproc, nproc == 1 ? "" : "s");
  return 0;
}

/* Another node: reads node 0's lines; 1 when *w holds a word: the newest
 * (a world supersedes the one before it), or with first_only the first, the
 * lines after it kept for run_nodes_read (a start or join must be acted on
 * before a world that follows it at once). */
static int listen_node0(run_nodes_t *n, int first_only, run_word_t *w) {
  char line[1024];
  int got, have = 0;
  run_word_t next;
  while (n->peer[0].fd >= 0 && (got = read_line(&n->peer[0], line, sizeof line)) != 0) {
    if (got < 0) {
      close(n->peer[0].fd);
      n->peer[0].fd = -1;
      if (n->finished) return have;
      *w = (run_word_t){.kind = RUN_WORD_END};
      snprintf(w->why, sizeof w->why, "node 0's agent (%s:%d) is gone: node 0 serves every "
               "world's store, so the job cannot go on without it", n->o->master_addr,
               n->o->master_port);
      return 1;
    }
    if (!parse_word(line, n->o->nproc, &next)) {
      close(n->peer[0].fd);
      n->peer[0].fd = -1;
      *w = next;
      return 1;
    }
    if (next.kind == RUN_WORD_BYE) {
      n->finished = 1;
      continue;
    }
    *w = next;
    have = 1;
    if (first_only) break;
  }
  return have;
}

int run_nodes_open(const run_opts_t *o, int stop_fd, run_nodes_t **out, run_word_t *first) {
  run_nodes_t *n = calloc(1, sizeof *n);
  *out = n; /* the caller closes it, whatever happens here */
  if (n) {
    n->o = o;
    n->stop_fd = stop_fd;
    n->listen_fd = -1;
    n->peer = calloc((size_t)o->nnodes, sizeof *n->peer);
    n->order = calloc((size_t)o->nnodes, sizeof *n->order);
    for (int k = 0; n->peer && k < o->nnodes; k++) n->peer[k].fd = -1;
    for (int k = 0; k < MAX_NEWCOMERS; k++) n->newcomers[k].fd = -1;
  }
  if (!n || !n->peer || !n->order) {
    fprintf(stderr, "fsdp-run: out of memory for the links of %d nodes\n", o->nnodes);
    return -1;
  }
  if (o->node_rank == 0) {
    n->peer[0] = (peer_t){.fd = -1, .state = PEER_IN, .alive = o->nproc};
    return listen_agents(n) || meet(n, first) ? -1 : 0;
  }
  if (connect_node0(n)) return -1;
  /* The first word: "start" within node 0's --rdzv-timeout, or "join" once
   * node 0 admits us (when the world running is not being remade). */
  for (;;) {
    struct pollfd pf[2] = {{n->peer[0].fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    if (poll(pf, 2, -1) > 0 && pf[1].revents) return interrupted(n);
    if (listen_node0(n, 1, first)) break;
    if (n->peer[0].fd < 0) {
      fprintf(stderr, "fsdp-run: node %d: the job ended before node 0 admitted this node\n",
              o->node_rank);
      return -1;
    }
  }
  if (first->kind == RUN_WORD_END)
    fprintf(stderr, "fsdp-run: node %d cannot join: %s\n", o->node_rank, first->why);
  return first->kind == RUN_WORD_END ? -1 : 0;
}

int run_nodes_fds(const run_nodes_t *n, struct pollfd *pf, int max) {
  int m = 0;
  if (n->listen_fd >= 0 && free_newcomer(n) >= 0 && m < max)
    pf[m++] = (struct pollfd){n->listen_fd, POLLIN, 0};
  for (int k = 0; k < MAX_NEWCOMERS && n->listen_fd >= 0; k++)
    if (n->newcomers[k].fd >= 0 && m < max)
      pf[m++] = (struct pollfd){n->newcomers[k].fd, POLLIN, 0};
  for (int k = 0; k < n->o->nnodes; k++)
    if (n->peer[k].fd >= 0 && m < max) pf[m++] = (struct pollfd){n->peer[k].fd, POLLIN, 0};
  return m;
}

int run_nodes_max_fds(const run_nodes_t *n) { return 1 + MAX_NEWCOMERS + n->o->nnodes; }

int run_nodes_timeout_ms(const run_nodes_t *n) {
  double first = -1;
  for (int k = 0; k < MAX_NEWCOMERS; k++)
    if (n->newcomers[k].fd >= 0 && (first < 0 || n->newcomers[k].hello_by < first))
      first = n->newcomers[k].hello_by;
  if (first < 0) return -1;
  double left = first - now_s();
  return left <= 0 ? 0 : (int)(left * 1000) + 1;
}

int run_nodes_read(run_nodes_t *n, run_word_t *w) {
  return n->o->node_rank == 0 ? coordinate(n, w) : listen_node0(n, 0, w);
}

int run_nodes_lost(run_nodes_t *n, int alive, const char *why, run_word_t *w) {
  *w = (run_word_t){.kind = RUN_WORD_NONE};
  if (n->o->node_rank) {
    send_line(n->peer[0].fd, 0, "alive %d\n", alive);
    return 0;
  }
  n->peer[0].alive = alive;
  decide(n, why, n->n_order, w);
  return 1;
}

int run_nodes_resumed(run_nodes_t *n, run_word_t *w) {
  if (n->o->node_rank) return 0;
  n->settling = 0;
  return admit(n, w) != 0;
}

void run_nodes_close(run_nodes_t *n, int succeeded) {
  if (!n) return;
  for (int k = 0; n->peer && k < n->o->nnodes; k++)
    if (n->peer[k].fd >= 0) {
      if (succeeded) send_line(n->peer[k].fd, k, "bye\n");
      close(n->peer[k].fd);
    }
  for (int k = 0; k < MAX_NEWCOMERS; k++)
    if (n->newcomers[k].fd >= 0) close(n->newcomers[k].fd), n->newcomers[k].fd = -1;
  if (n->listen_fd >= 0) close(n->listen_fd);
  free(n->peer);
  free(n->order);
  free(n);
}

/* A port free right now; another process could take it before rank 0 binds
 * it, which rank 0 then reports (the store cannot bind). */
int run_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}
