/* src/comm/comm_gloo.cc — the "gloo" backend of an env:// world: host buffers
 * over Gloo's TCP transport (Debian's libgloo). A thin adapter: each
 * fsdp_comm_t is one gloo context, fully meshed through the world's store
 * under its own key prefix ("comm/<id>/"), so communicators used from
 * different streams never see each other's messages; the TCP device (one
 * event-loop thread) is shared by the communicators of a world.
 *
 * all_gather, all_reduce, broadcast and barrier are Gloo's own collectives;
 * shift is one send and one receive on Gloo's unbound buffers.
 * Gloo has no reduce-scatter in its collective API (only the legacy
 * ReduceScatterHalvingDoubling class, whose buffers are bound at construction
 * and whose device thread busy-polls when a peer runs ahead: unfit for
 * per-call buffers), so reduce_scatter is a ring of its own over Gloo's
 * unbound buffers: N-1 steps, each sending one slice to the next rank while
 * receiving one from the previous and adding this rank's contribution, so each
 * rank moves (N-1)/N of the buffer (an all-reduce would move twice that) and
 * holds two slices of scratch. Each slice is reduced in ring order, N-1
 * pairwise steps, as comm.h allows.
 *
 * Timeouts: every context gets the world's collective timeout, so a blocked
 * call throws at the deadline; the watchdog (comm_watch.c) fires at the same
 * deadline, writes the report the failing call returns, and closes the
 * connections of every context of the world, so that peers blocked on this
 * rank fail at once instead of at their own deadline. Exceptions never cross
 * into C: every entry point catches them and returns FSDP_ERR_COMM. */
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

extern "C" {
#include "core/internal.h"
}
#include "comm/comm_internal.h"
#include "world/world_internal.h"

namespace {

using Millis = std::chrono::milliseconds;
using Device = std::shared_ptr<gloo::transport::Device>;

Millis millis(double s) { return Millis(static_cast<long long>(s * 1000.0)); }

/* Gloo's rendezvous interface over the world's store. */
class Store : public gloo::rendezvous::Store {
 public:
  Store(fsdp_store_t *store, double timeout_s) : store_(store), timeout_s_(timeout_s) {}

  void set(const std::string &key, const std::vector<char> &data) override {
    check(fsdp_store_set(store_, key.c_str(), data.data(), data.size()));
  }
  std::vector<char> get(const std::string &key) override {
    char *v = nullptr;
    size_t n = 0;
    check(fsdp_store_get(store_, key.c_str(), timeout_s_, &v, &n));
    std::vector<char> out(v, v + n);
    fsdp_free(v);
    return out;
  }
  void wait(const std::vector<std::string> &keys) override { wait(keys, millis(timeout_s_)); }
  void wait(const std::vector<std::string> &keys, const Millis &timeout) override {
    std::vector<const char *> k;
    for (const auto &key : keys) k.push_back(key.c_str());
    check(fsdp_store_wait(store_, k.data(), static_cast<int>(k.size()),
                          static_cast<double>(timeout.count()) / 1000.0, nullptr));
  }

 private:
  static void check(fsdp_status_t st) {
    if (st != FSDP_SUCCESS) throw std::runtime_error(fsdp_last_error());
  }
  fsdp_store_t *store_;
  double timeout_s_;
};

using Context = gloo::rendezvous::Context;

struct Impl {
  std::shared_ptr<Context> ctx;
  std::vector<unsigned char> acc, in; /* reduce_scatter's slices: sent, received */
};

Impl *impl_of(fsdp_comm_t c) { return static_cast<Impl *>(c->impl); }

/* ---- set-up --------------------------------------------------------------- */

void free_device(void *p) { delete static_cast<Device *>(p); }

/* Gloo's TCP transport sends with writev, which has no MSG_NOSIGNAL: a write
 * to a peer that has just died raises SIGPIPE, whose default kills this rank
 * silently (no report, and fsdp-run could take it for the root cause) where
 * the collective should fail and say a peer went away. So the first gloo
 * device of the process sets SIGPIPE to ignored — unless the program chose a
 * disposition of its own, which is kept (comm.h). */
void ignore_sigpipe() {
  struct sigaction now, ign = {};
  if (sigaction(SIGPIPE, nullptr, &now) != 0 || (now.sa_flags & SA_SIGINFO) ||
      now.sa_handler != SIG_DFL)
    return;
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, nullptr);
}

/* The world's TCP device: on GLOO_SOCKET_IFNAME when set, else on the
 * address that routes to MASTER_ADDR. */
Device device_of(fsdp_comm_t c) {
  if (auto *dev = static_cast<Device *>(fsdp_watch_shared(c))) return *dev;
  ignore_sigpipe();
  gloo::transport::tcp::attr attr;
  const char *iface = std::getenv("GLOO_SOCKET_IFNAME");
  if (iface && *iface)
    attr.iface = iface;
  else
    attr.hostname = fsdp_world_host_address(c->world);
  Device dev = gloo::transport::tcp::CreateDevice(attr);
  fsdp_watch_set_shared(c, new Device(dev), free_device);
  return dev;
}

fsdp_status_t connect_mesh(fsdp_comm_t c) {
  try {
    Device dev = device_of(c);
    auto ctx = std::make_shared<Context>(c->rank, c->size);
    ctx->setTimeout(millis(fsdp_watch_timeout(c)));
    /* Creation is collective: a peer that never arrives fails it at the
     * collective deadline, like any other collective. */
    Store store(fsdp_world_store(c->world), fsdp_watch_timeout(c));
    /* A group of a split meshes under its colour: the groups share the id. */
    std::string prefix = "comm/" + std::to_string(c->id);
    if (c->color >= 0) prefix += "/" + std::to_string(c->color);
    gloo::rendezvous::PrefixStore prefixed(prefix, store);
    ctx->connectFullMesh(prefixed, dev);
    /* connectFullMesh returns on a rank once its own pairs are up, while a
     * peer may still be finishing its side: a communicator destroyed at once
     * then closes sockets under that peer's handshake ("Connection closed by
     * peer"). One barrier makes create return only when every rank is done. */
    gloo::BarrierOptions ready(ctx);
    gloo::barrier(ready);
    c->impl = new Impl{ctx, {}, {}};
    return FSDP_SUCCESS;
  } catch (const std::exception &e) {
    return fsdp_error(FSDP_ERR_COMM, "gloo: cannot connect communicator %d on rank %d of %d: "
                      "%s", c->id, c->rank, c->size, e.what());
  }
}

/* ---- collectives ---------------------------------------------------------- */

using Ctx = std::shared_ptr<Context>;

/* out = a (op) b, elementwise; bf16 as uint16_t bit patterns combined in
 * fp32 and rounded once per pairwise step (fsdp_bf16_combine). */
using Fn = std::function<void(void *, const void *, const void *, size_t)>;

Fn reduce_fn(fsdp_dtype_t dt, fsdp_reduce_op_t op) {
  using Raw = void (*)(void *, const void *, const void *, size_t);
  bool max = op == FSDP_MAX;
  if (dt == FSDP_F64) return max ? Raw(&gloo::max<double>) : Raw(&gloo::sum<double>);
  if (dt == FSDP_F32) return max ? Raw(&gloo::max<float>) : Raw(&gloo::sum<float>);
  return [op](void *c, const void *a, const void *b, size_t n) {
    fsdp_bf16_combine(static_cast<uint16_t *>(c), static_cast<const uint16_t *>(a),
                      static_cast<const uint16_t *>(b), n, op);
  };
}

template <typename T>
void allreduce(const Ctx &ctx, const void *send, void *recv, size_t n, const Fn &fn) {
  gloo::AllreduceOptions o(ctx);
  if (send != recv) o.setInput(static_cast<T *>(const_cast<void *>(send)), n);
  o.setOutput(static_cast<T *>(recv), n);
  o.setReduceFunction(fn);
  gloo::allreduce(o);
}

void allreduce_any(const Ctx &ctx, const void *send, void *recv, size_t n, fsdp_dtype_t dt,
                   fsdp_reduce_op_t op) {
  Fn fn = reduce_fn(dt, op);
  if (dt == FSDP_F64)
    allreduce<double>(ctx, send, recv, n, fn);
  else if (dt == FSDP_BF16)
    allreduce<uint16_t>(ctx, send, recv, n, fn);
  else
    allreduce<float>(ctx, send, recv, n, fn);
}

/* Gloo's waits throw on a timeout or a closed connection; false is an abort. */
void wait_both(gloo::transport::UnboundBuffer &in, gloo::transport::UnboundBuffer &out) {
  if (!in.waitRecv() || !out.waitSend())
    throw std::runtime_error("reduce_scatter: wait aborted");
}

/* The ring of the top: at step s rank r sends the partial sum of slice
 * (r-s-1) mod N to rank r+1 and receives that of slice (r-s-2) mod N from
 * r-1, which it combines with its own contribution; after N-1 steps that is
 * slice r, complete, written straight into recv. In place, recv is the
 * rank's own slice of send, read and written elementwise at the last step. */
void reduce_scatter(fsdp_comm_t c, const fsdp_coll_t *k) {
  Impl *im = impl_of(c);
  const Ctx &ctx = im->ctx;
  const int n = c->size, r = c->rank;
  const size_t slice = k->count * fsdp_dtype_size(k->dtype);
  const unsigned char *own = static_cast<const unsigned char *>(k->send);
  auto at = [&](int i) { return own + static_cast<size_t>(((i % n) + n) % n) * slice; };
  if (n == 1 || slice == 0) {
    if (!k->in_place && slice) std::memcpy(k->recv, own, slice);
    return;
  }
  if (im->acc.size() < slice) im->acc.resize(slice), im->in.resize(slice);
  Fn fn = reduce_fn(k->dtype, k->op);
  auto own_buf = ctx->createUnboundBuffer(const_cast<unsigned char *>(own), slice * n);
  auto acc_buf = ctx->createUnboundBuffer(im->acc.data(), slice);
  auto in_buf = ctx->createUnboundBuffer(im->in.data(), slice);
  const uint64_t slot = ctx->nextSlot(n - 1);
  for (int s = 0; s < n - 1; s++) {
    in_buf->recv((r + n - 1) % n, slot + s, 0, slice);
    if (s == 0)
      own_buf->send((r + 1) % n, slot, static_cast<size_t>(at(r - 1) - own), slice);
    else
      acc_buf->send((r + 1) % n, slot + s, 0, slice);
    wait_both(*in_buf, s == 0 ? *own_buf : *acc_buf);
    void *dst = s == n - 2 ? k->recv : im->acc.data();
    fn(dst, im->in.data(), at(r - s - 2), k->count);
  }
}

void all_gather(const Ctx &ctx, const fsdp_coll_t *k) {
  size_t bytes = k->count * fsdp_dtype_size(k->dtype);
  gloo::AllgatherOptions o(ctx);
  if (!k->in_place) o.setInput(static_cast<unsigned char *>(const_cast<void *>(k->send)), bytes);
  o.setOutput(static_cast<unsigned char *>(k->recv), bytes * static_cast<size_t>(ctx->size));
  gloo::allgather(o);
}

void broadcast(const Ctx &ctx, const fsdp_coll_t *k) {
  gloo::BroadcastOptions o(ctx);
  o.setOutput(static_cast<unsigned char *>(k->recv), k->count * fsdp_dtype_size(k->dtype));
  o.setRoot(k->root);
  gloo::broadcast(o);
}

/* One point-to-point pair: this rank's send to rank + offset while the one of
 * rank - offset arrives (a single slot, so both directions match up). */
void shift(const Ctx &ctx, const fsdp_coll_t *k) {
  const int n = ctx->size, r = ctx->rank;
  const size_t bytes = k->count * fsdp_dtype_size(k->dtype);
  if (k->root == 0) {
    std::memcpy(k->recv, k->send, bytes);
    return;
  }
  auto out = ctx->createUnboundBuffer(const_cast<void *>(k->send), bytes);
  auto in = ctx->createUnboundBuffer(k->recv, bytes);
  const uint64_t slot = ctx->nextSlot();
  in->recv((r - k->root + n) % n, slot);
  out->send((r + k->root) % n, slot);
  if (!in->waitRecv() || !out->waitSend()) throw std::runtime_error("shift: wait aborted");
}

void run_coll(fsdp_comm_t c, const fsdp_coll_t *k) {
  const Ctx &ctx = impl_of(c)->ctx;
  switch (k->kind) {
  case FSDP_COLL_ALL_GATHER:
    return all_gather(ctx, k);
  case FSDP_COLL_REDUCE_SCATTER:
    return reduce_scatter(c, k);
  case FSDP_COLL_ALL_REDUCE:
    return allreduce_any(ctx, k->in_place ? k->recv : k->send, k->recv, k->count, k->dtype,
                         k->op);
  case FSDP_COLL_BROADCAST:
    return broadcast(ctx, k);
  case FSDP_COLL_BARRIER: {
    gloo::BarrierOptions o(ctx);
    return gloo::barrier(o);
  }
  case FSDP_COLL_SHIFT:
    return shift(ctx, k);
  }
  throw std::logic_error("unknown collective kind " + std::to_string(k->kind));
}

} // namespace

/* ---- the ops table -------------------------------------------------------- */

extern "C" {

static fsdp_status_t gloo_create(fsdp_world_t world, fsdp_comm_t c) {
  c->rank = fsdp_world_rank(world);
  c->size = fsdp_world_size(world);
  return connect_mesh(c);
}

static fsdp_status_t gloo_dup(fsdp_comm_t comm, fsdp_comm_t out) {
  out->rank = comm->rank;
  out->size = comm->size;
  return connect_mesh(out);
}

/* A new Gloo context over the group's ranks (comm.c set rank, size, colour):
 * meshed through the world's store under "comm/<id>/<colour>/". */
static fsdp_status_t gloo_split(fsdp_comm_t parent, fsdp_comm_t out, int key) {
  (void)parent;
  (void)key;
  return connect_mesh(out);
}

static void gloo_destroy(fsdp_comm_t c) {
  delete impl_of(c);
  c->impl = nullptr;
}

static fsdp_status_t gloo_run(fsdp_comm_t c, const fsdp_coll_t *k) {
  try {
    run_coll(c, k);
  } catch (const std::exception &e) {
    char what[256];
    fsdp_coll_describe(k, what, sizeof what);
    return fsdp_error(FSDP_ERR_COMM, "%s on communicator %d failed on rank %d of %d: gloo: %s "
                      "(a peer failed, timed out or was killed: see its message)", what, c->id,
                      c->rank, c->size, e.what());
  }
  if (k->op == FSDP_AVG &&
      (k->kind == FSDP_COLL_ALL_REDUCE || k->kind == FSDP_COLL_REDUCE_SCATTER))
    fsdp_comm_scale(k->recv, k->count, k->dtype, 1.0 / c->size);
  return FSDP_SUCCESS;
}

static void gloo_abort(fsdp_comm_t c) {
  try {
    impl_of(c)->ctx->closeConnections();
  } catch (const std::exception &e) {
    fsdp_log(FSDP_LOG_WARN, "gloo: aborting communicator %d: %s", c->id, e.what());
  }
}

/* The mpi backend's per-call limit (MPI counts are int), so that a program
 * accepted under mpirun is accepted under fsdp-run and the other way round. */
const fsdp_comm_ops_t fsdp_comm_gloo_ops = {
    .name = "gloo",
    .max_count = 0x7fffffff,
    .create = gloo_create,
    .dup = gloo_dup,
    .destroy = gloo_destroy,
    .run = gloo_run,
    .abort = gloo_abort,
    .enqueue = nullptr, /* C++: every member named (-Wmissing-field-initializers) */
    .split = gloo_split,
    .poll = nullptr,
    .cancel = nullptr,
};
}
