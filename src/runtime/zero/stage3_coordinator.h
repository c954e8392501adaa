// ParamCoordinator: when ZeRO-3 parameters are gathered and released (reference §7.7). A unit
// call fetches its unit's parameters (forward, and again from the hook on its outputs before
// its backward) and releases them afterwards. Gathering issues one all-gather per fetch for the
// small shards and one per large parameter (Note [Coalesced gathers] in stage3_param.h);
// after the first iteration the recorded order of unit fetches (the trace) lets a fetch start
// the all-gathers of the units that come next (prefetch) while this one computes.
//
//   - stage3_prefetch_bucket_size: elements a fetch may prefetch ahead (0: no prefetch);
//   - stage3_max_live_parameters: prefetch stops while this many elements are gathered;
//   - stage3_max_reuse_distance: a released parameter that the trace uses again within this
//     many gathered elements stays gathered;
//   - persistent parameters (small, or outside units) are never released.
//
// The trace is recorded during the first iteration (forward + backward with grad enabled). A
// fetch out of the recorded order invalidates it: no prefetch or reuse for the rest of that
// iteration, and the next one records again (as DeepSpeed does). Forwards without grad
// (evaluation) use neither and release at once.
//
// Note [Unit call lifetime]: a UnitCall lives in the autograd graph (hooks capture it) and may
// outlive its iteration or the engine. It holds a weak pointer to the coordinator and the
// iteration epoch it belongs to; end_iteration() releases everything and bumps the epoch, so a
// stale call's hooks do nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepspeed/zero3.h"
#include "runtime/zero/stage3_param.h"
#include "runtime/zero/stage3_shard_store.h"

namespace deepspeed::runtime {

struct Stage3Unit {
  const torch::nn::Module* module = nullptr;
  std::string name;
  std::vector<size_t> params;  // sorted indices into the coordinator's parameters
  int64_t numel = 0;           // elements of its non-persistent parameters
};

struct CoordinatorOptions {
  int64_t prefetch_bucket_numel = 50000000;
  int64_t max_live_numel = 1000000000;
  int64_t max_reuse_distance_numel = 1000000000;
  bool use_all_reduce_for_fetch = false;
  ShardGroup group;  // the ranks the shards are gathered from (stage3_param.h)
  /// Note [Expert partitions]: the group of the parameters cut for partition 1 (AutoEP's
  /// expert-data-parallel group); unused without them.
  ShardGroup expert_group;
  /// Note [Quantized gather]: the unit fetches and their prefetches gather blockwise int8.
  bool quantize_weights = false;
};

struct CoordinatorStats {
  int64_t fetches = 0;             // unit fetches (forward and backward)
  int64_t gathers = 0;             // parameters gathered
  int64_t gather_collectives = 0;  // collectives those took (Note [Coalesced gathers])
  int64_t prefetched_gathers = 0;  // of those, issued ahead for a later unit
  int64_t releases = 0;            // parameters released
  int64_t trace_invalidations = 0;
  int64_t live_numel = 0;          // elements of non-persistent parameters gathered now
  int64_t peak_live_numel = 0;     // since the last reset_peak()
};

class ParamCoordinator {
 public:
  ParamCoordinator(std::vector<PartitionedParam>* params, std::vector<Stage3Unit> units,
                   CoordinatorOptions options);

  /// `traced`: part of a training iteration (a forward with grad enabled, or the backward of
  /// one), which the trace records and prefetch and reuse follow.
  void fetch(size_t unit, bool traced);
  void release(size_t unit, bool traced);
  /// After backward: releases every non-persistent parameter, closes or restarts the trace.
  void end_iteration();
  /// After the optimizer updated the shards: refreshes every gathered parameter.
  void refresh_gathered();
  /// zero::GatheredParameters: gathers those of `tensors` this coordinator partitions and holds
  /// them (as an active user) until release_held() with the returned indices.
  std::vector<size_t> gather_held(const std::vector<at::Tensor>& tensors);
  void release_held(const std::vector<size_t>& indices);
  /// Gathers parameter `i` now (swapping its shard in and out around the all-gather).
  void gather_now(size_t i);
  uint64_t epoch() const { return epoch_; }
  /// offload_param "nvme": shards come from `store` (not owned; outlives the coordinator's use).
  void set_shard_store(ShardStore* store) { store_ = store; }

  const std::vector<Stage3Unit>& units() const { return units_; }
  const CoordinatorStats& stats() const { return stats_; }
  void reset_peak() { stats_.peak_live_numel = stats_.live_numel; }
  bool trace_complete() const { return mode_ == Mode::kComplete; }

 private:
  enum class Mode { kRecord, kComplete, kInvalid };

  void gather(size_t param, bool async);
  /// Gathers those of `params` that are not available, small shards in one collective;
  /// `fetch`: for a unit's forward or backward (Note [Quantized gather]).
  void gather_all(const std::vector<size_t>& params, bool async, bool fetch = false);
  /// Waits for these parameters' gathers and lets their swapped shards go.
  void settle(const std::vector<size_t>& params);
  /// Brings in the swapped shards among `params` that are about to be gathered.
  void swap_in_for_gather(const std::vector<size_t>& params);
  void free(size_t param);
  void advance_trace(size_t unit, bool traced);
  void prefetch();
  bool reused_soon(size_t param) const;

  std::vector<PartitionedParam>* params_;
  std::vector<Stage3Unit> units_;
  CoordinatorOptions options_;
  // By partition (Note [Expert partitions]): options_.group and expert_group, and those
  // quantized for qwZ (Note [Quantized gather]).
  std::vector<ShardGroup> groups_;
  std::vector<ShardGroup> fetch_groups_;
  Mode mode_ = Mode::kRecord;
  std::vector<size_t> trace_;  // unit indices in fetch order over one iteration
  size_t cursor_ = 0;          // next trace position (kComplete)
  std::vector<bool> prefetched_;  // gathered ahead and not yet fetched
  uint64_t epoch_ = 0;
  ShardStore* store_ = nullptr;
  CoordinatorStats stats_;
};

/// Makes `module` a unit of `coordinator` for zero::detail::enter_unit (until unregistered).
void register_unit(const torch::nn::Module* module, std::weak_ptr<ParamCoordinator> coordinator,
                   size_t unit);
void unregister_unit(const torch::nn::Module* module);
/// Every live coordinator (for zero::GatheredParameters).
void register_coordinator(const std::shared_ptr<ParamCoordinator>& coordinator);
std::vector<std::shared_ptr<ParamCoordinator>> live_coordinators();

}  // namespace deepspeed::runtime

namespace deepspeed::zero::detail {

// See Note [Unit call lifetime].
class UnitCall {
 public:
  std::weak_ptr<runtime::ParamCoordinator> coordinator;
  size_t unit = 0;
  uint64_t epoch = 0;
  bool grad_enabled = false;
  bool active = false;            // holds its unit's parameters now
  bool backward_fetched = false;  // the output hook fetched them for backward
  int pending_inputs = 0;         // tracked inputs whose gradient has not arrived yet
};

}  // namespace deepspeed::zero::detail
