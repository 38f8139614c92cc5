/* tests/common/solo_world.c — a world of one rank. */
#include "common/solo_world.h"

fsdp_status_t solo_world_init(fsdp_world_t *world) {
  fsdp_world_opts_t o = FSDP_WORLD_OPTS_INIT;
  o.launch = FSDP_LAUNCH_SINGLE;
  return fsdp_world_init(world, &o);
}
