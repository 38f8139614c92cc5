/* src/world/world_internal.h — what the comm layer needs to know about a world
 * beyond MPI: how it was launched, its env:// store, its deadlines, and a slot
 * where the comm layer keeps per-world state (the watchdog). Free of mpi.h so
 * the C++ gloo adapter can include it. Only src/world and src/comm include it.
 * Not installed. */
#ifndef FSDP_WORLD_INTERNAL_H
#define FSDP_WORLD_INTERNAL_H

#include <stddef.h>

#include "world/store.h"
#include "fsdp/world.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FSDP_WORLD_SELF = 0, FSDP_WORLD_MPI, FSDP_WORLD_ENV } fsdp_world_kind_t;

fsdp_world_kind_t fsdp_world_kind(fsdp_world_t world);
/* 1 when collectives exchange fingerprints first: the default; 0 when world
 * opts (-1) or FSDP_DESYNC_CHECK=0 turned it off. */
int fsdp_world_desync_check(fsdp_world_t world);
double fsdp_world_rendezvous_timeout(fsdp_world_t world);

/* env:// only (NULL otherwise): the world's own store client, for the thread
 * that creates and destroys communicators (the main thread). */
fsdp_store_t *fsdp_world_store(fsdp_world_t world);
/* env:// only: a new client of the world's store for a thread of its own
 * (the watchdog); the caller closes it. FSDP_ERR_UNSUPPORTED elsewhere. */
fsdp_status_t fsdp_world_store_open(fsdp_world_t world, fsdp_store_t **out);
/* env:// only: the numeric address other ranks reach this process at (the
 * interface that routes to MASTER_ADDR); "" elsewhere. */
const char *fsdp_world_host_address(fsdp_world_t world);

/* Records that communication failed (timeout, desync, a lost peer): the
 * world then skips the exit barrier in fsdp_world_destroy, which the failed
 * ranks would never reach. Safe from any thread. */
void fsdp_world_mark_failed(fsdp_world_t world);
/* fsdp-run's control pipe (FSDP_RUN_CONTROL) of an elastic worker, else -1. */
int fsdp_world_control_fd(void);
/* 1 when fsdp-run has announced on control pipe fd a world newer than the
 * last one joined and smaller than `size` (the current world's): a rank was
 * lost, and this world is over (*new_generation, *new_size: that world).
 * Only peeks (the word stays for fsdp_world_rejoin), never blocks, and is
 * callable from any thread (0 while another thread reads the pipe). */
int fsdp_world_loss_announced(int fd, int size, int *new_generation, int *new_size);

/* The next communicator id of this world: 0, 1, 2, ... over the world's
 * whole life. Communicators are created collectively, in the same order on
 * every rank, so ids agree across ranks and never repeat (the gloo backend
 * keys each communicator's store entries by it). Main thread only. */
int fsdp_world_next_comm_id(fsdp_world_t world);

/* The comm layer's per-world state: stored, never interpreted, by dist. Set
 * and read only while creating or destroying communicators (main thread). */
void *fsdp_world_comm_state(fsdp_world_t world);
void fsdp_world_set_comm_state(fsdp_world_t world, void *state);

#ifdef __cplusplus
}
#endif
#endif
