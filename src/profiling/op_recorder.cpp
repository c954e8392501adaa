// RecordFunction callbacks. They run inside every ATen call on the recording thread, so they
// call nothing that dispatches (which would recurse into them): only IValue copies, sizes,
// and the stream synchronize below.
#include "profiling/op_recorder.h"

#include <algorithm>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "util/check.h"

namespace deepspeed::profiling::detail {
namespace {

using Clock = std::chrono::steady_clock;

// The recorder of this thread (RecordFunction callbacks are plain function pointers).
thread_local OpRecorder* tls_recorder = nullptr;

// Asynchronous devices: the call's time is only known once its kernels ran. DeepSpeed
// synchronizes in each module's post-forward hook for the same reason.
void synchronize_outputs(const std::vector<c10::IValue>& outputs) {
  for (const auto& iv : outputs) {
    if (!iv.isTensor()) continue;
    const at::Tensor& t = iv.toTensor();
    if (t.defined() && t.is_cuda()) {
      c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).synchronize();
      return;
    }
  }
}

}  // namespace

OpRecorder::~OpRecorder() {
  if (handle_ != 0 && tls_recorder == this) {
    at::removeCallback(handle_);
    tls_recorder = nullptr;
  }
}

void OpRecorder::start() {
  DS_CHECK(tls_recorder == nullptr, UsageError,
           "flops profiler: start_profile() while another profile records on this thread; "
           "stop_profile() it first");
  stack_.clear();
  scopes_.clear();
  tls_recorder = this;
  started_ = Clock::now();
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&OpRecorder::on_start, &OpRecorder::on_end)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION}));
}

void OpRecorder::stop() {
  if (handle_ == 0) return;
  weight_view_outputs_.clear();
  weight_view_owners_.clear();
  DS_CHECK(tls_recorder == this, UsageError,
           "flops profiler: stop_profile() must run on the thread that called start_profile() "
           "(the operator callbacks are thread-local)");
  at::removeCallback(handle_);
  handle_ = 0;
  tls_recorder = nullptr;
  wall_s_ += std::chrono::duration<double>(Clock::now() - started_).count();
  stack_.clear();
  scopes_.clear();
}

void OpRecorder::clear() {
  events_.clear();
  wall_s_ = 0.0;
  if (handle_ != 0) started_ = Clock::now();
}

bool OpRecorder::push_scope(const torch::nn::Module& module) {
  OpRecorder* r = tls_recorder;
  if (!r) return false;
  r->scopes_.push_back(r->tree_.index_of(&module));
  return true;
}

void OpRecorder::pop_scope() {
  OpRecorder* r = tls_recorder;
  if (r && !r->scopes_.empty()) r->scopes_.pop_back();
}

std::unique_ptr<at::ObserverContext> OpRecorder::on_start(const at::RecordFunction& fn) {
  OpRecorder* r = tls_recorder;
  if (!r) return nullptr;
  Frame f;
  f.costed = r->stack_.empty() || (r->stack_.back().costed && r->stack_.back().transparent);
  if (f.costed) {
    f.op = fn.name();
    f.transparent = is_transparent_op(f.op);
    auto inputs = fn.inputs();
    f.inputs.assign(inputs.begin(), inputs.end());
    auto add_owner = [&](int o) {
      if (std::find(f.owners.begin(), f.owners.end(), o) == f.owners.end()) f.owners.push_back(o);
    };
    for (const auto& iv : f.inputs) {
      if (!iv.isTensor()) continue;
      const c10::TensorImpl* impl = iv.toTensor().unsafeGetTensorImpl();
      if (const auto* owners = r->tree_.owners_of(impl)) {
        for (int o : *owners) add_owner(o);
        continue;
      }
      for (const auto& view : r->weight_view_outputs_) {
        if (view.isTensor() && view.toTensor().unsafeGetTensorImpl() == impl) {
          for (int o : r->weight_view_owners_) add_owner(o);
        }
      }
    }
    // An unknown module (not in the profiled model) counts as no scope.
    for (auto it = r->scopes_.rbegin(); it != r->scopes_.rend() && f.scope < 0; ++it) f.scope = *it;
  }
  f.start = Clock::now();  // last, so the bookkeeping above is not timed
  r->stack_.push_back(std::move(f));
  return nullptr;
}

void OpRecorder::on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  OpRecorder* r = tls_recorder;
  if (!r || r->stack_.empty()) return;
  Frame f = std::move(r->stack_.back());
  r->stack_.pop_back();
  if (!f.costed) return;
  const bool top_level = r->stack_.empty();
  const auto& outputs = fn.outputs();
  OpEvent e;
  if (top_level) {
    synchronize_outputs(outputs);
    e.duration_s = std::chrono::duration<double>(Clock::now() - f.start).count();
  }
  e.op = std::move(f.op);
  e.cost = op_cost(e.op, f.inputs, outputs);
  const bool costed_op = is_costed_op(e.op);
  if (top_level) {
    r->weight_view_outputs_.clear();
    r->weight_view_owners_.clear();
    if (!costed_op) {
      for (int o : f.owners) {
        if (r->tree_.nodes()[o].forward_uses_weight_view) r->weight_view_owners_.push_back(o);
      }
      if (!r->weight_view_owners_.empty()) r->weight_view_outputs_ = outputs;
    }
  }
  // Only operators from the cost table anchor attribution (Note [Op attribution]); a view of a
  // parameter may be taken anywhere (a tied output projection reads wte.weight.t()).
  if (costed_op) e.owners = std::move(f.owners);
  e.scope = f.scope;
  r->events_.push_back(std::move(e));
}

}  // namespace deepspeed::profiling::detail
