/* fsdp/replica.h — buddy replicas: a checkpoint kept in the peers' host memory.
 *
 * Every `every` updates each rank copies what it owns of the training state
 * (the fp32 master shard, the optimizer moments, the step and the loss
 * scaler's state, and the trainer's integers: data position, seeds) into a
 * host buffer of its own and sends that buffer to its buddy, which keeps it.
 * The buddy of rank r is rank (r + L) mod N, L the ranks per node when the
 * world spans several nodes (so a copy lives in another failure domain), else
 * 1. The transfer is one fsdp_shift on a communicator and CPU stream of the
 * replica's own, so it runs beside the next steps instead of inside them.
 *
 * Double-buffered: each rank holds its own last two snapshots and the last
 * two it received, each tagged with its step. A received snapshot counts only
 * once its transfer completed and its header (magic, step, source rank, world
 * size, bytes) checks out; until then the previous one is the newest complete
 * copy. Memory: 4 x fsdp_replica_info().snapshot_bytes per rank (about
 * 4 x 12 bytes per parameter / S with AdamW, S the ranks a unit is sharded
 * over: the world, HSDP's shard size, 1 under NO_SHARD), reported by
 * fsdp-train at start-up; fsdp_replica_bytes computes it before an engine
 * exists (fsdp-bench --memory-plan).
 *
 * After a rank is lost, the survivors rebuild the training state of the last
 * snapshot complete for every shard, for a new world of any size and layout,
 * from memory alone (fsdp_replica_restore; no file is read). Under HSDP
 * (config.shard_size S < N) every shard is held by the N / S ranks of a
 * replica group, bit for bit the same: a lost rank's shard is taken from a
 * surviving rank of its replica group's own snapshot of that step (all of a
 * step's snapshots hold the same step, loss scaler and trainer integers), and
 * only when all of them are lost from a buddy's copy.
 *
 * Thread safety: one thread (the trainer's) calls every function of a
 * replica. Errors: every call returns fsdp_status_t, fsdp_last_error() says
 * why. */
#ifndef FSDP_REPLICA_H
#define FSDP_REPLICA_H

#include "fsdp/ckpt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_replica *fsdp_replica_t;

/* Snapshot every 10 updates unless told otherwise: on the CPU bench (tiny
 * GPT-2, 4 ranks over Gloo) a snapshot costs under 2 % of the steps between
 * two of them (docs/launching.md has the numbers). */
#define FSDP_REPLICA_DEFAULT_EVERY 10

typedef struct {
  int every;            /* updates between snapshots */
  int world_size, rank; /* the world the snapshots were taken in */
  int buddy;            /* the rank that keeps this rank's snapshots */
  int source;           /* the rank whose snapshots this rank keeps */
  size_t snapshot_bytes; /* one snapshot (header + payload) */
  size_t host_bytes;     /* all four buffers */
  int64_t own_step[2];   /* this rank's snapshots: their steps, -1 none */
  int64_t held_step[2];  /* complete snapshots received from `source`, -1 none */
  int snapshots;         /* taken so far */
  double copy_s;         /* seconds spent copying shards into snapshots, in the trainer's
                            thread (the part of a snapshot on the step's path), all of them */
} fsdp_replica_info_t;

/* A replica of engine's shards, snapshotted every `every` updates (0:
 * FSDP_REPLICA_DEFAULT_EVERY). Collective over the engine's world (it
 * creates a communicator). The engine must be materialized; its units must
 * not change afterwards. FSDP_ERR_INVALID_ARGUMENT for every < 0. */
FSDP_API fsdp_status_t fsdp_replica_create(fsdp_engine_t engine, int every,
                                           fsdp_replica_t *out);

/* Call after every update (collective: every rank calls it after the same
 * update). When the engine's step is a positive multiple of `every` it waits
 * for the previous snapshot's transfer (normally long done), copies this
 * rank's shard and meta (may be NULL) into the older of its two buffers and
 * starts sending it to the buddy; otherwise it does nothing. *taken (may be
 * NULL) is 1 when a snapshot was taken. A failed transfer (a peer lost) is
 * returned here or by fsdp_replica_wait, with the communication error. */
FSDP_API fsdp_status_t fsdp_replica_snapshot(fsdp_replica_t replica, const fsdp_ckpt_meta_t *meta,
                                             int *taken);
/* Waits for the transfer in flight, if any (collective in effect: the buddy
 * must send too). */
FSDP_API fsdp_status_t fsdp_replica_wait(fsdp_replica_t replica);
FSDP_API fsdp_status_t fsdp_replica_info(fsdp_replica_t replica, fsdp_replica_info_t *info);

/* What a replica of units of numel[0 .. n_units) parameters costs per rank,
 * before any engine exists: *snapshot (may be NULL) one snapshot's bytes,
 * *host (may be NULL) the host memory fsdp_replica_create allocates (its
 * four snapshots), equal to fsdp_replica_info's snapshot_bytes and
 * host_bytes for an engine of those units. shards: the ranks a unit is
 * sharded over (config.shard_size, the world without HSDP, 1 under
 * NO_SHARD); align: config.align; n_states: 1 + the optimizer's states per
 * element (3 for AdamW, 2 for SGD with momentum). FSDP_ERR_INVALID_ARGUMENT
 * naming a bad value. Thread-safe; allocates nothing. */
FSDP_API fsdp_status_t fsdp_replica_bytes(const size_t *numel, int n_units, int n_states,
                                          int shards, size_t align, size_t *snapshot,
                                          size_t *host);

/* The state `state` (0 master, 1 and 2 the optimizer's, as fsdp_ckpt_read
 * numbers them) of unit `unit` in the snapshot of step `step` that this rank
 * keeps for `source` (held 1) or its own (held 0): *data points at *count
 * elements (the shard's capacity: elements past its count are padding), owned
 * by the replica and valid until the next snapshot. FSDP_ERR_INVALID_ARGUMENT
 * when there is no such complete snapshot, unit or state. */
FSDP_API fsdp_status_t fsdp_replica_view(fsdp_replica_t replica, int held, int64_t step,
                                         int unit, int state, const float **data,
                                         size_t *count);

/* After a communication failure: waits for the transfer in flight to end
 * (it fails or completes; a failure is not an error here) and destroys the
 * replica's communicator and stream, so that the world can be destroyed and
 * made anew. The snapshots stay. Idempotent. */
FSDP_API void fsdp_replica_disconnect(fsdp_replica_t replica);

/* The survivors' rebuild (collective over `engine`'s world, a new world of
 * M ranks made after the loss; every rank of it must hold its replica from
 * the old world of N ranks, disconnected or not: it is disconnected first).
 * The ranks agree on the newest step s such that every old shard has a
 * complete snapshot s on a survivor: the own snapshot of a surviving rank
 * that held the shard (under HSDP any rank of its replica group), else a
 * buddy's copy of a lost one; then every unit's old shards are moved to the
 * owners of the new layout, whatever it is (another world size, another
 * shard size, HSDP or not: one broadcast per unit and old shard, from the
 * rank holding it: each rank receives the whole state once, one old shard at
 * a time), the engine's
 * master shards and optimizer state are overwritten, and its step (and the
 * loss scaler's state) set to s. The old and new engines must have the same
 * units and tensors. *meta (may be NULL) receives the snapshot's trainer
 * integers, *step (may be NULL) s. Afterwards the replica snapshots the new
 * world (its communicator is made here; its old snapshots are dropped).
 * FSDP_ERR_INVALID_USAGE, on every rank, when no step has a complete copy of
 * every shard (naming the lost rank and its buddy, or under HSDP the shard
 * and the ranks that held it, and why) or when config.align changed; the
 * engine is then untouched. */
FSDP_API fsdp_status_t fsdp_replica_restore(fsdp_replica_t replica, fsdp_engine_t engine,
                                            fsdp_ckpt_meta_t *meta, int64_t *step);

/* A rank joining a running job (fsdp_world_joining: it has no snapshots):
 * its side of the survivors' fsdp_replica_restore over the new world, which
 * it receives its shard from; *out then snapshots like the others'.
 * Collective with the survivors' restore; errors as there. */
FSDP_API fsdp_status_t fsdp_replica_join(fsdp_engine_t engine, int every, fsdp_replica_t *out,
                                         fsdp_ckpt_meta_t *meta, int64_t *step);

FSDP_API void fsdp_replica_destroy(fsdp_replica_t replica); /* NULL is ignored */

#ifdef __cplusplus
}
#endif
#endif
