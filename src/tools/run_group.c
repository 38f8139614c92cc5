/* src/tools/run_group.c — one attempt of fsdp-run's worker group: spawn every
 * local worker with its env:// variables, echo their stderr line by line
 * with a rank prefix (remembering each one's last line), and supervise them
 * from a single poll loop fed by a self-pipe of signals. The first failure
 * stops the others (SIGCONT, then SIGTERM, SIGKILL after the grace period) and
 * is reported as the root cause — or, when that rank's watchdog names the one
 * peer it waited for (a stopped or stuck rank), that peer; SIGINT and SIGTERM
 * sent to fsdp-run are passed on.
 *
 * A worker that exits with status 0 while its peers still need it fails the
 * group like any other failure. Workers tell fsdp-run over a datagram socket
 * (FSDP_RUN_NOTIFY; src/world/rendezvous.c sends) when their rank has joined
 * the env:// rendezvous and when it has left its world through
 * fsdp_world_destroy. An exit with status 0 is early when the worker joined
 * and had not left since (in a world of more than one rank), or when it never
 * joined while another local worker did (that one waits for it in the
 * rendezvous); a worker that never joins, beside others that never join, is a
 * plain program and may end when it likes.
 *
 * A worker killed by SIGKILL is reported out of memory when the OOM kill
 * counter of fsdp-run's memory cgroup (oom_kill in memory.events, cgroup v2,
 * or memory.oom_control, v1; FSDP_RUN_MEMORY_EVENTS names another file) rose
 * during the attempt: workers live in fsdp-run's cgroup or below it.
 *
 * Shrinking (--min-nproc, one node): a worker that dies on its own while at
 * least min_nproc others live is lost rather than failed. Each survivor
 * gets one line on its control pipe (FSDP_RUN_CONTROL, the read end's
 * descriptor), "world G R S P": generation G, its rank R in a world of S
 * survivors (ranks kept in their old order), store at port P (a new one, so
 * no rank ever meets the old world's store), and fsdp_world_rejoin in the
 * worker makes that world. A survivor's note "resumed R STEP LOST" (its first
 * step done in the new world) is logged with the time since the loss. Below
 * the floor the loss is a failure like any other. With --respawn, once the
 * survivors resumed, each lost worker's slot gets a new worker (FSDP_RUN_JOIN=1)
 * and everyone the word of a world of survivors plus joiners; the survivors
 * make room at their next snapshot boundary (fsdp_world_change_pending).
 *
 * Over several nodes (run_group_nodes) node 0's agent decides each world
 * (run_nodes.c): an agent reports its losses there and passes on what it is
 * told, "world G R S P LR LS" with the rank's local rank and the node's count.
 *
 * No orphans: workers share one process group of their own (signals reach
 * their children too) and ask the kernel to kill them if fsdp-run dies
 * (PR_SET_PDEATHSIG), so not even SIGKILL of the launcher leaves workers. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/run.h"
#include "tools/run_nodes.h"

#define LINE_BYTES 4096
#define DRAIN_S 1.0 /* how long to read a pipe still held open after its worker died */

typedef struct {
  int rank, local_rank;
  pid_t pid;
  int fd;                     /* read end of its stderr pipe; -1 once closed */
  char partial[LINE_BYTES];   /* a line not yet ended */
  size_t n_partial;
  char last[LINE_BYTES];      /* the last non-empty line it wrote to stderr */
  int fresh;                  /* `last` not yet looked at for a watchdog's report */
  int reaped, status, round;  /* round: supervision round that reaped it */
  int stopped_with;           /* the signal fsdp-run sent it, 0 none */
  int paused_by;              /* a stop signal (SIGSTOP, SIGTSTP) it was seen stopped by, 0 none */
  int joined, in_world;       /* it joined a rendezvous; it is in a world it has not left */
  int early;                  /* it exited with status 0 while its peers still needed it */
  int ctl, ctl_rd;            /* its control pipe: our write end, its read end; -1 none */
  int cur;                    /* its rank in the current world (--min-nproc) */
  int lost;                   /* it died: 1 being judged, 2 the others went on without it */
  int hung;                   /* a peer's watchdog named it; fsdp-run killed it (--min-nproc) */
  int joining;                /* started to replace a lost worker (--respawn): FSDP_RUN_JOIN */
} worker_t;

typedef struct {
  const run_opts_t *o;
  int attempt;
  worker_t *w;
  int n;
  pid_t launcher, pgid;
  int stopping, killed, round, failed, interrupted_by;
  double kill_at, drain_until;
  int note_rd, note_wr;       /* the workers' notes (notify_launcher): ours, theirs */
  char note_env[64];          /* FSDP_RUN_NOTIFY less the rank: "fd:inode" of note_wr */
  char oom_path[4096];        /* the file with the cgroup's oom_kill counter; "" none */
  long long oom_before;       /* that counter when the attempt began; -1 unread */
  int generation, size;       /* worlds made after losses; ranks in the current one */
  double lost_at;             /* when the last loss was seen */
  int settling;               /* a loss is being recovered from: a watchdog's line may
                                 name a rank of the world before it, so none is acted on */
  run_nodes_t *nodes;         /* the other agents (elastic over nodes), else NULL */
  int base, port;             /* the first local worker's first rank; the first world's port */
} group_t;

/* The self-pipe: a signal handler has no context to write to but a global. */
static int sig_pipe[2] = {-1, -1};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  if (write(sig_pipe[1], &b, 1) < 0) { /* full pipe: a wake-up is pending anyway */
  }
  errno = saved;
}

int run_signals_install(void) {
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK)) return -1;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &sa, NULL) || sigaction(SIGINT, &sa, NULL) ||
      sigaction(SIGTERM, &sa, NULL))
    return -1;
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

int run_signals_fd(void) { return sig_pipe[0]; }

/* ---- spawning ------------------------------------------------------------ */

static void setenv_int(const char *name, long v) {
  char text[32];
  snprintf(text, sizeof text, "%ld", v);
  setenv(name, text, 1);
}

/* The env:// contract (fsdp/world.h); MPI's variables go, so that a worker
 * never mistakes itself for an mpirun rank. */
static void worker_env(const group_t *g, const worker_t *w) {
  const run_opts_t *o = g->o;
  static const char *mpi_vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE",
                                   "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS"};
  for (size_t i = 0; i < sizeof mpi_vars / sizeof mpi_vars[0]; i++) unsetenv(mpi_vars[i]);
  setenv_int("RANK", w->rank);
  setenv_int("LOCAL_RANK", w->local_rank);
  setenv_int("WORLD_SIZE", g->size);
  setenv_int("LOCAL_WORLD_SIZE", o->nproc);
  setenv_int("GROUP_RANK", o->node_rank);
  setenv("MASTER_ADDR", o->master_addr, 1);
  setenv_int("MASTER_PORT", g->port);
  setenv_int("FSDP_RESTART_COUNT", g->attempt);
  setenv_int("FSDP_MAX_RESTARTS", o->max_restarts);
  setenv("FSDP_RUN_ID", o->run_id, 1);
  if (w->ctl_rd >= 0) setenv_int("FSDP_RUN_CONTROL", w->ctl_rd);
  if (w->joining)
    setenv("FSDP_RUN_JOIN", "1", 1);
  else
    unsetenv("FSDP_RUN_JOIN");
  if (g->note_wr >= 0) {
    char notify[96];
    snprintf(notify, sizeof notify, "%s:%d", g->note_env, w->rank);
    setenv("FSDP_RUN_NOTIFY", notify, 1);
  }
}

/* In the child, with the supervisor's signals blocked (spawn): the default
 * dispositions come back before they are unblocked, so a SIGTERM that
 * arrives before exec ends the worker instead of running fsdp-run's handler
 * (which would report it to the launcher as its own). Never returns. */
static void child_exec(const group_t *g, const worker_t *w, int err_fd, const sigset_t *old) {
  signal(SIGCHLD, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  sigprocmask(SIG_SETMASK, old, NULL);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != g->launcher) _exit(1); /* fsdp-run died before prctl */
  setpgid(0, g->pgid);
  dup2(err_fd, STDERR_FILENO);
  close(err_fd);
  if (g->note_wr >= 0) fcntl(g->note_wr, F_SETFD, 0); /* the descriptors it inherits */
  if (w->ctl_rd >= 0) fcntl(w->ctl_rd, F_SETFD, 0);
  worker_env(g, w);
  execvp(g->o->argv[0], g->o->argv);
  fprintf(stderr, "fsdp-run: cannot run '%s': %s\n", g->o->argv[0], strerror(errno));
  _exit(127);
}

static int spawn(group_t *g, worker_t *w) {
  int p[2], c[2] = {-1, -1};
  if (g->o->min_nproc && pipe2(c, O_CLOEXEC)) return -1;
  w->ctl_rd = c[0];
  w->ctl = c[1];
  if (pipe2(p, O_CLOEXEC)) return -1;
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGCHLD);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigprocmask(SIG_BLOCK, &block, &old);
  pid_t pid = fork();
  if (pid == 0) child_exec(g, w, p[1], &old);
  int saved = errno;
  sigprocmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) {
    close(p[0]);
    close(p[1]);
    errno = saved;
    return -1;
  }
  if (g->pgid == 0) g->pgid = pid; /* the first worker leads the group */
  setpgid(pid, g->pgid);          /* also here: whichever runs first wins */
  close(p[1]);
  if (w->ctl_rd >= 0) close(w->ctl_rd);
  w->ctl_rd = -1;
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  w->pid = pid;
  w->fd = p[0];
  return 0;
}

/* ---- output -------------------------------------------------------------- */

/* Echoes one line prefixed with the rank (one write, so ranks never
 * interleave within a line) and remembers it when it says something. */
static void emit_line(worker_t *w, const char *line, size_t len) {
  char out[LINE_BYTES + 32];
  int n = snprintf(out, sizeof out, "[rank %d] %.*s\n", w->rank, (int)len, line);
  if (n > 0 && write(STDERR_FILENO, out, (size_t)n < sizeof out ? (size_t)n : sizeof out) < 0) {
    /* nobody to tell: our own stderr is gone */
  }
  size_t k = len;
  while (k && (line[k - 1] == ' ' || line[k - 1] == '\r' || line[k - 1] == '\t')) k--;
  if (k) snprintf(w->last, sizeof w->last, "%.*s", (int)k, line);
  w->fresh |= k > 0;
}

static void close_pipe(worker_t *w) {
  if (w->n_partial) emit_line(w, w->partial, w->n_partial);
  w->n_partial = 0;
  close(w->fd);
  w->fd = -1;
}

static void read_pipe(worker_t *w) {
  char buf[LINE_BYTES];
  ssize_t got = read(w->fd, buf, sizeof buf);
  if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
    close_pipe(w);
    return;
  }
  for (ssize_t i = 0; i < got; i++) {
    if (buf[i] == '\n' || w->n_partial == sizeof w->partial) {
      emit_line(w, w->partial, w->n_partial);
      w->n_partial = 0;
      if (buf[i] == '\n') continue;
    }
    w->partial[w->n_partial++] = buf[i];
  }
}

/* ---- notes from the workers ---------------------------------------------- */

/* The socket pair the workers' notes arrive on; without it (no descriptors
 * left) fsdp-run still runs, judging exits by their status alone. */
static void notes_open(group_t *g) {
  int sv[2];
  struct stat st;
  g->note_rd = g->note_wr = -1;
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv)) return;
  if (fstat(sv[1], &st)) {
    close(sv[0]);
    close(sv[1]);
    return;
  }
  g->note_rd = sv[0];
  g->note_wr = sv[1];
  fcntl(g->note_rd, F_SETFL, O_NONBLOCK);
  snprintf(g->note_env, sizeof g->note_env, "%d:%llu", g->note_wr,
           (unsigned long long)st.st_ino);
}

static void notes_close(group_t *g) {
  if (g->note_rd >= 0) close(g->note_rd);
  if (g->note_wr >= 0) close(g->note_wr);
}

static int spawn(group_t *g, worker_t *w);

/* --respawn: a new worker in each lost worker's slot, and the word of the
 * world they join (survivors first, in their order, then the new ones). */
static void respawn(group_t *g) {
  int alive = 0, joining = 0, port = run_free_port();
  for (int i = 0; i < g->n; i++) alive += !g->w[i].reaped;
  for (int i = 0; i < g->n && port >= 0; i++) {
    worker_t *w = &g->w[i];
    if (w->lost != 2) continue;
    if (w->ctl >= 0) close(w->ctl);
    if (w->fd >= 0) close_pipe(w);
    *w = (worker_t){.rank = w->rank, .local_rank = w->local_rank, .fd = -1, .ctl = -1,
                    .ctl_rd = -1, .cur = -1, .joining = 1};
    if (spawn(g, w)) {
      fprintf(stderr, "fsdp-run: cannot start a worker for rank %d: %s\n", w->rank,
              strerror(errno));
      w->reaped = 1;
      continue;
    }
    joining++;
  }
  if (!joining) return;
  g->generation++;
  g->lost_at = now_s();
  g->settling = 1;
  fprintf(stderr, "fsdp-run: started %d worker%s to replace the lost: world %d of %d ranks meets "
          "at port %d once the %d others reach their next snapshot\n", joining,
          joining == 1 ? "" : "s", g->generation, alive + joining, port, alive);
  g->size = alive + joining;
  for (int pass = 0, r = 0; pass < 2; pass++)
    for (int i = 0; i < g->n; i++) {
      worker_t *w = &g->w[i];
      if (w->reaped || w->joining != pass) continue;
      char line[96];
      int len = snprintf(line, sizeof line, "world %d %d %d %d\n", g->generation, r, g->size,
                         port);
      w->cur = r++;
      if (write(w->ctl, line, (size_t)len) != len) { /* it is dying: its exit is seen next */
      }
    }
}

static void stop_all(group_t *g, int sig);

/* Over nodes: node 0's word for this node's live workers (ranks in their
 * order), or the end of the job. -1 when the job ends. */
static int tell_world(group_t *g, const run_word_t *word) {
  if (word->kind == RUN_WORD_END) {
    if (g->o->node_rank) fprintf(stderr, "fsdp-run: ending the job: %s\n", word->why);
    if (!g->stopping) {
      g->failed = 1;
      stop_all(g, SIGTERM);
    }
    return -1;
  }
  if (word->kind != RUN_WORD_WORLD && word->kind != RUN_WORD_JOIN) return 0;
  g->generation = word->generation;
  g->size = word->size;
  g->lost_at = now_s();
  g->settling = 1;
  for (int i = 0, k = 0; i < g->n; i++) {
    worker_t *w = &g->w[i];
    if (w->reaped) continue;
    char line[96];
    int len = snprintf(line, sizeof line, "world %d %d %d %d %d %d\n", word->generation,
                       word->first + k, word->size, word->port, k, word->count);
    w->cur = k < word->count ? word->first + k : -1;
    k++;
    if (write(w->ctl, line, (size_t)len) != len) { /* it is dying: its exit is seen next */
    }
  }
  return 0;
}

static void log_resumed(const group_t *g, const worker_t *w, const char *msg) {
  long long step, lost;
  if (sscanf(msg, "%*s %*d %lld %lld", &step, &lost) != 2) return;
  fprintf(stderr, "fsdp-run: world %d (%d ranks, rank %d first launched as rank %d) resumed "
          "from the snapshot of step %lld: %lld step%s lost, first step done %.2f s after the "
          "loss\n", g->generation, g->size, w->cur, w->rank, step, lost, lost == 1 ? "" : "s",
          now_s() - g->lost_at);
}

/* Reads every note waiting: "joined R", "left R" (R the RANK fsdp-run gave),
 * "resumed R STEP LOST" (after a shrink). */
static void notes_read(group_t *g) {
  char msg[64];
  ssize_t n;
  while (g->note_rd >= 0 && (n = recv(g->note_rd, msg, sizeof msg - 1, 0)) > 0) {
    msg[n] = '\0';
    char event[16];
    int rank, i;
    if (sscanf(msg, "%15s %d", event, &rank) != 2) continue;
    i = rank - g->base;
    if (i < 0 || i >= g->n) continue;
    if (!strcmp(event, "joined")) g->w[i].joined = g->w[i].in_world = 1;
    if (!strcmp(event, "left")) g->w[i].in_world = 0;
    if (!strcmp(event, "resumed")) {
      log_resumed(g, &g->w[i], msg);
      g->settling = 0;
      for (int k = 0; k < g->n; k++) g->w[k].joining = 0;
      run_word_t word;
      if (g->nodes && !g->stopping && run_nodes_resumed(g->nodes, &word)) tell_world(g, &word);
      if (g->o->respawn && !g->stopping) respawn(g);
    }
  }
}

/* ---- supervision --------------------------------------------------------- */

static int failed_status(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

static int failed(const worker_t *w) {
  return !w->lost && (w->early || failed_status(w->status));
}

/* 1 when w, reaped with status 0, was still needed (the rule at the top). */
static int still_needed(const group_t *g, const worker_t *w) {
  if (w->in_world) return g->size > 1;
  if (w->joined) return 0;
  for (int i = 0; i < g->n; i++)
    if (g->w[i].joined) return 1;
  return 0;
}

/* SIGCONT first: a stopped worker would otherwise hold SIGTERM pending until
 * the SIGKILL after the grace period. */
static void signal_all(group_t *g, int sig) {
  for (int i = 0; i < g->n; i++)
    if (!g->w[i].reaped) {
      kill(g->w[i].pid, SIGCONT);
      kill(g->w[i].pid, sig);
      g->w[i].stopped_with = sig;
    }
  if (g->pgid > 0) killpg(g->pgid, SIGCONT);
  if (g->pgid > 0) killpg(g->pgid, sig); /* their own children too */
}

/* Asks every live worker to stop with sig; SIGKILL follows after the grace. */
static void stop_all(group_t *g, int sig) {
  if (!g->stopping) g->kill_at = now_s() + g->o->grace_s;
  g->stopping = 1;
  signal_all(g, sig);
}

static void describe(const group_t *g, const worker_t *w, char *buf, size_t n);

/* After losses (workers marked lost): tells every survivor its rank in the
 * world of survivors and where to meet; -1 (nothing sent) when fewer than
 * --min-nproc are left. */
static int shrink(group_t *g) {
  int alive = 0, lost = 0, port = run_free_port();
  for (int i = 0; i < g->n; i++) alive += !g->w[i].reaped;
  for (int i = 0; i < g->n; i++) {
    worker_t *w = &g->w[i];
    if (w->lost != 1) continue;
    char how[4600];
    describe(g, w, how, sizeof how);
    fprintf(stderr, "fsdp-run: lost rank %d (first launched as rank %d, local rank %d, host %s, "
            "pid %ld): it %s\n", w->cur, w->rank, w->local_rank, g->o->host, (long)w->pid, how);
    w->cur = -1;
    lost++;
  }
  if (g->nodes) { /* node 0's agent decides for every node */
    for (int i = 0; i < g->n; i++)
      if (g->w[i].lost == 1) g->w[i].lost = 2;
    char why[160];
    run_word_t word;
    snprintf(why, sizeof why, "node %d lost %d worker%s", g->o->node_rank, lost,
             lost == 1 ? "" : "s");
    if (!alive)
      fprintf(stderr, "fsdp-run: node %d has no worker left: the job goes on without it (node "
              "0 decides)\n", g->o->node_rank);
    return run_nodes_lost(g->nodes, alive, why, &word) ? tell_world(g, &word) : 0;
  }
  if (alive < g->o->min_nproc || alive < 1 || port < 0) {
    fprintf(stderr, "fsdp-run: %d rank%s left, fewer than --min-nproc %d: ending the job\n",
            alive, alive == 1 ? "" : "s", g->o->min_nproc);
    for (int i = 0; i < g->n; i++)
      if (g->w[i].lost == 1) g->w[i].lost = 0; /* failures after all */
    return -1;
  }
  for (int i = 0; i < g->n; i++)
    if (g->w[i].lost == 1) g->w[i].lost = 2;
  g->generation++;
  g->lost_at = now_s();
  g->settling = 1;
  fprintf(stderr, "fsdp-run: going on with %d of %d ranks (world %d, --min-nproc %d): the "
          "survivors meet at port %d and roll back to their last complete snapshot\n", alive,
          g->size, g->generation, g->o->min_nproc, port);
  g->size = alive;
  for (int i = 0, r = 0; i < g->n; i++) {
    worker_t *w = &g->w[i];
    if (w->reaped) continue;
    char line[96];
    int len = snprintf(line, sizeof line, "world %d %d %d %d\n", g->generation, r, alive, port);
    w->cur = r++;
    if (write(w->ctl, line, (size_t)len) != len) { /* it is dying: its exit is seen next */
    }
  }
  return 0;
}

/* A worker that failed on its own may be lost rather than failed (--min-nproc). */
static int may_lose(const group_t *g, const worker_t *w) {
  return g->o->min_nproc && !g->stopping && !w->stopped_with && failed_status(w->status);
}

static int waited_for(const worker_t *w);

/* --min-nproc: a rank that another's watchdog names as never arriving (it is
 * stopped or stuck) is killed, so that it is lost like one that died and the
 * others go on without it. Each line is judged once, when it is new, and
 * none while a loss settles (its ranks may be the world's before). */
static void kill_hung(group_t *g, worker_t *reporter) {
  int r = g->o->min_nproc && !g->stopping && !g->settling && reporter->fresh
              ? waited_for(reporter)
              : -1;
  reporter->fresh = 0; /* each line once: a later read must not act on it again */
  for (int i = 0; r >= 0 && i < g->n; i++) {
    worker_t *w = &g->w[i];
    if (w->cur != r || w->reaped || w->hung || w == reporter) continue;
    fprintf(stderr, "fsdp-run: rank %d's watchdog says rank %d (first launched as rank %d, pid "
            "%ld) never arrived: killing it so that the others go on without it\n",
            reporter->cur, r, w->rank, (long)w->pid);
    w->hung = 1;
    g->settling = 1; /* until the survivors resumed */
    kill(w->pid, SIGKILL); /* stopped or not */
  }
}

/* Reaps what has exited, then reads the notes: a worker sends its note
 * before it exits, so every exit seen here has its notes in the socket. Exits
 * with status 0 are judged until fsdp-run starts stopping the group (after
 * that, an exit is a consequence); a worker that never joined is judged
 * again as the notes of others arrive. */
static void reap(group_t *g) {
  int newly_failed = 0, lost = 0;
  g->round++;
  for (int i = 0; i < g->n; i++) {
    worker_t *w = &g->w[i];
    int status;
    if (w->reaped || waitpid(w->pid, &status, WNOHANG | WUNTRACED) != w->pid) continue;
    if (WIFSTOPPED(status)) { /* remembered for the report; it is still alive */
      w->paused_by = WSTOPSIG(status);
      continue;
    }
    w->status = status;
    w->reaped = 1;
    w->round = g->round;
    if (w->fd >= 0) g->drain_until = now_s() + DRAIN_S;
    if (may_lose(g, w)) {
      w->lost = 1;
      lost++;
      continue;
    }
    newly_failed |= failed_status(w->status);
  }
  if (lost && shrink(g)) newly_failed = 1;
  notes_read(g);
  for (int i = 0; i < g->n && !g->stopping; i++) {
    worker_t *w = &g->w[i];
    if (w->reaped && !w->lost && !failed(w) && still_needed(g, w)) newly_failed = w->early = 1;
  }
  if (newly_failed && !g->stopping) {
    g->failed = 1;
    stop_all(g, SIGTERM);
  }
}

static void on_signals(group_t *g) {
  unsigned char sigs[64];
  ssize_t n;
  while ((n = read(sig_pipe[0], sigs, sizeof sigs)) > 0)
    for (ssize_t i = 0; i < n; i++) {
      if (sigs[i] == SIGCHLD) continue; /* reaping happens every round */
      if (g->interrupted_by) { /* asked twice: no more grace */
        signal_all(g, SIGKILL);
        g->killed = 1;
        continue;
      }
      g->interrupted_by = sigs[i];
      stop_all(g, sigs[i]);
    }
}

static int live(const group_t *g, int *pipes_open) {
  int n = 0;
  *pipes_open = 0;
  for (int i = 0; i < g->n; i++) {
    n += !g->w[i].reaped;
    *pipes_open += g->w[i].fd >= 0;
  }
  return n;
}

/* Poll timeout: until the SIGKILL deadline, or the end of draining pipes
 * left open by workers already reaped (their children may hold them). */
static int poll_timeout_ms(const group_t *g, int n_live) {
  double until = -1;
  if (g->stopping && !g->killed && n_live) until = g->kill_at;
  if (!n_live) until = g->drain_until;
  if (until < 0) return -1;
  double left = until - now_s();
  return left <= 0 ? 0 : (int)(left * 1000.0) + 1;
}

static void supervise(group_t *g) {
  const int link_fds = g->nodes ? run_nodes_max_fds(g->nodes) : 0; /* the agents' link */
  struct pollfd *pf = calloc((size_t)g->n + 2 + (size_t)link_fds, sizeof *pf);
  int *who = calloc((size_t)g->n + 2, sizeof *who), pipes;
  if (!pf || !who) abort(); /* a few bytes; nothing sensible is left to do */
  for (int n_live; (n_live = live(g, &pipes)) || pipes;) {
    int k = 2; /* the notes are read by reap(), every round */
    pf[0] = (struct pollfd){sig_pipe[0], POLLIN, 0};
    pf[1] = (struct pollfd){g->note_rd, POLLIN, 0};
    for (int i = 0; i < g->n; i++)
      if (g->w[i].fd >= 0) pf[k] = (struct pollfd){g->w[i].fd, POLLIN, 0}, who[k++] = i;
    int m = g->nodes ? run_nodes_fds(g->nodes, pf + k, link_fds) : 0;
    int ms = poll_timeout_ms(g, n_live), link_ms = g->nodes ? run_nodes_timeout_ms(g->nodes) : -1;
    if (link_ms >= 0 && (ms < 0 || link_ms < ms)) ms = link_ms;
    int rc = poll(pf, (nfds_t)(k + m), ms);
    if (rc > 0 && pf[0].revents) on_signals(g);
    for (int j = 2; rc > 0 && j < k; j++)
      if (pf[j].revents) {
        read_pipe(&g->w[who[j]]);
        kill_hung(g, &g->w[who[j]]);
      }
    reap(g);
    run_word_t word;
    if (g->nodes && run_nodes_read(g->nodes, &word) && !g->stopping) tell_world(g, &word);
    if (g->stopping && !g->killed && now_s() >= g->kill_at && live(g, &pipes)) {
      signal_all(g, SIGKILL);
      g->killed = 1;
    }
    if (!live(g, &pipes) && now_s() >= g->drain_until)
      for (int i = 0; i < g->n; i++)
        if (g->w[i].fd >= 0) close_pipe(&g->w[i]);
  }
  free(pf);
  free(who);
}

/* ---- root cause ---------------------------------------------------------- */

/* 1 when w failed because a peer did, even when it was reaped before the
 * peer was: its last line says so (the comm layer's wording), or SIGPIPE
 * killed it (it wrote to a connection whose other end had gone). */
static int peer_caused(const worker_t *w) {
  return strstr(w->last, "a peer failed") != NULL ||
         (WIFSIGNALED(w->status) && WTERMSIG(w->status) == SIGPIPE);
}

/* How telling a failure seen in one round is: a death by signal (the others
 * usually fail because it died), then an early exit with status 0 (no peer's
 * failure makes a worker exit 0), then a non-zero exit. */
static int weight(const worker_t *w) { return WIFSIGNALED(w->status) ? 2 : w->early; }

/* The root cause: a failure fsdp-run did not cause itself, not one that blames
 * a peer if any other exists, then the earliest; among failures seen at once,
 * the most telling (weight), then the lowest rank. */
static int better_cause(const worker_t *w, const worker_t *best) {
  if (!best) return 1;
  if (peer_caused(w) != peer_caused(best)) return !peer_caused(w);
  if (w->round != best->round) return w->round < best->round;
  return weight(w) > weight(best);
}

static const worker_t *root_cause(const group_t *g) {
  const worker_t *best = NULL;
  for (int i = 0; i < g->n; i++) {
    const worker_t *w = &g->w[i];
    if (!w->reaped || !failed(w)) continue;
    if (WIFSIGNALED(w->status) && WTERMSIG(w->status) == w->stopped_with) continue;
    if (better_cause(w, best)) best = w;
  }
  return best;
}

/* ---- out of memory ------------------------------------------------------- */

/* The file holding this process's memory cgroup's oom_kill counter:
 * FSDP_RUN_MEMORY_EVENTS when set, else the first readable of memory.events
 * (cgroup v2) and memory.oom_control (v1's memory controller) of the cgroups
 * /proc/self/cgroup names; "" when there is none. */
static void oom_counter_path(char *path, size_t n) {
  const char *forced = getenv("FSDP_RUN_MEMORY_EVENTS");
  path[0] = '\0';
  if (forced) {
    snprintf(path, n, "%s", forced);
    return;
  }
  FILE *f = fopen("/proc/self/cgroup", "r");
  char line[3072]; /* with the mount and the file's name, within the 4096 of path */
  while (f && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    const char *cg = NULL, *file = NULL, *mount = NULL;
    if (!strncmp(line, "0::", 3))
      cg = line + 3, mount = "/sys/fs/cgroup", file = "memory.events";
    else if (strstr(line, ":memory:"))
      cg = strstr(line, ":memory:") + 8, mount = "/sys/fs/cgroup/memory",
      file = "memory.oom_control";
    if (!cg) continue;
    snprintf(path, n, "%s%s%s/%s", mount, *cg == '/' ? "" : "/", strcmp(cg, "/") ? cg : "",
             file);
    if (access(path, R_OK) == 0) break;
    path[0] = '\0';
  }
  if (f) fclose(f);
}

/* The "oom_kill N" line of path; -1 when it cannot be read. */
static long long oom_kills(const char *path) {
  FILE *f = path[0] ? fopen(path, "r") : NULL;
  char line[256];
  long long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "oom_kill %lld", &v) == 1) break;
  if (f) fclose(f);
  return v;
}

/* ": out of memory (...)" when w died of a SIGKILL fsdp-run did not send
 * and the cgroup's OOM kill counter rose during the attempt; else "". */
static void oom_note(const group_t *g, const worker_t *w, char *buf, size_t n) {
  buf[0] = '\0';
  if (!WIFSIGNALED(w->status) || WTERMSIG(w->status) != SIGKILL || w->stopped_with == SIGKILL ||
      g->oom_before < 0)
    return;
  long long now = oom_kills(g->oom_path);
  if (now > g->oom_before)
    snprintf(buf, n, ": out of memory (the kernel's OOM killer killed %lld process%s of this "
             "cgroup during the attempt: oom_kill %lld -> %lld in %s)", now - g->oom_before,
             now - g->oom_before == 1 ? "" : "es", g->oom_before, now, g->oom_path);
}

/* ---- report -------------------------------------------------------------- */

static void describe(const group_t *g, const worker_t *w, char *buf, size_t n) {
  if (w->early) {
    snprintf(buf, n, "exited with status 0 before the job finished: %s", w->joined
             ? "it had joined its world and not left it through fsdp_world_destroy, so its "
               "peers still needed it"
             : "it never joined the rendezvous, where its peers wait for it");
    return;
  }
  if (WIFEXITED(w->status)) {
    snprintf(buf, n, "exited with code %d", WEXITSTATUS(w->status));
    return;
  }
  int sig = WTERMSIG(w->status);
  const char *abbrev = sigabbrev_np(sig);
  char oom[4400];
  oom_note(g, w, oom, sizeof oom);
  snprintf(buf, n, "%s signal %d (SIG%s)%s", sig == w->stopped_with ? "was stopped by fsdp-run "
           "with" : w->hung ? "hung (a peer's watchdog named it) and was killed by fsdp-run "
           "with" : "was killed by", sig, abbrev ? abbrev : "?", oom);
}

static void report_worker(const group_t *g, const worker_t *w, const char *label) {
  char how[4600], paused[64] = "";
  describe(g, w, how, sizeof how);
  if (w->paused_by) {
    const char *abbrev = sigabbrev_np(w->paused_by);
    snprintf(paused, sizeof paused, "; it had been paused by SIG%s", abbrev ? abbrev : "?");
  }
  fprintf(stderr, "fsdp-run:   %srank %d (local rank %d, host %s, pid %ld) %s%s\n", label,
          w->rank, w->local_rank, g->o->host, (long)w->pid, how, paused);
  fprintf(stderr, "fsdp-run:     last error line: %s\n", w->last[0] ? w->last
                                                                    : "(nothing on stderr)");
}

/* The rank a watchdog report in w's last line names as never arriving
 * ("...; rank 3 never issued it", "; rank 3 published no progress"), when it
 * names exactly one; -1 otherwise. */
static int waited_for(const worker_t *w) {
  if (!strstr(w->last, "watchdog:")) return -1;
  static const char *const how[] = {" never issued it", " published no progress",
                                    " issued it but its stream"};
  for (size_t i = 0; i < sizeof how / sizeof how[0]; i++) {
    const char *end = strstr(w->last, how[i]);
    if (!end) continue;
    const char *p = end;
    while (p > w->last && p[-1] >= '0' && p[-1] <= '9') p--;
    if (p < end && p - w->last >= 7 && !strncmp(p - 7, "; rank ", 7)) return atoi(p);
  }
  return -1;
}

/* The root cause, or the local worker it was waiting for when its watchdog
 * names one: a rank that hangs (stopped, stuck) is why the others time out. */
static const worker_t *blamed(const group_t *g, const worker_t *root, const worker_t **reporter) {
  *reporter = NULL;
  int r = root ? waited_for(root) : -1;
  for (int i = 0; r >= 0 && i < g->n; i++)
    if (g->w[i].rank == r && &g->w[i] != root) {
      *reporter = root;
      return &g->w[i];
    }
  return root;
}

static void report(const group_t *g) {
  const worker_t *reporter, *root = blamed(g, root_cause(g), &reporter);
  fprintf(stderr, "fsdp-run: worker group failed on %s (attempt %d of %d)\n", g->o->host,
          g->attempt + 1, g->o->max_restarts + 1);
  if (root) report_worker(g, root, "root cause: ");
  if (reporter)
    fprintf(stderr, "fsdp-run:     rank %d was waiting for it: %s\n", reporter->rank,
            reporter->last);
  for (int i = 0; i < g->n; i++)
    if (&g->w[i] != root && g->w[i].reaped && (failed(&g->w[i]) || g->w[i].stopped_with))
      report_worker(g, &g->w[i], "");
}

/* ---- the attempt --------------------------------------------------------- */

static group_result_t run(const run_opts_t *o, int attempt, run_nodes_t *nodes,
                          const run_word_t *first, int *signal_out) {
  group_t g = {.o = o, .attempt = attempt, .n = o->nproc, .launcher = getpid(),
               .size = first ? first->size : o->nproc * o->nnodes, .nodes = nodes,
               .base = first ? first->first : o->node_rank * o->nproc,
               .port = first ? first->port : o->master_port};
  g.w = calloc((size_t)o->nproc, sizeof *g.w);
  if (!g.w) {
    fprintf(stderr, "fsdp-run: out of memory for %d workers\n", o->nproc);
    return GROUP_FAILED;
  }
  notes_open(&g);
  oom_counter_path(g.oom_path, sizeof g.oom_path);
  g.oom_before = oom_kills(g.oom_path);
  for (int i = 0; i < o->nproc; i++) {
    g.w[i] = (worker_t){.rank = g.base + i, .local_rank = i, .fd = -1, .reaped = 1, .ctl = -1,
                        .ctl_rd = -1, .cur = g.base + i,
                        .joining = first && first->kind == RUN_WORD_JOIN};
    if (spawn(&g, &g.w[i]) != 0) {
      fprintf(stderr, "fsdp-run: cannot start local rank %d: %s\n", i, strerror(errno));
      g.failed = 1;
      stop_all(&g, SIGTERM);
      break;
    }
    g.w[i].reaped = 0;
  }
  if (first && first->kind == RUN_WORD_JOIN && !g.stopping) tell_world(&g, first);
  run_word_t next; /* a word that came with the first one */
  if (nodes && !g.stopping && run_nodes_read(nodes, &next)) tell_world(&g, &next);
  supervise(&g);
  group_result_t result = g.interrupted_by ? GROUP_INTERRUPTED
                          : g.failed       ? GROUP_FAILED
                                           : GROUP_SUCCEEDED;
  if (result == GROUP_FAILED) report(&g);
  *signal_out = g.interrupted_by;
  notes_close(&g);
  for (int i = 0; i < o->nproc; i++)
    if (g.w[i].ctl >= 0) close(g.w[i].ctl);
  free(g.w);
  return result;
}

group_result_t run_group(const run_opts_t *o, int attempt, int *signal_out) {
  return run(o, attempt, NULL, NULL, signal_out);
}

group_result_t run_group_nodes(const run_opts_t *o, run_nodes_t *nodes, const run_word_t *first,
                               int *signal_out) {
  return run(o, 0, nodes, first, signal_out);
}
