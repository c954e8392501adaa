// PartitionedGradReducer: ZeRO 1/2 gradient reduction. Gradients go into buckets of at most
// reduce_bucket_size elements (reverse parameter order, the order backward produces them; a
// parameter larger than a bucket gets one of its own). A full bucket is reduced while backward
// goes on, and each rank keeps only the ranges it owns, added into its gradient partition.
//
// The launch order and the buffers are the Bucketer's (Note [Static buckets]). Buffers: one
// (overlap_comm false: each bucket is reduced synchronously, in the hook) or two (overlap_comm
// true: one is filled while the other is in flight, DeepSpeed's double buffering).
//
// Reduction (reference §7.1, §7.3): reduce_scatter false: all-reduce the bucket with the
// pre/post-scale formula. reduce_scatter true: divide by W, then all-reduce the bucket
// (use_multi_rank_bucket_allreduce, DeepSpeed's default) or reduce each owner's range to its
// owner (dist.reduce, half the traffic of an all-reduce).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "runtime/zero/bucketer.h"
#include "runtime/zero/comm_dtypes.h"
#include "runtime/zero/flat_group.h"
#include "runtime/zero/zero_optimizer.h"

namespace deepspeed::runtime {

struct PartitionedReducerOptions {
  int64_t bucket_numel = 500000000;  // reduce_bucket_size
  bool overlap_comm = false;
  bool contiguous_gradients = true;  // copy gradients into the bucket as they arrive
  bool reduce_scatter = true;
  bool multi_rank_bucket_allreduce = true;
  bool average = true;             // gradient_allreduce_op "mean"
  bool prescale = false;           // prescale_gradients
  double predivide_factor = 1.0;   // gradient_predivide_factor
  bool ignore_unused_parameters = true;
  at::ScalarType bucket_dtype = at::kFloat;  // communication_data_type
  /// Parameters reduced in another dtype (torch_autocast): buckets never mix dtypes.
  CommDtypes comm_dtypes;
  comm::Group group;  // the data-parallel group; partition r belongs to its group rank r
  /// The flat groups this reducer serves (indices into the groups vector); empty: all. MoE
  /// expert groups get a reducer of their own over their expert-data-parallel group.
  std::vector<size_t> flat_groups;
  /// What "mean" divides by; 0: group's size. An expert group's reducer sums over the
  /// expert-data-parallel group but divides by the whole data-parallel size (each expert saw
  /// the tokens of every data-parallel rank, through the all-to-all).
  int average_divisor = 0;
  /// Called after a reduced range was added into a gradient partition: (group, partition
  /// offset, numel). ZeRO-Offload copies it to the host from there (host_offload.h).
  std::function<void(size_t, int64_t, int64_t)> on_reduced;
};

class PartitionedGradReducer {
 public:
  /// `groups` and `grad_partitions` (one fp32 tensor of partition_numel per group) must outlive
  /// the reducer.
  PartitionedGradReducer(std::vector<FlatGroup>* groups, std::vector<at::Tensor>* grad_partitions,
                         PartitionedReducerOptions options);
  ~PartitionedGradReducer();

  /// Arms the hooks for the coming backward.
  void prepare();
  /// After backward: reduces what is left (missing gradients count as zeros) and waits for all.
  void finish();
  bool armed() const { return bucketer_->armed(); }

  size_t num_buckets() const { return buckets_.size(); }
  int64_t buffer_bytes() const;
  ReductionStats stats() const;

 private:
  struct Entry {
    size_t group = 0;
    size_t slot = 0;
    int64_t bucket_offset = 0;
  };
  struct Run {  // a bucket range owned by one rank
    int owner = 0;
    int64_t bucket_offset = 0;
    int64_t numel = 0;
  };
  struct Copy {  // a bucket range this rank owns, and where it goes in its partition
    size_t group = 0;
    int64_t bucket_offset = 0;
    int64_t partition_offset = 0;
    int64_t numel = 0;
  };
  struct Bucket {
    std::vector<size_t> params;  // global parameter indices
    std::vector<Entry> entries;
    std::vector<Run> runs;
    std::vector<Copy> copies;
    int64_t numel = 0;
    at::ScalarType dtype = at::kFloat;  // the reduction's
  };
  BucketPlan build_buckets();
  void on_grad_ready(size_t index);
  void fill(const Bucket& bucket, size_t slot_in_bucket, size_t buffer);
  std::vector<comm::Handle> launch(const Bucket& bucket, size_t buffer);
  void complete(const Bucket& bucket, size_t buffer);
  at::Tensor bucket_view(const Bucket& bucket, size_t buffer) const;

  std::vector<FlatGroup>* groups_;
  std::vector<at::Tensor>* grad_partitions_;
  PartitionedReducerOptions options_;
  int divisor_ = 1;  // what "mean" divides by (average_divisor, or the group's size)

  std::vector<std::pair<size_t, size_t>> param_at_;  // global index -> (group, slot)
  std::vector<Bucket> buckets_;
  // The Bucketer's pool, one per bucket dtype, each buffer as large as that dtype's largest bucket.
  std::map<at::ScalarType, std::vector<at::Tensor>> buffers_;
  std::unique_ptr<Bucketer> bucketer_;
  std::unique_ptr<GradReadyHooks> hooks_;  // last: removed first
};

}  // namespace deepspeed::runtime
