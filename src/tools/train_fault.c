/* src/tools/train_fault.c — fault injection for tests, in one place: the
 * FSDP_FAULT environment variable makes one rank of fsdp-train fail in the
 * middle of a step (after its forward and backward, with gradient
 * reductions in flight, before the optimizer step):
 *
 *   FSDP_FAULT=ACTION:rank=R:step=S[:attempt=A]
 *     kill   the rank sends itself SIGKILL (a crash: no message, no cleanup)
 *     stall  the rank stops calling collectives and blocks forever (a hang)
 *     exit   the rank prints an error line and exits with status 3
 *     fail   the step returns an error on that rank alone (t->error says why):
 *            the trainer's own error path, while the others wait in a
 *            collective for it
 *     snapkill  SIGKILL as the buddy snapshot after update S begins
 *            (--replica-every): the others have sent theirs, it sends none,
 *            so its buddy holds only the snapshot before (train_fault_snapshot)
 *   S counts from 1 (the step being taken). A is the launch attempt it fires
 *   in (FSDP_RESTART_COUNT, default 0), so a restarted group runs clean. R is
 *   the rank the process was launched as (after an elastic shrink its rank
 *   changes, the fault's does not). Several faults: SPEC,SPEC,...
 *
 * Test-only: nothing else reads FSDP_FAULT. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/train.h"

typedef enum {
  FAULT_NONE = 0,
  FAULT_KILL,
  FAULT_STALL,
  FAULT_EXIT,
  FAULT_FAIL,
  FAULT_SNAPKILL
} fault_action_t;

typedef struct {
  fault_action_t action;
  int rank, step, attempt;
} fault_t;

static int fault_one(trainer_t *t, const char *spec, int launch_rank, int step, int at_snapshot);

/* Parses "ACTION:rank=R:step=S[:attempt=A]"; 0, or -1 when malformed. */
static int fault_parse(const char *spec, fault_t *f) {
  char action[16];
  int n = 0, m = 0;
  *f = (fault_t){FAULT_NONE, -1, -1, 0};
  if (sscanf(spec, "%15[a-z]:rank=%d:step=%d%n", action, &f->rank, &f->step, &n) != 3) return -1;
  if (spec[n] && (sscanf(spec + n, ":attempt=%d%n", &f->attempt, &m) != 1 || spec[n + m]))
    return -1;
  f->action = !strcmp(action, "kill")    ? FAULT_KILL
              : !strcmp(action, "stall") ? FAULT_STALL
              : !strcmp(action, "exit")  ? FAULT_EXIT
              : !strcmp(action, "fail")  ? FAULT_FAIL
              : !strcmp(action, "snapkill") ? FAULT_SNAPKILL
                                         : FAULT_NONE;
  return f->action == FAULT_NONE || f->rank < 0 || f->step < 1 || f->attempt < 0 ? -1 : 0;
}

int train_fault(trainer_t *t, int step) {
  static int launch_rank = -1; /* the first call comes before any shrink */
  if (launch_rank < 0) launch_rank = t->rank;
  const char *all = getenv("FSDP_FAULT");
  if (!all || !*all) return 0;
  char specs[512], *save = NULL;
  snprintf(specs, sizeof specs, "%s", all);
  for (char *spec = strtok_r(specs, ",", &save); spec; spec = strtok_r(NULL, ",", &save))
    if (fault_one(t, spec, launch_rank, step, 0)) return -1;
  return 0;
}

void train_fault_snapshot(trainer_t *t, int step) {
  static int launch_rank = -1;
  if (launch_rank < 0) launch_rank = t->rank; /* the first snapshot comes before any shrink */
  const char *all = getenv("FSDP_FAULT");
  if (!all || !*all) return;
  char specs[512], *save = NULL;
  snprintf(specs, sizeof specs, "%s", all);
  for (char *spec = strtok_r(specs, ",", &save); spec; spec = strtok_r(NULL, ",", &save))
    fault_one(t, spec, launch_rank, step, 1);
}

static int fault_one(trainer_t *t, const char *spec, int launch_rank, int step, int at_snapshot) {
  fault_t f;
  if (fault_parse(spec, &f)) {
    if (at_snapshot) return 0; /* train_fault says so, every step */
    fprintf(stderr, "fsdp-train: FSDP_FAULT='%s' is not ACTION:rank=R:step=S[:attempt=A] "
            "with ACTION kill, stall, exit or fail\n", spec);
    return -1;
  }
  const char *rc = getenv("FSDP_RESTART_COUNT");
  if (f.rank != launch_rank || f.step != step || f.attempt != (rc ? atoi(rc) : 0) ||
      (f.action == FAULT_SNAPKILL) != at_snapshot)
    return 0;
  fflush(stdout);
  if (f.action == FAULT_KILL || f.action == FAULT_SNAPKILL) raise(SIGKILL);
  if (f.action == FAULT_STALL)
    for (;;) pause(); /* the hang being simulated: only a signal ends it */
  if (f.action == FAULT_FAIL)
    return snprintf(t->error, sizeof t->error, "injected failure at step %d (FSDP_FAULT=%s)",
                    step, spec), -1;
  fprintf(stderr, "fsdp-train: rank %d: injected failure at step %d (FSDP_FAULT=%s)\n",
          t->rank, step, spec);
  exit(3); /* like a trainer that gives up on its own, without a collective goodbye */
}
