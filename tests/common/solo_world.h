/* tests/common/solo_world.h — the world of one process that single-rank tests
 * build their engines in: FSDP_LAUNCH_SINGLE (the self backend), whatever
 * launcher the program runs under. */
#ifndef FSDP_TESTS_COMMON_SOLO_WORLD_H
#define FSDP_TESTS_COMMON_SOLO_WORLD_H

#include "fsdp/world.h"

/* fsdp_world_init of a world of one; fsdp_world_destroy it. */
fsdp_status_t solo_world_init(fsdp_world_t *world);

#endif
