/* src/comm/comm_internal.h — the table every communication backend implements
 * (mpi, self; nccl later). comm.c validates arguments once, then either runs a
 * collective now (host stream) or queues it on a stream, and calls the backend
 * only through this table. Not installed. */
#ifndef FSDP_COMM_INTERNAL_H
#define FSDP_COMM_INTERNAL_H

#include "fsdp/comm.h"

typedef enum {
  FSDP_COLL_ALL_GATHER = 0,
  FSDP_COLL_REDUCE_SCATTER,
  FSDP_COLL_ALL_REDUCE,
  FSDP_COLL_BROADCAST,
  FSDP_COLL_BARRIER
} fsdp_coll_kind_t;

/* One validated collective, as issued. For a broadcast, recv is the buffer. */
typedef struct {
  fsdp_coll_kind_t kind;
  const void *send;
  void *recv;
  size_t count; /* elements per rank (all_gather, reduce_scatter) or in total */
  fsdp_dtype_t dtype;
  fsdp_reduce_op_t op;
  int root;
  int in_place; /* send/recv are one of the in-place layouts of comm.h */
} fsdp_coll_t;

typedef struct fsdp_comm_ops {
  const char *name;
  size_t max_count; /* largest count one call accepts (MPI counts are int) */
  /* Sets up comm->impl, rank and size for a communicator over the world. */
  fsdp_status_t (*create)(fsdp_world_t world, fsdp_comm_t comm);
  /* Sets up out->impl, rank and size as an independent copy of comm. */
  fsdp_status_t (*dup)(fsdp_comm_t comm, fsdp_comm_t out);
  void (*destroy)(fsdp_comm_t comm); /* releases comm->impl only */
  /* Performs the collective, blocking the calling thread until it is done. */
  fsdp_status_t (*run)(fsdp_comm_t comm, const fsdp_coll_t *coll);
} fsdp_comm_ops_t;

struct fsdp_comm {
  const fsdp_comm_ops_t *ops;
  int rank, size;
  void *impl; /* backend state */
};

extern const fsdp_comm_ops_t fsdp_comm_mpi_ops;
extern const fsdp_comm_ops_t fsdp_comm_self_ops;

/* buf[i] *= factor for a reduction dtype (F32 or F64); used for FSDP_AVG. */
void fsdp_comm_scale(void *buf, size_t count, fsdp_dtype_t dtype, double factor);
/* The collective's name for messages, e.g. "all_gather". */
const char *fsdp_coll_name(fsdp_coll_kind_t kind);

#endif
