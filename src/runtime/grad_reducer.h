// GradReducer: ZeRO-0 gradient averaging. Gradients are packed into buckets of at most
// reduce_bucket_size elements (in reverse parameter order, the order backward produces them);
// a post-hook on each parameter's AccumulateGrad node copies the accumulated gradient into its
// bucket, and a full bucket is all-reduced asynchronously while backward goes on.
// Note [Bucket order]: buckets are launched strictly in index order on every rank, so ranks
// whose backward visits parameters in a different order (or skips unused ones) still issue the
// same collectives in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "runtime/zero/bucketer.h"

namespace deepspeed::runtime {

struct GradReducerOptions {
  int64_t bucket_numel = 500000000;  // zero_optimization.reduce_bucket_size
  bool prescale = false;             // prescale_gradients
  double predivide_factor = 1.0;     // gradient_predivide_factor
  bool average = true;               // gradient_allreduce_op "mean" (false: "sum")
  comm::Group group;                 // the data-parallel group the gradients are averaged over
};

class GradReducer {
 public:
  GradReducer(std::vector<at::Tensor> params, GradReducerOptions options);
  ~GradReducer();

  /// Arms the hooks for the coming backward (the accumulation boundary's).
  void prepare();
  /// After backward: launches what the hooks did not (parameters without gradients count as
  /// zeros), waits for every bucket, and writes the averaged gradients back into .grad.
  void finish();
  bool armed() const { return armed_; }

  size_t num_buckets() const { return buckets_.size(); }
  /// Milliseconds finish() spent waiting for communication (the non-overlapped part).
  double last_wait_ms() const { return last_wait_ms_; }
  /// Buckets the last armed backward launched, and how many of them from gradient hooks.
  int64_t last_buckets_launched() const { return launched_; }
  int64_t last_buckets_launched_from_hooks() const { return launched_from_hooks_; }
  int64_t bucket_bytes() const;

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    at::Tensor flat;
    size_t pending = 0;
    bool launched = false;
    comm::Handle handle;
  };
  void on_grad_ready(size_t param_index);
  void launch_ready_buckets();
  void launch(Bucket& bucket);

  std::vector<at::Tensor> params_;
  GradReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;      // param index -> bucket index
  std::vector<size_t> slot_in_bucket_;  // param index -> position in bucket.params
  std::vector<bool> ready_;
  size_t next_to_launch_ = 0;
  bool armed_ = false;
  double last_wait_ms_ = 0.0;
  int world_size_ = 1;
  int64_t launched_ = 0;
  int64_t launched_from_hooks_ = 0;
  bool in_finish_ = false;
  std::unique_ptr<GradReadyHooks> hooks_;  // last: removed first
};

}  // namespace deepspeed::runtime
