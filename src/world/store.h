/* src/world/store.h — the env:// key-value store: a small TCP server (run by
 * rank 0 of an env:// world) and its clients. It carries the rendezvous, the
 * gloo full-mesh addresses of every communicator, the watchdog's progress
 * reports, and (with the CUDA issue) the NCCL unique id.
 *
 * Values are byte strings. A get waits on the server until the key exists or
 * its timeout passes, so waiting costs no polling and a set wakes every waiter
 * at once. add keeps a signed 64-bit counter stored as decimal text, so a get
 * of a counter reads its value.
 *
 * A store belongs to one job: the server is started with a job id (fsdp-run's
 * --rdzv-id, FSDP_RUN_ID) and turns away a client that brings another, so
 * two jobs that meet on one port never share keys (a stranger's RANK=1 would
 * otherwise take the job's own).
 *
 * Errors: FSDP_ERR_TIMEOUT when a deadline passes (the key, the store address
 * and the timeout are named), FSDP_ERR_COMM when the server cannot be reached
 * or the connection breaks, FSDP_ERR_INVALID_USAGE when the store belongs to
 * another job (both ids named), FSDP_ERR_INVALID_ARGUMENT for bad keys or
 * sizes.
 *
 * Threads: the server runs on a thread of its own. A client is one TCP
 * connection; its calls are serialised by a mutex, so a thread that must not
 * wait behind another's get (the watchdog) opens a client of its own.
 * Not installed. */
#ifndef FSDP_WORLD_STORE_H
#define FSDP_WORLD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_STORE_KEY_MAX 1024            /* bytes of a key */
#define FSDP_STORE_VALUE_MAX (64u << 20)   /* bytes of a value */
#define FSDP_STORE_JOB_MAX 255             /* bytes of a job id */

typedef struct fsdp_store_server fsdp_store_server_t;
typedef struct fsdp_store fsdp_store_t;

/* Serves the store of job (NULL or "": no id; at most FSDP_STORE_JOB_MAX
 * bytes, copied) on every local address at port (0: any free port;
 * *bound_port says which, and may be NULL). Fails with FSDP_ERR_COMM naming
 * the port when it cannot be bound (in use, no permission). */
fsdp_status_t fsdp_store_server_start(int port, const char *job, fsdp_store_server_t **out,
                                      int *bound_port);
/* Stops the server thread and closes every connection; clients see it closed. */
void fsdp_store_server_stop(fsdp_store_server_t *server);

/* Connects to host:port, retrying refused or unreachable connections until
 * timeout_s has passed (the server may not be up yet), then checks that the
 * peer speaks this protocol and serves job (NULL or "": the store of a job
 * without an id). On failure the message names host, port, the time spent
 * and the last error from the network, or both job ids (at once, without
 * retrying: the port belongs to another job). */
fsdp_status_t fsdp_store_connect(const char *host, int port, const char *job, double timeout_s,
                                 fsdp_store_t **out);
void fsdp_store_close(fsdp_store_t *store);

fsdp_status_t fsdp_store_set(fsdp_store_t *store, const char *key, const void *value,
                             size_t len);
/* Waits up to timeout_s (0: answers at once) for key, then hands back a copy
 * of its value, NUL-terminated for convenience (*len excludes the NUL). The
 * caller frees *value with fsdp_free. */
fsdp_status_t fsdp_store_get(fsdp_store_t *store, const char *key, double timeout_s,
                             char **value, size_t *len);
/* Waits until every key exists, all within one timeout. On FSDP_ERR_TIMEOUT,
 * *first_missing (may be NULL) is the index of the key it was waiting for. */
fsdp_status_t fsdp_store_wait(fsdp_store_t *store, const char *const *keys, int n,
                              double timeout_s, int *first_missing);
/* *value (may be NULL) = the counter after adding delta (a missing key is 0). */
fsdp_status_t fsdp_store_add(fsdp_store_t *store, const char *key, int64_t delta,
                             int64_t *value);
/* *exists = 1 when key is set, else 0; never waits. */
fsdp_status_t fsdp_store_check(fsdp_store_t *store, const char *key, int *exists);

#ifdef __cplusplus
}
#endif
#endif
