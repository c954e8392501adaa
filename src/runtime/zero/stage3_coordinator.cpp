// ParamCoordinator (see the header) and the unit-call entry points of deepspeed/zero3.h.
#include "runtime/zero/stage3_coordinator.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "util/check.h"

namespace deepspeed::runtime {
namespace {

struct UnitEntry {
  std::weak_ptr<ParamCoordinator> coordinator;
  size_t unit = 0;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<const torch::nn::Module*, UnitEntry>& registry() {
  static std::unordered_map<const torch::nn::Module*, UnitEntry> r;
  return r;
}

}  // namespace

void register_unit(const torch::nn::Module* module, std::weak_ptr<ParamCoordinator> coordinator,
                   size_t unit) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto [it, inserted] = registry().emplace(module, UnitEntry{coordinator, unit});
  DS_CHECK(inserted || it->second.coordinator.expired(), UsageError,
           "module '", module->name(), "' is already a ZeRO-3 unit of another live engine; "
           "a model can be trained by one ZeRO-3 engine at a time");
  it->second = UnitEntry{std::move(coordinator), unit};
}

void unregister_unit(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(module);
}

namespace {
std::vector<std::weak_ptr<ParamCoordinator>>& coordinators() {
  static std::vector<std::weak_ptr<ParamCoordinator>> c;
  return c;
}
}  // namespace

void register_coordinator(const std::shared_ptr<ParamCoordinator>& coordinator) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& all = coordinators();
  all.erase(std::remove_if(all.begin(), all.end(), [](const auto& w) { return w.expired(); }),
            all.end());
  all.push_back(coordinator);
}

std::vector<std::shared_ptr<ParamCoordinator>> live_coordinators() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::shared_ptr<ParamCoordinator>> out;
  for (const auto& w : coordinators()) {
    if (auto c = w.lock()) out.push_back(std::move(c));
  }
  return out;
}

ParamCoordinator::ParamCoordinator(std::vector<PartitionedParam>* params,
                                   std::vector<Stage3Unit> units, CoordinatorOptions options)
    : params_(params), units_(std::move(units)), options_(options),
      groups_{options_.group, options_.expert_group}, prefetched_(params->size(), false) {
  fetch_groups_ = groups_;
  for (auto& g : fetch_groups_) g.quantize_weights = options_.quantize_weights;
  for (const auto& p : *params_) {
    if (p.available && !p.persistent) stats_.live_numel += p.padded_numel();
  }
  stats_.peak_live_numel = stats_.live_numel;
}

void ParamCoordinator::swap_in_for_gather(const std::vector<size_t>& params) {
  if (store_ == nullptr) return;
  std::vector<size_t> wanted;
  for (size_t i : params) {
    if (!(*params_)[i].available && store_->swapped(i)) wanted.push_back(i);
  }
  if (!wanted.empty()) store_->swap_in(wanted);
}

void ParamCoordinator::settle(const std::vector<size_t>& params) {
  std::vector<size_t> swapped;
  for (size_t i : params) {
    finish_gather((*params_)[i]);
    if (store_ != nullptr && store_->swapped(i)) swapped.push_back(i);
  }
  if (swapped.empty()) return;
  wait_for_shard_copies();  // the swap buffers are reused: no copy may still read them
  store_->release(swapped);
}

void ParamCoordinator::gather_now(size_t i) {
  swap_in_for_gather({i});
  gather(i, /*async=*/false);
  settle({i});
}

void ParamCoordinator::gather(size_t i, bool async) { gather_all({i}, async); }

void ParamCoordinator::gather_all(const std::vector<size_t>& indices, bool async, bool fetch) {
  // In the given order (a prefetch lists the nearest unit first: backward runs the units in
  // reverse), each once: zero::GatheredParameters may be given a tensor twice.
  std::unordered_set<size_t> seen;
  std::vector<size_t> wanted;
  std::vector<PartitionedParam*> batch;
  for (size_t i : indices) {
    PartitionedParam& p = (*params_)[i];
    if (p.available || !seen.insert(i).second) continue;
    wanted.push_back(i);
    batch.push_back(&p);
    stats_.gathers += 1;
    if (!p.persistent) stats_.live_numel += p.padded_numel();
  }
  if (batch.empty()) return;
  stats_.peak_live_numel = std::max(stats_.peak_live_numel, stats_.live_numel);
  swap_in_for_gather(wanted);
  stats_.gather_collectives += start_partitioned_gathers(
      batch, fetch ? fetch_groups_ : groups_, async, options_.use_all_reduce_for_fetch);
}

void ParamCoordinator::free(size_t i) {
  PartitionedParam& p = (*params_)[i];
  if (!p.available || p.persistent) return;
  keep_secondary(p, groups_.at(p.partition));  // Note [Secondary partition]
  runtime::release(p);
  prefetched_[i] = false;
  stats_.releases += 1;
  stats_.live_numel -= p.padded_numel();
}

void ParamCoordinator::advance_trace(size_t unit, bool traced) {
  if (!traced) return;
  if (mode_ == Mode::kRecord) {
    trace_.push_back(unit);
  } else if (mode_ == Mode::kComplete) {
    if (cursor_ < trace_.size() && trace_[cursor_] == unit) {
      ++cursor_;
    } else {
      // Out of the recorded order: DeepSpeed invalidates and re-records the next iteration.
      mode_ = Mode::kInvalid;
      stats_.trace_invalidations += 1;
    }
  }
}

void ParamCoordinator::fetch(size_t unit, bool traced) {
  stats_.fetches += 1;
  advance_trace(unit, traced);
  const Stage3Unit& u = units_[unit];
  // All of this unit's gathers are issued before any is waited for, and before the prefetch
  // (with NVMe, its shards are read in one batch first).
  for (size_t i : u.params) {
    (*params_)[i].active_users += 1;
    prefetched_[i] = false;
  }
  gather_all(u.params, /*async=*/true, /*fetch=*/true);
  if (mode_ == Mode::kComplete && traced) prefetch();
  settle(u.params);
}

void ParamCoordinator::prefetch() {
  const int64_t room = options_.max_live_numel - stats_.live_numel;
  const int64_t budget = std::min(options_.prefetch_bucket_numel, room);
  int64_t issued = 0;
  std::vector<size_t> read_ahead;
  std::vector<size_t> ahead;  // gathered in one go (Note [Coalesced gathers])
  std::vector<bool> chosen(params_->size(), false);  // a parameter tied across units: once
  for (size_t pos = cursor_; pos < trace_.size() && issued < budget; ++pos) {
    for (size_t i : units_[trace_[pos]].params) {
      PartitionedParam& p = (*params_)[i];
      if (p.available || p.persistent || chosen[i]) continue;
      if (issued >= budget) break;
      chosen[i] = true;
      issued += p.padded_numel();
      // A swapped shard is read ahead; its all-gather waits for the fetch that needs it.
      if (store_ != nullptr && store_->swapped(i)) {
        read_ahead.push_back(i);
        continue;
      }
      ahead.push_back(i);
      prefetched_[i] = true;
      stats_.prefetched_gathers += 1;
    }
  }
  gather_all(ahead, /*async=*/true, /*fetch=*/true);
  if (!read_ahead.empty()) store_->prefetch(read_ahead);
}

bool ParamCoordinator::reused_soon(size_t param) const {
  if (mode_ != Mode::kComplete) return false;
  int64_t distance = 0;
  for (size_t pos = cursor_; pos < trace_.size(); ++pos) {
    const Stage3Unit& u = units_[trace_[pos]];
    if (std::binary_search(u.params.begin(), u.params.end(), param)) {
      return distance <= options_.max_reuse_distance_numel;
    }
    distance += u.numel;
    if (distance > options_.max_reuse_distance_numel) return false;
  }
  return false;
}

void ParamCoordinator::release(size_t unit, bool traced) {
  const Stage3Unit& u = units_[unit];
  for (size_t i : u.params) {
    PartitionedParam& p = (*params_)[i];
    p.active_users = std::max(0, p.active_users - 1);
  }
  for (size_t i : u.params) {
    const PartitionedParam& p = (*params_)[i];
    if (p.persistent || p.active_users > 0 || prefetched_[i] || (traced && reused_soon(i))) continue;
    free(i);
  }
}

void ParamCoordinator::end_iteration() {
  epoch_ += 1;  // See Note [Unit call lifetime]: calls of the ending iteration go stale.
  for (size_t i = 0; i < params_->size(); ++i) {
    (*params_)[i].active_users = 0;
    free(i);
  }
  std::fill(prefetched_.begin(), prefetched_.end(), false);
  if (mode_ == Mode::kRecord && !trace_.empty()) {
    mode_ = Mode::kComplete;
  } else if (mode_ == Mode::kInvalid || (mode_ == Mode::kComplete && cursor_ != trace_.size())) {
    if (mode_ == Mode::kComplete) stats_.trace_invalidations += 1;
    mode_ = Mode::kRecord;
    trace_.clear();
  }
  cursor_ = 0;
}

void ParamCoordinator::refresh_gathered() {
  // The shards changed: secondary partitions are stale (Note [Secondary partition]).
  for (auto& p : *params_) p.secondary = at::Tensor();
  std::vector<size_t> in_memory;  // refreshed together (Note [Coalesced gathers])
  for (size_t i = 0; i < params_->size(); ++i) {
    PartitionedParam& p = (*params_)[i];
    if (!p.available) continue;
    finish_gather(p);
    p.available = false;  // the storage stays allocated; start_gather refills it in place
    if (!p.persistent) stats_.live_numel -= p.padded_numel();  // gather_all counts it again
    // Swapped shards one at a time: the swap buffers hold only a few.
    if (store_ != nullptr && store_->swapped(i)) {
      gather_now(i);
    } else {
      in_memory.push_back(i);
    }
  }
  gather_all(in_memory, /*async=*/false);
  settle(in_memory);
}

std::vector<size_t> ParamCoordinator::gather_held(const std::vector<at::Tensor>& tensors) {
  std::vector<size_t> held;
  std::vector<size_t> in_memory;  // gathered together (Note [Coalesced gathers])
  for (const auto& t : tensors) {
    for (size_t i = 0; i < params_->size(); ++i) {
      if (!(*params_)[i].param.is_same(t)) continue;
      (*params_)[i].active_users += 1;
      // Swapped shards one at a time: the whole model may be asked for, and the swap buffers
      // hold only a few shards.
      if (store_ != nullptr && store_->swapped(i)) {
        gather_now(i);
      } else {
        in_memory.push_back(i);
      }
      held.push_back(i);
      break;
    }
  }
  gather_all(in_memory, /*async=*/true);
  settle(held);
  return held;
}

void ParamCoordinator::release_held(const std::vector<size_t>& indices) {
  for (size_t i : indices) {
    PartitionedParam& p = (*params_)[i];
    p.active_users = std::max(0, p.active_users - 1);
    if (p.active_users == 0) free(i);
  }
}

}  // namespace deepspeed::runtime

namespace deepspeed::zero::detail {
namespace {

std::shared_ptr<runtime::ParamCoordinator> live(const std::shared_ptr<UnitCall>& call) {
  if (!call) return nullptr;
  auto c = call->coordinator.lock();
  return c && c->epoch() == call->epoch ? c : nullptr;
}

void on_output_grad(const std::shared_ptr<UnitCall>& call) {
  auto c = live(call);
  if (!c || call->backward_fetched) return;
  call->backward_fetched = true;
  c->fetch(call->unit, /*traced=*/true);
  call->active = true;
}

void on_input_grad(const std::shared_ptr<UnitCall>& call) {
  auto c = live(call);
  if (!c) return;
  call->pending_inputs -= 1;
  if (call->pending_inputs == 0 && call->active && call->backward_fetched) {
    c->release(call->unit, /*traced=*/true);
    call->active = false;
  }
}

}  // namespace

std::shared_ptr<UnitCall> enter_unit(const torch::nn::Module& module) {
  runtime::UnitEntry entry;
  {
    std::lock_guard<std::mutex> lock(runtime::registry_mutex());
    auto it = runtime::registry().find(&module);
    if (it == runtime::registry().end()) return nullptr;
    entry = it->second;
  }
  auto c = entry.coordinator.lock();
  if (!c) return nullptr;
  const bool grad = at::GradMode::is_enabled();
  c->fetch(entry.unit, grad);
  auto call = std::make_shared<UnitCall>();
  call->coordinator = c;
  call->unit = entry.unit;
  call->epoch = c->epoch();
  call->grad_enabled = grad;
  call->active = true;
  return call;
}

at::Tensor track_input(const std::shared_ptr<UnitCall>& call, const at::Tensor& input) {
  if (!call || !call->grad_enabled || !input.defined() || !input.requires_grad()) return input;
  at::Tensor alias = input.view_as(input);
  call->pending_inputs += 1;
  alias.register_hook([call](const at::Tensor&) { on_input_grad(call); });
  return alias;
}

void exit_unit(const std::shared_ptr<UnitCall>& call, const std::vector<at::Tensor>& outputs) {
  auto c = live(call);
  if (!c) return;
  if (call->grad_enabled) {
    for (const auto& o : outputs) {
      if (!o.defined() || !o.requires_grad()) continue;
      at::Tensor handle = o;
      handle.register_hook([call](const at::Tensor&) { on_output_grad(call); });
    }
    // A result with no tensor we can see (a custom struct) may still carry autograd history:
    // keep the parameters gathered until the end of the iteration rather than guess.
    if (outputs.empty()) return;
  }
  c->release(call->unit, call->grad_enabled);
  call->active = false;
}

void abort_unit(const std::shared_ptr<UnitCall>& call) noexcept {
  try {
    auto c = live(call);
    if (c && call->active) c->release(call->unit, /*traced=*/false);
    if (call) call->active = false;
  } catch (...) {
    // The forward's own exception is the one to report.
  }
}

}  // namespace deepspeed::zero::detail

namespace deepspeed::zero {

GatheredParameters::GatheredParameters(torch::nn::Module& module) {
  std::vector<at::Tensor> tensors = module.parameters(/*recurse=*/true);
  for (auto& c : runtime::live_coordinators()) {
    held_.push_back({c, c->gather_held(tensors)});
  }
}

GatheredParameters::~GatheredParameters() {
  for (auto& [weak, indices] : held_) {
    auto c = std::static_pointer_cast<runtime::ParamCoordinator>(weak.lock());
    if (c) c->release_held(indices);
  }
}

}  // namespace deepspeed::zero
