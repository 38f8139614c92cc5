/* tests/common/check_run.c — one suite, one process, one exit status. */
#include <stdlib.h>

#include "common/check_run.h"

int check_run(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
