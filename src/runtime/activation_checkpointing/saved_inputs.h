// SavedInputs: how a checkpointed call keeps its inputs between forward and backward, by the
// options of that call: a reference (default), a separate host copy (cpu_checkpointing), this
// rank's 1/mp slice (partition_activations), optionally in a slot of a contiguous buffer
// (contiguous_memory_optimization); and how it gives them back for the recomputation. Does not
// run the function or touch the RNG (checkpointing.cpp does).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "deepspeed/checkpointing.h"
#include "deepspeed/comm.h"

namespace deepspeed::checkpointing::detail {

/// The model-parallel group the activations are partitioned over (size 1: nothing to split).
struct ModelParallel {
  comm::Group group;  // empty when size is 1
  int rank = 0;
  int size = 1;
};

class SavedInputs {
 public:
  /// Keeps `inputs` as `options` say. Collective-free. Throws UsageError for a partitioned input
  /// whose numel does not divide by mp.size, or for a contiguous buffer that is full or whose
  /// slots do not fit the input.
  SavedInputs(const std::vector<at::Tensor>& inputs, const Options& options,
              const ModelParallel& mp);
  ~SavedInputs();
  SavedInputs(const SavedInputs&) = delete;
  SavedInputs& operator=(const SavedInputs&) = delete;

  /// The inputs again, detached, on their original devices and shapes, with their original
  /// requires_grad. Partitioned inputs are all-gathered over the model-parallel group (collective:
  /// every member restores the same calls in the same order).
  std::vector<at::Tensor> restore() const;

  /// Bytes held for backward (the slices, copies or referenced inputs).
  int64_t bytes() const { return bytes_; }

 private:
  struct Entry {
    at::Tensor data;             // what is kept (may be a slice or a host copy)
    std::vector<int64_t> sizes;  // the input's shape
    at::Device device = at::kCPU;
    bool requires_grad = false;
    bool partitioned = false;
  };
  std::vector<Entry> entries_;
  ModelParallel mp_;
  int64_t bytes_ = 0;
};

/// Whether `t` is a checkpointed activation (DeepSpeed's is_activation_to_checkpoint): a defined
/// floating-point tensor with at least `mp_size` elements. Other inputs are kept as they are.
bool is_activation_to_checkpoint(const at::Tensor& t, int mp_size);

/// Drops the contiguous buffers (backward start and reset()); slots still referenced by saved
/// inputs stay alive until those are released.
void clear_contiguous_buffers();

/// Adds `delta` to Stats::saved_bytes and updates the peak (checkpointing.cpp owns the counters).
void account_saved_bytes(int64_t delta);
/// Increments one counter of the process-wide Stats.
void count(int64_t Stats::*counter, int64_t n = 1);

}  // namespace deepspeed::checkpointing::detail
