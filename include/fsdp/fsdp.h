/* fsdp/fsdp.h — everything a C trainer needs: include this one header. */
#ifndef FSDP_FSDP_H
#define FSDP_FSDP_H
#include "fsdp/core.h"
#include "fsdp/world.h"
#include "fsdp/device.h"
#include "fsdp/comm.h"
#include "fsdp/optim.h"
#include "fsdp/engine.h"
#include "fsdp/profile.h"
#include "fsdp/plan.h"
#include "fsdp/nn.h"
#include "fsdp/data.h"
#include "fsdp/ckpt.h"
#include "fsdp/replica.h"
#include "fsdp/tokenizer.h"
#endif
