// GradReducer: ZeRO-0 gradient averaging. Gradients are packed into buckets of at most
// reduce_bucket_size elements (in reverse parameter order, the order backward produces them);
// a post-hook on each parameter's AccumulateGrad node copies the accumulated gradient into its
// bucket, and a full bucket is all-reduced asynchronously while backward goes on. Each bucket has
// a buffer of its own (the averaged gradients stay views of it); the launch order is the
// Bucketer's (see Note [Static buckets]).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_set>
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
  /// What "average" divides by; 0: the group's size. MoE expert gradients are summed over the
  /// expert-data-parallel group but divided by the whole data-parallel size (DeepSpeed's
  /// _reduce_expert_gradients), since all-to-all already summed the expert-parallel ranks' tokens.
  int average_divisor = 0;
  /// sparse_gradients: these parameters (embedding weights) stay out of the buckets; finish()
  /// reduces their gradients as rows (sparse_grad.h), after the buckets.
  std::unordered_set<const c10::TensorImpl*> sparse;
};

class GradReducer {
 public:
  GradReducer(std::vector<at::Tensor> params, GradReducerOptions options);
  ~GradReducer();

  /// Arms the hooks for the coming backward (the accumulation boundary's).
  void prepare();
  /// After backward: launches what the hooks did not (parameters without gradients count as
  /// zeros), waits for every bucket, and writes the averaged gradients back into .grad; then
  /// reduces the sparse ones.
  void finish();
  bool armed() const { return bucketer_->armed(); }

  size_t num_buckets() const { return buckets_.size(); }
  /// Milliseconds finish() spent waiting for communication (the non-overlapped part).
  double last_wait_ms() const { return last_wait_ms_; }
  /// Buckets the last armed backward launched, and how many of them from gradient hooks.
  int64_t last_buckets_launched() const { return bucketer_->buckets_launched(); }
  int64_t last_buckets_launched_from_hooks() const {
    return bucketer_->buckets_launched_from_hooks();
  }
  int64_t bucket_bytes() const;
  /// Rows of the sparse gradients this rank sent in the last finish().
  int64_t last_sparse_rows() const { return last_sparse_rows_; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    at::Tensor flat;  // the bucket's own buffer
  };
  void on_grad_ready(size_t param_index);
  void fill(Bucket& bucket, size_t slot, bool ready);
  std::vector<comm::Handle> launch(Bucket& bucket);
  void complete(Bucket& bucket);

  std::vector<at::Tensor> params_;         // bucketed
  std::vector<at::Tensor> sparse_params_;  // options_.sparse's, reduced as rows
  int64_t last_sparse_rows_ = 0;
  GradReducerOptions options_;
  std::vector<Bucket> buckets_;
  double last_wait_ms_ = 0.0;
  int world_size_ = 1;
  std::unique_ptr<Bucketer> bucketer_;
  std::unique_ptr<GradReadyHooks> hooks_;  // last: removed first
};

}  // namespace deepspeed::runtime
