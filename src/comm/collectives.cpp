// The public collectives of deepspeed::comm: each is numbered, recorded, issued on the Gloo
// process group, and wrapped in a Handle whose wait() turns a failure into the cross-rank report.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/collective_fingerprint.h"
#include "comm/communicator.h"
#include "comm/comms_logger.h"
#include "deepspeed/comm.h"
#include "util/check.h"

#include <ATen/ATen.h>
#include <functional>

namespace deepspeed::comm {

struct Handle::State {
  c10::intrusive_ptr<c10d::Work> work;
  detail::CollectiveRecord record;
  std::function<void()> on_complete;  // e.g. copy a slice out after an emulated reduce_scatter
  bool done = false;
};

namespace {

using detail::Communicator;

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // Gloo has no AVG: sum, then divide in on_complete
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

void check_flat(const at::Tensor& t, const char* name, const char* what) {
  DS_CHECK(t.defined() && t.is_contiguous(), CommError, name, ": ", what,
           " must be a defined, contiguous tensor");
}

// c10::Error's what() carries a C++ backtrace; the report wants the message alone.
std::string error_text(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

Handle finish(std::shared_ptr<Handle::State> state, bool async_op) {
  Handle h(std::move(state));
  if (!async_op) h.wait();
  return h;
}

// Runs `issue` (which returns the c10d work) and records it; a synchronous throw from c10d
// (bad sizes, closed connection) also gets the report.
// `root` (-1: none) and `op` (-1: none) go into the cross-rank comparison (collective_fingerprint.h).
template <typename Issue>
std::shared_ptr<Handle::State> start(const char* name, const at::Tensor& t, Issue issue,
                                     int64_t root = -1, int64_t op = -1) {
  auto& c = Communicator::instance();
  auto state = std::make_shared<Handle::State>();
  state->record = c.begin(name, t);
  detail::comms_log_issue(state->record.seq, name, t, c.world_size());
  if (c.world_size() == 1) {
    state->done = false;  // on_complete still runs in wait()
    return state;
  }
  if (detail::collective_check_enabled()) {
    detail::check_same_collective(c, state->record, t, root, op);
  }
  try {
    state->work = issue();
  } catch (const std::exception& e) {
    throw CommError(c.failure_report(state->record, error_text(e)));
  }
  return state;
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kInit: return "init";
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kStep: return "step";
    case Phase::kCheckpoint: return "checkpoint";
    case Phase::kOther: return "other";
  }
  return "other";
}

void Handle::wait() {
  DS_CHECK(state_ != nullptr, UsageError, "wait() on an empty comm::Handle");
  if (state_->done) return;
  if (state_->work) {
    auto& c = Communicator::instance();
    try {
      state_->work->wait(c.timeout());
    } catch (const std::exception& e) {
      state_->done = true;
      throw CommError(c.failure_report(state_->record, error_text(e)));
    }
  }
  if (state_->on_complete) state_->on_complete();
  detail::comms_log_complete(state_->record.seq);
  state_->done = true;
}

int64_t Handle::seq() const { return state_ ? state_->record.seq : 0; }

void init_distributed(const InitOptions& options) { Communicator::instance().init(options); }
bool is_initialized() { return Communicator::instance().initialized(); }
void destroy_process_group(bool sync) { Communicator::instance().destroy(sync); }
int get_rank() { return Communicator::instance().rank(); }
int get_world_size() { return Communicator::instance().world_size(); }
int get_local_rank() { return Communicator::instance().local_rank(); }
int get_local_world_size() { return Communicator::instance().local_world_size(); }
int64_t sequence_number() { return Communicator::instance().seq(); }

Phase set_phase(Phase phase) {
  auto& c = Communicator::instance();
  Phase old = c.phase;
  c.phase = phase;
  return old;
}
Phase current_phase() { return Communicator::instance().phase; }

namespace {

c10::intrusive_ptr<c10d::Work> issue_allreduce(Communicator& c, at::Tensor tensor, ReduceOp op) {
  std::vector<at::Tensor> ts{std::move(tensor)};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = c.timeout();
  return c.backend_for(ts[0]).allreduce(ts, o);
}

// Gloo in LibTorch 1.13 has no bfloat16 (nor int16): moves (broadcast, gather) send the bits
// as fp16 (copied, never computed on);
// reductions run on an fp32 copy that is written back on completion.
bool gloo_lacks_dtype(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kBFloat16;
}

at::Tensor as_gloo_bits(const at::Tensor& t) {
  return gloo_lacks_dtype(t) ? t.view(at::kHalf) : t;
}

}  // namespace

Handle all_reduce(at::Tensor& tensor, ReduceOp op, bool async_op) {
  check_flat(tensor, "all_reduce", "tensor");
  auto& c = Communicator::instance();
  at::Tensor target = tensor;
  at::Tensor wire = gloo_lacks_dtype(tensor) ? tensor.to(at::kFloat) : tensor;
  auto state = start("all_reduce", tensor, [&] { return issue_allreduce(c, wire, op); }, -1,
                     static_cast<int64_t>(op));
  const int w = c.world_size();
  const bool avg = op == ReduceOp::kAvg && w > 1;
  if (avg || !wire.is_same(target)) {
    state->on_complete = [target, wire, w, avg]() mutable {
      if (avg) wire.div_(w);
      if (!wire.is_same(target)) target.copy_(wire);
    };
  }
  return finish(std::move(state), async_op);
}

Handle all_gather(at::Tensor& output, const at::Tensor& input, bool async_op) {
  check_flat(output, "all_gather", "output");
  check_flat(input, "all_gather", "input");
  auto& c = Communicator::instance();
  const int64_t n = input.numel();
  DS_CHECK(output.numel() == n * c.world_size(), CommError, detail::detail_str(c.rank(), c.world_size()),
           "all_gather: output has ", output.numel(), " elements; expected world_size (",
           c.world_size(), ") * input (", n, ")");
  if (c.world_size() == 1) {
    output.copy_(input.view(output.sizes()));
  }
  auto state = start("all_gather", input, [&] {
    std::vector<std::vector<at::Tensor>> outs(1);
    at::Tensor flat = output.view({-1});
    for (int r = 0; r < c.world_size(); ++r) {
      outs[0].push_back(as_gloo_bits(flat.narrow(0, r * n, n)));
    }
    std::vector<at::Tensor> ins{as_gloo_bits(input.view({-1}))};
    return c.backend_for(ins[0]).allgather(outs, ins);
  });
  return finish(std::move(state), async_op);
}

Handle all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input, bool async_op) {
  check_flat(input, "all_gather", "input");
  auto& c = Communicator::instance();
  DS_CHECK(static_cast<int>(outputs.size()) == c.world_size(), CommError,
           detail::detail_str(c.rank(), c.world_size()), "all_gather: ", outputs.size(),
           " outputs for world_size ", c.world_size());
  for (auto& o : outputs) {
    check_flat(o, "all_gather", "output");
    DS_CHECK(o.numel() == input.numel(), CommError, detail::detail_str(c.rank(), c.world_size()),
             "all_gather: an output has ", o.numel(), " elements; the input has ", input.numel());
  }
  if (c.world_size() == 1 && !outputs[0].is_same(input)) outputs[0].copy_(input);
  auto state = start("all_gather", input, [&] {
    // Gloo gathers into its own flat buffer, then copies out: `input` may alias an output.
    std::vector<std::vector<at::Tensor>> outs(1);
    for (const auto& o : outputs) outs[0].push_back(as_gloo_bits(o));
    std::vector<at::Tensor> ins{as_gloo_bits(input.view({-1}))};
    return c.backend_for(ins[0]).allgather(outs, ins);
  });
  return finish(std::move(state), async_op);
}

Handle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op, bool async_op) {
  check_flat(output, "reduce_scatter", "output");
  check_flat(input, "reduce_scatter", "input");
  auto& c = Communicator::instance();
  const int64_t n = output.numel();
  DS_CHECK(input.numel() == n * c.world_size(), CommError,
           detail::detail_str(c.rank(), c.world_size()), "reduce_scatter: input has ",
           input.numel(), " elements; expected world_size (", c.world_size(), ") * output (", n,
           ")");
  // Gloo in LibTorch 1.13 has no reduce_scatter: all-reduce a copy and keep this rank's slice.
  // Same result at twice the traffic. TODO(comm): NCCL's native reduce-scatter for CUDA tensors.
  // bf16 (which 1.13's Gloo lacks) reduces in an fp32 copy, as all_reduce does.
  at::Tensor work_buf = gloo_lacks_dtype(input) ? input.to(at::kFloat)
                        : c.world_size() == 1   ? input
                                                : input.clone();
  auto state = start("reduce_scatter", input, [&] { return issue_allreduce(c, work_buf, op); },
                     -1, static_cast<int64_t>(op));
  at::Tensor out = output;
  int w = c.world_size();
  int64_t offset = static_cast<int64_t>(c.rank()) * n;
  state->on_complete = [out, work_buf, n, offset, w, op]() mutable {
    out.view({-1}).copy_(work_buf.view({-1}).narrow(0, offset, n));
    if (op == ReduceOp::kAvg && w > 1) out.div_(w);
  };
  return finish(std::move(state), async_op);
}

Handle reduce(at::Tensor& tensor, int dst, ReduceOp op, bool async_op) {
  check_flat(tensor, "reduce", "tensor");
  auto& c = Communicator::instance();
  DS_CHECK(dst >= 0 && dst < c.world_size(), CommError, "reduce: dst rank ", dst,
           " is outside [0, ", c.world_size(), ")");
  at::Tensor target = tensor;
  at::Tensor wire = gloo_lacks_dtype(tensor) ? tensor.to(at::kFloat) : tensor;
  auto state = start("reduce", tensor, [&] {
    std::vector<at::Tensor> ts{wire};
    c10d::ReduceOptions o;
    o.reduceOp = to_c10d(op);
    o.rootRank = dst;
    o.timeout = c.timeout();
    return c.backend_for(ts[0]).reduce(ts, o);
  }, dst, static_cast<int64_t>(op));
  const int w = c.world_size();
  const bool avg = op == ReduceOp::kAvg && w > 1 && c.rank() == dst;
  if (avg || !wire.is_same(target)) {
    state->on_complete = [target, wire, w, avg]() mutable {
      if (avg) wire.div_(w);
      if (!wire.is_same(target)) target.copy_(wire);
    };
  }
  return finish(std::move(state), async_op);
}

Handle broadcast(at::Tensor& tensor, int src, bool async_op) {
  check_flat(tensor, "broadcast", "tensor");
  auto& c = Communicator::instance();
  DS_CHECK(src >= 0 && src < c.world_size(), CommError, "broadcast: src rank ", src,
           " is outside [0, ", c.world_size(), ")");
  auto state = start("broadcast", tensor, [&] {
    std::vector<at::Tensor> ts{as_gloo_bits(tensor)};
    c10d::BroadcastOptions o;
    o.rootRank = src;
    o.timeout = c.timeout();
    return c.backend_for(ts[0]).broadcast(ts, o);
  }, src);
  return finish(std::move(state), async_op);
}

void barrier() { Communicator::instance().barrier(); }

namespace detail {

void Communicator::barrier() {
  // An all-reduce of one element rather than c10d's barrier: it is numbered and reported like
  // every other collective.
  at::Tensor t = at::zeros({1});
  auto state = start("barrier", t, [&] { return issue_allreduce(*this, t, ReduceOp::kSum); });
  finish(std::move(state), false);
}

}  // namespace detail
}  // namespace deepspeed::comm
