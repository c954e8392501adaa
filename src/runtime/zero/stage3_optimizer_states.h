// OptimizerStateStore: where ZeRO-3 keeps each sub-group's fp32 master and optimizer state
// between steps, chosen once from offload_optimizer.device (make_optimizer_state_store):
//   kNone  in memory, beside the model (InMemory);
//   kCpu   in host memory, stepped by the CPU optimizer; offload_optimizer.ratio < 1 keeps the
//          last sub-groups on the device (Host, docs/offload.md "Twin-Flow");
//   kNvme  as kCpu, and the offloaded sub-groups' masters and state in swap files, brought in
//          only for their own step (Nvme, Note [NVMe sub-groups]).
// A CPU-only build steps every sub-group on the CPU with the same kernel, so the store changes
// where memory is counted and what is swapped, never the numbers.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deepspeed/config.h"
#include "runtime/zero/stage3_sub_group.h"
#include "runtime/zero/zero_optimizer.h"

namespace torch::optim {
class Optimizer;
}

namespace deepspeed::runtime {

class OptimizerStateStore {
 public:
  virtual ~OptimizerStateStore() = default;

  /// Whether any sub-group's state leaves the device (offload_optimizer device cpu or nvme).
  virtual bool offloads() const { return false; }
  /// Whether masters go to swap files: then each is a separate fp32 copy, made one at a time
  /// by start() rather than all at once by the stage (SubGroupAllocation::deferred).
  virtual bool swaps_masters() const { return false; }
  /// Decides which sub-groups are offloaded, once they are laid out.
  virtual void place() {}
  /// Once the optimizer's param groups hold the masters: a store that swaps makes each master
  /// with `make_master(k)` and writes it out with its state.
  virtual void start(const std::function<void(size_t)>& /*make_master*/) {}
  /// Steps every sub-group through `step_one`, in the order the store brings them in.
  virtual void step(const std::function<void(size_t)>& step_one);
  /// Brings every swapped sub-group's state into memory (checkpoint save / load), and back.
  virtual void swap_in_all() {}
  virtual void swap_out_all() {}
  /// Adds what the store holds off the device to `m` (offloaded, NVMe and swap buffer bytes).
  virtual void report(ZeroMemory& /*m*/) const {}

 protected:
  explicit OptimizerStateStore(std::vector<Stage3SubGroup>* sub_groups) : sub_groups_(sub_groups) {}
  std::vector<Stage3SubGroup>* sub_groups_;  // the stage's, laid out before place()
};

/// The store for `config`'s offload_optimizer.device. `sub_groups` and `optimizer` are the
/// stage's and outlive the store.
std::unique_ptr<OptimizerStateStore> make_optimizer_state_store(
    const DeepSpeedConfig& config, std::vector<Stage3SubGroup>* sub_groups,
    torch::optim::Optimizer* optimizer, int global_rank);

}  // namespace deepspeed::runtime
