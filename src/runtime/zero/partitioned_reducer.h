// PartitionedGradReducer: ZeRO 1/2 gradient reduction. Gradients go into buckets of at most
// reduce_bucket_size elements (reverse parameter order, the order backward produces them; a
// parameter larger than a bucket gets one of its own). A full bucket is reduced while backward
// goes on, and each rank keeps only the ranges it owns, added into its gradient partition.
//
// Note [Static buckets]: the bucket of every parameter is fixed at construction and buckets are
// launched strictly in index order, so every rank issues the same collectives in the same order
// even when autograd visits parameters differently or some get no gradient. A gradient that
// arrives before its bucket is being filled stays in param.grad until then.
//
// Buffers: one (overlap_comm false: each bucket is reduced synchronously, in the hook) or two
// (overlap_comm true: one is filled while the other is in flight, DeepSpeed's double buffering).
//
// Reduction (reference §7.1, §7.3): reduce_scatter false: all-reduce the bucket with the
// pre/post-scale formula. reduce_scatter true: divide by W, then all-reduce the bucket
// (use_multi_rank_bucket_allreduce, DeepSpeed's default) or reduce each owner's range to its
// owner (dist.reduce, half the traffic of an all-reduce).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "runtime/zero/bucketer.h"
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
  comm::Group group;  // the data-parallel group; partition r belongs to its group rank r
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
  bool armed() const { return armed_; }

  size_t num_buckets() const { return buckets_.size(); }
  int64_t buffer_bytes() const;
  const ReductionStats& stats() const { return stats_; }

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
    size_t pending = 0;
    int buffer = -1;
    std::vector<comm::Handle> handles;
  };
  void build_buckets();
  void on_grad_ready(size_t index);
  void copy_in(Bucket& bucket, size_t slot_in_bucket);
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  void acquire_buffer(Bucket& bucket);
  void complete_oldest();
  at::Tensor bucket_view(const Bucket& bucket) const;

  std::vector<FlatGroup>* groups_;
  std::vector<at::Tensor>* grad_partitions_;
  PartitionedReducerOptions options_;
  int world_size_ = 1;
  int rank_ = 0;

  std::vector<std::pair<size_t, size_t>> param_at_;  // global index -> (group, slot)
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<size_t> slot_in_bucket_;
  std::vector<bool> ready_;
  std::vector<bool> copied_;

  std::vector<at::Tensor> buffers_;
  std::vector<int> free_buffers_;
  std::deque<size_t> in_flight_;  // bucket indices, in launch order
  size_t next_to_launch_ = 0;
  bool armed_ = false;
  bool in_finish_ = false;
  ReductionStats stats_;
  std::unique_ptr<GradReadyHooks> hooks_;  // last: removed first
};

}  // namespace deepspeed::runtime
