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
 * deadline, writes the report the failing call returns, and cancels every
 * context of the world, so that peers blocked on this rank fail at once
 * instead of at their own deadline. A collective that fails before its
 * deadline (a peer died) cancels them too (fsdp_watch_failed). Cancelling
 * takes Gloo's own path for a timed-out wait: every pair of the context gets
 * an exception, which fails each pending send and receive on it here and
 * closes its socket, so the peer's pending operations with this rank fail
 * as well. Exceptions never cross into C: every entry point catches them and
 * returns FSDP_ERR_COMM. */
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
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

using Buffer = gloo::transport::UnboundBuffer;

struct Impl {
  std::shared_ptr<Context> ctx;
  std::vector<unsigned char> acc, in; /* reduce_scatter's slices: sent, received */
  std::mutex mu;                      /* guards live and cancelled */
  std::vector<Buffer *> live;         /* the buffers of the collective running */
  bool cancelled = false;             /* gloo_cancel: no later result counts */
};

/* Fails every pending and later operation of ctx's pairs, here and at the
 * peers. Gloo offers no call for it, but an unbound buffer whose wait
 * expires does it (tcp::UnboundBuffer::waitRecv: "let all pairs in the
 * transport context know", each pair's signalExceptionExternal), and a wait
 * of 0 ms on a buffer nothing was posted to expires at once. */
void cancel_pairs(const std::shared_ptr<Context> &ctx) {
  char byte = 0;
  auto none = ctx->createUnboundBuffer(&byte, sizeof byte);
  try {
    none->waitRecv(Millis(0));
  } catch (const gloo::IoException &) { /* the expiry: every pair now has the exception */
  }
}

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
    c->impl = new Impl();
    impl_of(c)->ctx = ctx;
    return FSDP_SUCCESS;
  } catch (const std::exception &e) {
    return fsdp_error(FSDP_ERR_COMM, "gloo: cannot connect communicator %d on rank %d of %d: "
                      "%s", c->id, c->rank, c->size, e.what());
  }
}

/* ---- collectives ---------------------------------------------------------- */

/* Every collective's unbound buffers are made here and listed in the Impl
 * while it runs, for gloo_cancel to abort their waits: Gloo fails the
 * pending operations of a pair whose connection broke, but not a send (or
 * receive) already under way on it, whose wait would last until the
 * deadline. A Call is declared after the buffers' owners, so that it
 * unlists them before they go. */
class Call {
 public:
  explicit Call(Impl *im) : im_(im) {}
  ~Call() {
    std::lock_guard<std::mutex> g(im_->mu);
    im_->live.clear();
  }
  Call(const Call &) = delete;
  Call &operator=(const Call &) = delete;
  std::unique_ptr<Buffer> buffer(const void *ptr, size_t bytes) {
    auto b = im_->ctx->createUnboundBuffer(const_cast<void *>(ptr), bytes);
    std::lock_guard<std::mutex> g(im_->mu);
    im_->live.push_back(b.get());
    return b;
  }
  const std::shared_ptr<Context> &ctx() const { return im_->ctx; }

 private:
  Impl *im_;
};

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
void allreduce(Impl *im, const void *send, void *recv, size_t n, const Fn &fn) {
  gloo::AllreduceOptions o(im->ctx);
  Call call(im);
  if (send != recv) o.setInput<T>(call.buffer(send, n * sizeof(T)));
  o.setOutput<T>(call.buffer(recv, n * sizeof(T)));
  o.setReduceFunction(fn);
  gloo::allreduce(o);
}

void allreduce_any(Impl *im, const void *send, void *recv, size_t n, fsdp_dtype_t dt,
                   fsdp_reduce_op_t op) {
  Fn fn = reduce_fn(dt, op);
  if (dt == FSDP_F64)
    allreduce<double>(im, send, recv, n, fn);
  else if (dt == FSDP_BF16)
    allreduce<uint16_t>(im, send, recv, n, fn);
  else
    allreduce<float>(im, send, recv, n, fn);
}

/* Gloo's waits throw on a timeout or a closed connection; false is an abort. */
void wait_both(Buffer &in, Buffer &out) {
  if (!in.waitRecv() || !out.waitSend()) throw std::runtime_error("wait aborted");
}

/* The ring of the top: at step s rank r sends the partial sum of slice
 * (r-s-1) mod N to rank r+1 and receives that of slice (r-s-2) mod N from
 * r-1, which it combines with its own contribution; after N-1 steps that is
 * slice r, complete, written straight into recv. In place, recv is the
 * rank's own slice of send, read and written elementwise at the last step. */
void reduce_scatter(fsdp_comm_t c, const fsdp_coll_t *k) {
  Impl *im = impl_of(c);
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
  std::unique_ptr<Buffer> own_buf, acc_buf, in_buf;
  Call call(im);
  own_buf = call.buffer(own, slice * n);
  acc_buf = call.buffer(im->acc.data(), slice);
  in_buf = call.buffer(im->in.data(), slice);
  const uint64_t slot = im->ctx->nextSlot(n - 1);
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

void all_gather(Impl *im, const fsdp_coll_t *k) {
  size_t bytes = k->count * fsdp_dtype_size(k->dtype);
  gloo::AllgatherOptions o(im->ctx);
  Call call(im);
  if (!k->in_place) o.setInput<unsigned char>(call.buffer(k->send, bytes));
  o.setOutput<unsigned char>(call.buffer(k->recv, bytes * static_cast<size_t>(im->ctx->size)));
  gloo::allgather(o);
}

void broadcast(Impl *im, const fsdp_coll_t *k) {
  gloo::BroadcastOptions o(im->ctx);
  Call call(im);
  o.setOutput<unsigned char>(call.buffer(k->recv, k->count * fsdp_dtype_size(k->dtype)));
  o.setRoot(k->root);
  gloo::broadcast(o);
}

/* A barrier is an all_gather of one byte per rank: Gloo's own keeps its
 * buffer out of reach of gloo_cancel. */
void barrier(Impl *im) {
  std::vector<unsigned char> all(static_cast<size_t>(im->ctx->size));
  gloo::AllgatherOptions o(im->ctx);
  Call call(im);
  o.setOutput<unsigned char>(call.buffer(all.data(), all.size()));
  gloo::allgather(o);
}

/* One point-to-point pair: this rank's send to rank + offset while the one of
 * rank - offset arrives (a single slot, so both directions match up). */
void shift(Impl *im, const fsdp_coll_t *k) {
  const int n = im->ctx->size, r = im->ctx->rank;
  const size_t bytes = k->count * fsdp_dtype_size(k->dtype);
  if (k->root == 0) {
    std::memcpy(k->recv, k->send, bytes);
    return;
  }
  std::unique_ptr<Buffer> out, in;
  Call call(im);
  out = call.buffer(k->send, bytes);
  in = call.buffer(k->recv, bytes);
  const uint64_t slot = im->ctx->nextSlot();
  in->recv((r - k->root + n) % n, slot);
  out->send((r + k->root) % n, slot);
  wait_both(*in, *out);
}

void run_coll(fsdp_comm_t c, const fsdp_coll_t *k) {
  Impl *im = impl_of(c);
  switch (k->kind) {
  case FSDP_COLL_ALL_GATHER:
    return all_gather(im, k);
  case FSDP_COLL_REDUCE_SCATTER:
    return reduce_scatter(c, k);
  case FSDP_COLL_ALL_REDUCE:
    return allreduce_any(im, k->in_place ? k->recv : k->send, k->recv, k->count, k->dtype,
                         k->op);
  case FSDP_COLL_BROADCAST:
    return broadcast(im, k);
  case FSDP_COLL_BARRIER:
    return barrier(im);
  case FSDP_COLL_SHIFT:
    return shift(im, k);
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

/* A collective of a cancelled communicator fails, even one whose waits
 * were aborted before its outputs were complete and so returned. */
static fsdp_status_t gloo_run(fsdp_comm_t c, const fsdp_coll_t *k) {
  Impl *im = impl_of(c);
  std::string failure;
  try {
    run_coll(c, k);
  } catch (const std::exception &e) {
    failure = e.what();
  }
  bool cancelled;
  {
    std::lock_guard<std::mutex> g(im->mu);
    cancelled = im->cancelled;
  }
  if (cancelled || !failure.empty()) {
    char what[256], first[1024];
    fsdp_coll_describe(k, what, sizeof what);
    if (cancelled && fsdp_watch_cancelled(c, first, sizeof first))
      return fsdp_error(FSDP_ERR_COMM, "%s on communicator %d was cancelled on rank %d of %d: "
                        "%s", what, c->id, c->rank, c->size, first);
    return fsdp_error(FSDP_ERR_COMM, "%s on communicator %d %s on rank %d of %d: gloo: %s "
                      "(a peer failed, timed out or was killed: see its message)", what, c->id,
                      cancelled ? "was cancelled" : "failed", c->rank, c->size,
                      failure.empty() ? "its waits were aborted" : failure.c_str());
  }
  if (k->op == FSDP_AVG &&
      (k->kind == FSDP_COLL_ALL_REDUCE || k->kind == FSDP_COLL_REDUCE_SCATTER))
    fsdp_comm_scale(k->recv, k->count, k->dtype, 1.0 / c->size);
  return FSDP_SUCCESS;
}

/* The watchdog's abort and the cancel after a failure are one: every pair
 * of the context fails (cancel_pairs), and the waits of the collective
 * running are aborted. An abort ends one wait of each buffer, and Gloo's
 * collectives wait on a buffer several times: the watchdog calls this
 * again every tick while a collective of a cancelled communicator runs. */
static void gloo_cancel(fsdp_comm_t c) {
  Impl *im = impl_of(c);
  {
    std::lock_guard<std::mutex> g(im->mu); /* before any wait fails: it is the cancel's */
    im->cancelled = true;
  }
  try {
    cancel_pairs(im->ctx);
  } catch (const std::exception &e) {
    fsdp_log(FSDP_LOG_WARN, "gloo: cancelling communicator %d: %s", c->id, e.what());
  }
  std::lock_guard<std::mutex> g(im->mu);
  for (Buffer *b : im->live) {
    b->abortWaitSend();
    b->abortWaitRecv();
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
    .abort = gloo_cancel,
    .enqueue = nullptr, /* C++: every member named (-Wmissing-field-initializers) */
    .split = gloo_split,
    .poll = nullptr,
    .cancel = gloo_cancel,
};
}
