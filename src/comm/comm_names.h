/* src/comm/comm_names.h — names in comm's reports: the tag of the next
 * collective and the label of a communicator's group. The one part of comm's
 * internals the layers above it inside the library (the engine) use besides
 * fsdp/comm.h; comm_internal.h includes it. Not installed. */
#ifndef FSDP_COMM_NAMES_H
#define FSDP_COMM_NAMES_H

#include "fsdp/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_COMM_TAG_MAX 32 /* bytes of a collective's tag, NUL included */
#define FSDP_COMM_LABEL_MAX 96 /* bytes of a communicator's label, NUL included */

/* Labels the next collective issued on comm (the engine passes the unit
 * name): the tag appears in desync fingerprints and watchdog messages. The
 * text is copied (truncated to FSDP_COMM_TAG_MAX - 1 bytes); call it from
 * the thread that issues on comm, right before the collective. */
void fsdp_comm_set_tag(fsdp_comm_t comm, const char *tag);
/* Names the group a communicator spans in watchdog and desync reports, e.g.
 * "shard group 1 (world ranks 2-3)"; copied, truncated to FSDP_COMM_LABEL_MAX - 1. */
void fsdp_comm_set_label(fsdp_comm_t comm, const char *label);
/* comm's label ("" for none, or comm NULL); owned by comm, valid until the
 * next fsdp_comm_set_label or its destroy. fsdp_comm_split labels a group
 * "group <colour> of communicator <id>: world rank(s) <list>". */
const char *fsdp_comm_label(fsdp_comm_t comm);

#ifdef __cplusplus
}
#endif

#endif
