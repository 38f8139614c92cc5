/* src/world/store_proto.h — the store's wire format and socket helpers, shared
 * by the server (store_server.c) and the client (store.c).
 *
 * A request is a 24-byte header (op, key length, value length, a 64-bit
 * argument; big-endian) followed by the key and the value. A reply is a
 * 16-byte header (status, value length, argument) followed by the value. The
 * argument is the timeout in milliseconds of a get, the delta of an add, and
 * in replies the counter of an add or the answer of a check. A connection
 * starts with a hello whose key is STORE_MAGIC and whose value is the job id,
 * so a client that reached some other service finds out at once instead of
 * waiting for a timeout, and one that reached another job's store is turned
 * away (STORE_BAD, with the store's own job id as the value). */
#ifndef FSDP_WORLD_STORE_PROTO_H
#define FSDP_WORLD_STORE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define STORE_MAGIC "fsdp-store-1"
#define STORE_REQ_BYTES 24
#define STORE_REP_BYTES 16

enum { STORE_HELLO = 1, STORE_SET, STORE_GET, STORE_ADD, STORE_CHECK };
enum { STORE_OK = 0, STORE_MISSING, STORE_BAD };

static inline void store_put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i));
}
static inline uint32_t store_get_u32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline void store_put_i64(uint8_t *p, int64_t v) {
  store_put_u32(p, (uint32_t)((uint64_t)v >> 32));
  store_put_u32(p + 4, (uint32_t)v);
}
static inline int64_t store_get_i64(const uint8_t *p) {
  return (int64_t)((uint64_t)store_get_u32(p) << 32 | store_get_u32(p + 4));
}

/* Sends or receives exactly n bytes on a non-blocking socket before the
 * deadline (fsdp_time_now() seconds). 0 on success; -1 with errno set
 * (ETIMEDOUT at the deadline, EPIPE when the peer closed). */
int fsdp_sock_send_all(int fd, const void *buf, size_t n, double deadline);
int fsdp_sock_recv_all(int fd, void *buf, size_t n, double deadline);
/* Marks a socket non-blocking, close-on-exec and without Nagle delay. */
int fsdp_sock_tune(int fd);

#endif
