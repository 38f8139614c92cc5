/* src/world/rendezvous.h — the env:// bootstrap (rendezvous.c), used by
 * world.c: read RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK,
 * LOCAL_WORLD_SIZE when given), serve the store on rank 0, and wait until
 * every rank has joined. FSDP_RUN_ID (fsdp-run sets it) is the job's id: the
 * store serves ranks of that job only. Under fsdp-run (FSDP_RUN_NOTIFY) a
 * rank tells the launcher when it has joined and when it has left, so that a
 * worker exiting with status 0 while its peers need it is named. Not
 * installed. */
#ifndef FSDP_WORLD_RENDEZVOUS_H
#define FSDP_WORLD_RENDEZVOUS_H

#include "world/store.h"
#include "fsdp/core.h"

typedef struct fsdp_env_world fsdp_env_world_t;

typedef struct {
  int rank, size, local_rank, local_size;
} fsdp_env_layout_t;

/* 1 when the environment asks for env:// (MASTER_ADDR or MASTER_PORT set). */
int fsdp_env_requested(void);

/* Joins the env:// rendezvous within timeout_s. On FSDP_ERR_TIMEOUT every
 * rank that can still reach the store says which ranks never joined; a rank
 * that cannot reach it says where it looked. expected > 0 must equal
 * WORLD_SIZE. */
fsdp_status_t fsdp_env_world_start(double timeout_s, int expected, fsdp_env_world_t **out,
                                   fsdp_env_layout_t *layout);
/* Waits (within the rendezvous timeout) until every rank has called this,
 * unless failed, so that rank 0 never takes the store away from ranks still
 * using it; tells fsdp-run the rank has left; then stops serving and
 * disconnects. */
void fsdp_env_world_stop(fsdp_env_world_t *env, int failed);

/* Sends fsdp-run a note "EVENT R[ EXTRA]" (R the RANK it launched this
 * worker as) when it listens (FSDP_RUN_NOTIFY); nothing otherwise. */
void fsdp_env_notify(const char *event, const char *extra);

fsdp_store_t *fsdp_env_world_store(fsdp_env_world_t *env);
fsdp_status_t fsdp_env_world_store_open(fsdp_env_world_t *env, fsdp_store_t **out);
const char *fsdp_env_world_host_address(const fsdp_env_world_t *env);

#endif
