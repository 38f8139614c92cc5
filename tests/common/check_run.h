/* tests/common/check_run.h — the runner of a one-process Check program
 * (unit, launch and checkpoint suites): its main builds the suite and
 * returns check_run(suite). Programs with ranks use common/mpi_check.h. */
#ifndef FSDP_TESTS_COMMON_CHECK_RUN_H
#define FSDP_TESTS_COMMON_CHECK_RUN_H

#include <check.h>

/* Runs every test of s (forked or not as CK_FORK says, failures printed),
 * frees s, and returns EXIT_SUCCESS when none failed, else EXIT_FAILURE. */
int check_run(Suite *s);

#endif
