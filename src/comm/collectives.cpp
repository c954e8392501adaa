// The public collectives of deepspeed::comm: each is numbered, recorded, issued on its group's
// process group, and wrapped in a Handle whose wait() turns a failure into the cross-rank report.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/collective_fingerprint.h"
#include "comm/communicator.h"
#include "comm/comms_logger.h"
#include "comm/handle_state.h"
#include "comm/sent_bytes.h"
#include "deepspeed/comm.h"
#include "util/check.h"

#include <ATen/ATen.h>
#include <functional>

namespace deepspeed::comm {


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

// Checks, before any size arithmetic, that `group` can run `name` on this rank.
Communicator& usable(const char* name, const Group& group) {
  auto& c = Communicator::instance();
  DS_CHECK(c.initialized(), CommError, name,
           ": deepspeed::comm is not initialized; call init_distributed() first");
  c.check_usable(group, name);
  return c;
}

// "[rank R/W] all_gather on group data(2) [0, 2]: " (the group only when not the world).
std::string where(const Communicator& c, const char* name, const Group& group) {
  std::string out = detail::detail_str(c.rank(), c.world_size()) + name;
  if (group.impl()->id != 0) out += " on group " + group.describe();
  return out + ": ";
}

// Runs `issue` (which returns the c10d work) and records it; a synchronous throw from c10d
// (bad sizes, closed connection) also gets the report.
// `root` (-1: none) and `op` (-1: none) go into the cross-rank comparison (collective_fingerprint.h).
template <typename Issue>
std::shared_ptr<Handle::State> start(const char* name, const at::Tensor& t, const Group& group,
                                     Issue issue, int64_t root = -1, int64_t op = -1) {
  auto& c = Communicator::instance();
  auto state = std::make_shared<Handle::State>();
  state->record = c.begin(name, t, group);
  state->group = group;
  detail::comms_log_issue(state->record.rank_seq, name, t, group.size(),
                          group.impl()->id == 0 ? std::string() : group.name());
  if (group.size() == 1) {
    state->done = false;  // on_complete still runs in wait()
    return state;
  }
  if (detail::collective_check_enabled()) {
    detail::check_same_collective(c, state->record, group, t, root, op);
  }
  detail::count_sent_bytes(name, static_cast<int64_t>(t.numel() * t.element_size()),
                           group.size(), root == c.rank());
  try {
    state->work = issue();
  } catch (const std::exception& e) {
    throw CommError(c.failure_report(state->record, group, error_text(e)));
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
      throw CommError(state_->p2p_report
                          ? state_->p2p_report(error_text(e))
                          : c.failure_report(state_->record, state_->group, error_text(e)));
    }
  }
  if (state_->on_complete) state_->on_complete();
  detail::comms_log_complete(state_->record.rank_seq);
  state_->done = true;
}

int64_t Handle::seq() const { return state_ ? state_->record.rank_seq : 0; }

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

c10::intrusive_ptr<c10d::Work> issue_allreduce(Communicator& c, at::Tensor tensor, ReduceOp op,
                                               const Group& group) {
  std::vector<at::Tensor> ts{std::move(tensor)};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = c.timeout();
  return c.backend_for(group, ts[0]).allreduce(ts, o);
}

// The group rank of global rank `root` (broadcast's src, reduce's dst), which must be a member.
int root_in_group(const Communicator& c, const char* name, const char* role, int root,
                  const Group& group) {
  DS_CHECK(root >= 0 && root < c.world_size(), CommError, where(c, name, group), role, " rank ",
           root, " is outside [0, ", c.world_size(), ")");
  const int g = group.group_rank(root);
  DS_CHECK(g >= 0, UsageError, where(c, name, group), role, " rank ", root,
           " is not a member of the group (", role, " is a global rank, as in torch.distributed)");
  return g;
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

Handle all_reduce(at::Tensor& tensor, ReduceOp op, bool async_op, const Group& group) {
  auto& c = usable("all_reduce", group);
  check_flat(tensor, "all_reduce", "tensor");
  at::Tensor target = tensor;
  at::Tensor wire = gloo_lacks_dtype(tensor) ? tensor.to(at::kFloat) : tensor;
  auto state = start(
      "all_reduce", tensor, group, [&] { return issue_allreduce(c, wire, op, group); }, -1,
      static_cast<int64_t>(op));
  const int w = group.size();
  const bool avg = op == ReduceOp::kAvg && w > 1;
  if (avg || !wire.is_same(target)) {
    state->on_complete = [target, wire, w, avg]() mutable {
      if (avg) wire.div_(w);
      if (!wire.is_same(target)) target.copy_(wire);
    };
  }
  return finish(std::move(state), async_op);
}

Handle all_gather(at::Tensor& output, const at::Tensor& input, bool async_op,
                  const Group& group) {
  auto& c = usable("all_gather", group);
  check_flat(output, "all_gather", "output");
  check_flat(input, "all_gather", "input");
  const int64_t n = input.numel();
  const int w = group.size();
  DS_CHECK(output.numel() == n * w, CommError, where(c, "all_gather", group), "output has ",
           output.numel(), " elements; expected group size (", w, ") * input (", n, ")");
  if (w == 1) {
    output.copy_(input.view(output.sizes()));
  }
  if (input.is_cuda()) {
    // NCCL gathers straight into the flat output (ncclAllGather): no per-rank views, no copy.
    auto state = start("all_gather", input, group, [&] {
      at::Tensor out_flat = output.view({-1});
      at::Tensor in_flat = input.view({-1});
      c10d::AllgatherOptions o;
      o.timeout = c.timeout();
      return c.backend_for(group, in_flat)._allgather_base(out_flat, in_flat, o);
    });
    return finish(std::move(state), async_op);
  }
  auto state = start("all_gather", input, group, [&] {
    std::vector<std::vector<at::Tensor>> outs(1);
    at::Tensor flat = output.view({-1});
    for (int r = 0; r < w; ++r) {
      outs[0].push_back(as_gloo_bits(flat.narrow(0, r * n, n)));
    }
    std::vector<at::Tensor> ins{as_gloo_bits(input.view({-1}))};
    return c.backend_for(group, ins[0]).allgather(outs, ins);
  });
  return finish(std::move(state), async_op);
}

Handle all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input, bool async_op,
                  const Group& group) {
  auto& c = usable("all_gather", group);
  check_flat(input, "all_gather", "input");
  DS_CHECK(static_cast<int>(outputs.size()) == group.size(), CommError,
           where(c, "all_gather", group), outputs.size(), " outputs for group size ",
           group.size());
  for (auto& o : outputs) {
    check_flat(o, "all_gather", "output");
    DS_CHECK(o.numel() == input.numel(), CommError, where(c, "all_gather", group),
             "an output has ", o.numel(), " elements; the input has ", input.numel());
  }
  if (group.size() == 1 && !outputs[0].is_same(input)) outputs[0].copy_(input);
  auto state = start("all_gather", input, group, [&] {
    // Gloo gathers into its own flat buffer, then copies out: `input` may alias an output.
    std::vector<std::vector<at::Tensor>> outs(1);
    for (const auto& o : outputs) outs[0].push_back(as_gloo_bits(o));
    std::vector<at::Tensor> ins{as_gloo_bits(input.view({-1}))};
    return c.backend_for(group, ins[0]).allgather(outs, ins);
  });
  return finish(std::move(state), async_op);
}

Handle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op, bool async_op,
                      const Group& group) {
  auto& c = usable("reduce_scatter", group);
  check_flat(output, "reduce_scatter", "output");
  check_flat(input, "reduce_scatter", "input");
  const int64_t n = output.numel();
  const int w = group.size();
  DS_CHECK(input.numel() == n * w, CommError, where(c, "reduce_scatter", group), "input has ",
           input.numel(), " elements; expected group size (", w, ") * output (", n, ")");
  if (input.is_cuda()) {
    // NCCL reduce-scatters the flat input straight into the output (ncclReduceScatter), half
    // the traffic of the all-reduce below; AVG divides on completion like the other paths.
    at::Tensor out_flat = output.view({-1});
    // A group of one issues nothing (start() returns at once): the sum is the input itself.
    if (w == 1 && !out_flat.is_same(input)) out_flat.copy_(input.view({-1}));
    auto state = start(
        "reduce_scatter", input, group,
        [&] {
          at::Tensor in_flat = input.view({-1});
          c10d::ReduceScatterOptions o;
          o.reduceOp = to_c10d(op);
          o.timeout = c.timeout();
          return c.backend_for(group, in_flat)._reduce_scatter_base(out_flat, in_flat, o);
        },
        -1, static_cast<int64_t>(op));
    if (op == ReduceOp::kAvg && w > 1) {
      state->on_complete = [out_flat, w]() mutable { out_flat.div_(w); };
    }
    return finish(std::move(state), async_op);
  }
  // Gloo in LibTorch 1.13 has no reduce_scatter: all-reduce a copy and keep this rank's slice.
  // Same result at twice the traffic.
  // bf16 (which 1.13's Gloo lacks) reduces in an fp32 copy, as all_reduce does.
  at::Tensor work_buf = gloo_lacks_dtype(input) ? input.to(at::kFloat)
                        : w == 1                ? input
                                                : input.clone();
  auto state = start(
      "reduce_scatter", input, group, [&] { return issue_allreduce(c, work_buf, op, group); }, -1,
      static_cast<int64_t>(op));
  at::Tensor out = output;
  int64_t offset = static_cast<int64_t>(group.rank()) * n;
  state->on_complete = [out, work_buf, n, offset, w, op]() mutable {
    out.view({-1}).copy_(work_buf.view({-1}).narrow(0, offset, n));
    if (op == ReduceOp::kAvg && w > 1) out.div_(w);
  };
  return finish(std::move(state), async_op);
}

Handle reduce(at::Tensor& tensor, int dst, ReduceOp op, bool async_op, const Group& group) {
  auto& c = usable("reduce", group);
  check_flat(tensor, "reduce", "tensor");
  const int root = root_in_group(c, "reduce", "dst", dst, group);
  at::Tensor target = tensor;
  at::Tensor wire = gloo_lacks_dtype(tensor) ? tensor.to(at::kFloat) : tensor;
  auto state = start("reduce", tensor, group, [&] {
    std::vector<at::Tensor> ts{wire};
    c10d::ReduceOptions o;
    o.reduceOp = to_c10d(op);
    o.rootRank = root;
    o.timeout = c.timeout();
    return c.backend_for(group, ts[0]).reduce(ts, o);
  }, dst, static_cast<int64_t>(op));
  const int w = group.size();
  const bool avg = op == ReduceOp::kAvg && w > 1 && group.rank() == root;
  if (avg || !wire.is_same(target)) {
    state->on_complete = [target, wire, w, avg]() mutable {
      if (avg) wire.div_(w);
      if (!wire.is_same(target)) target.copy_(wire);
    };
  }
  return finish(std::move(state), async_op);
}

Handle broadcast(at::Tensor& tensor, int src, bool async_op, const Group& group) {
  auto& c = usable("broadcast", group);
  check_flat(tensor, "broadcast", "tensor");
  const int root = root_in_group(c, "broadcast", "src", src, group);
  auto state = start("broadcast", tensor, group, [&] {
    std::vector<at::Tensor> ts{as_gloo_bits(tensor)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = c.timeout();
    return c.backend_for(group, ts[0]).broadcast(ts, o);
  }, src);
  return finish(std::move(state), async_op);
}

Handle all_to_all_single(at::Tensor& output, const at::Tensor& input, bool async_op,
                         const Group& group) {
  auto& c = usable("all_to_all_single", group);
  check_flat(output, "all_to_all_single", "output");
  check_flat(input, "all_to_all_single", "input");
  const int w = group.size();
  DS_CHECK(output.numel() == input.numel() && output.scalar_type() == input.scalar_type(),
           CommError, where(c, "all_to_all_single", group), "output has ", output.numel(),
           " elements of ", output.scalar_type(), "; expected the input's ", input.numel(),
           " of ", input.scalar_type());
  DS_CHECK(input.numel() % w == 0, CommError, where(c, "all_to_all_single", group), "input has ",
           input.numel(), " elements, not divisible by the group size ", w,
           "; pad it to a multiple");
  if (w == 1) output.copy_(input.view(output.sizes()));
  auto state = start("all_to_all_single", input, group, [&] {
    at::Tensor out = as_gloo_bits(output.view({-1}));
    at::Tensor in = as_gloo_bits(input.view({-1}));
    std::vector<int64_t> equal_splits;  // empty: Gloo splits evenly
    c10d::AllToAllOptions o;
    o.timeout = c.timeout();
    return c.backend_for(group, in).alltoall_base(out, in, equal_splits, equal_splits, o);
  });
  return finish(std::move(state), async_op);
}

Handle all_to_all_single(at::Tensor& output, const at::Tensor& input,
                         const std::vector<int64_t>& output_splits,
                         const std::vector<int64_t>& input_splits, bool async_op,
                         const Group& group) {
  auto& c = usable("all_to_all_single", group);
  check_flat(output, "all_to_all_single", "output");
  check_flat(input, "all_to_all_single", "input");
  const auto w = static_cast<size_t>(group.size());
  DS_CHECK(output_splits.size() == w && input_splits.size() == w, CommError,
           where(c, "all_to_all_single", group), output_splits.size(), " output and ",
           input_splits.size(), " input split sizes for a group of ", w);
  DS_CHECK(input.dim() >= 1 && output.dim() == input.dim() &&
               output.sizes().slice(1) == input.sizes().slice(1) &&
               output.scalar_type() == input.scalar_type(),
           CommError, where(c, "all_to_all_single", group), "output ", output.sizes(), " of ",
           output.scalar_type(), " does not match input ", input.sizes(), " of ",
           input.scalar_type());
  int64_t in_rows = 0, out_rows = 0;
  for (size_t r = 0; r < w; ++r) {
    DS_CHECK(input_splits[r] >= 0 && output_splits[r] >= 0, CommError,
             where(c, "all_to_all_single", group), "negative split size");
    in_rows += input_splits[r];
    out_rows += output_splits[r];
  }
  DS_CHECK(in_rows == input.size(0) && out_rows == output.size(0), CommError,
           where(c, "all_to_all_single", group), "split sizes sum to ", in_rows, " input and ",
           out_rows, " output rows; the tensors have ", input.size(0), " and ",
           output.size(0));
  const int me = group.rank();
  if (w == 1) output.copy_(input);
  // The record carries no size: it differs by rank by design.
  auto state = start("all_to_all_v", at::empty({0}, input.options()), group, [&] {
    at::Tensor out = as_gloo_bits(output);
    at::Tensor in = as_gloo_bits(input);
    std::vector<int64_t> out_splits = output_splits, in_splits = input_splits;
    c10d::AllToAllOptions o;
    o.timeout = c.timeout();
    return c.backend_for(group, in).alltoall_base(out, in, out_splits, in_splits, o);
  });
  const int64_t row_bytes =
      in_rows == 0 ? 0 : input.numel() / in_rows * static_cast<int64_t>(input.element_size());
  detail::count_sent_bytes("all_to_all_v",
                           (in_rows - input_splits[static_cast<size_t>(me)]) * row_bytes,
                           static_cast<int>(w), false);
  return finish(std::move(state), async_op);
}

void barrier(const Group& group) {
  usable("barrier", group);
  Communicator::instance().barrier(group);
}

namespace detail {

void Communicator::barrier(const Group& group) {
  // An all-reduce of one element rather than c10d's barrier: it is numbered and reported like
  // every other collective.
  at::Tensor t = at::zeros({1});
  auto state =
      start("barrier", t, group, [&] { return issue_allreduce(*this, t, ReduceOp::kSum, group); });
  finish(std::move(state), false);
}

}  // namespace detail
}  // namespace deepspeed::comm
