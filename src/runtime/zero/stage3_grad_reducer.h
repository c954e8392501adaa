// Stage3GradReducer: ZeRO-3 gradient reduction (reference §7.8). Each trainable parameter's
// full gradient, once autograd has accumulated it (a post hook on its AccumulateGrad node), is
// cut into W chunks of its shard size (the last ones zero-padded) and copied rank-major into
// the bucket being filled: rank r's chunks of every parameter in the bucket are contiguous.
// A full bucket is divided by W and reduce-scattered, so rank r receives the averaged chunks it
// owns, which are added into each parameter's gradient shard (a view of its sub-group's flat
// gradient), and param.grad is dropped. Buckets hold at most reduce_bucket_size elements
// (padded); a larger parameter gets a bucket of its own.
//
// Buckets are fixed at construction in reverse parameter order and launched in index order on
// every rank by the Bucketer (Note [Static buckets]): a gradient that arrives before its
// bucket is the one being filled waits in param.grad. A parameter without a gradient in this
// backward counts as zeros (ignore_unused_parameters) or is an error naming it.
//
// zero_quantized_gradients (qgZ): the reduce-scatter is Note [Quantized reduction]'s two
// all-to-alls: launch() starts the first (inside the node) and the bucket's completion runs the
// second, so that with overlap_comm the first runs while the next bucket fills; with
// zeropp_loco_param each bucket carries its rounding errors to its next reduction (Note [LoCo
// error feedback]).
//
// reduce_scatter false: the bucket is all-reduced and each rank keeps its own chunks (the same
// result, DeepSpeed's non-reduce-scatter path). overlap_comm: two buffers; a launched bucket
// completes while the next fills, else each completes inside the hook that launched it.
// contiguous_gradients false: gradients stay in param.grad until their bucket launches.
//
// Note [Stage-3 gradients to the host]
// ZeRO-Offload with the model on a GPU keeps the gradient shards in pinned host memory. Each
// reduced bucket reaches them on a side stream, without a host wait, so the copies run while
// backward goes on. In the first backward after zero_grad the shards are zero and the bucket is
// copied straight into them; a later micro-step of an accumulation must add, and adds on the
// device, as DeepSpeed's accumulation of offloaded gradients does: the shards' sums so far cross
// to the device, the bucket is added there and the sums cross back, all on the side stream (the
// host would otherwise wait for every bucket before adding it, and the GPU would idle while it
// adds). The shards of one parameter are only touched by that stream between zero_grad and
// finish(), so its copies keep the order of the micro-steps. Before a bucket buffer that copies
// still read is refilled, the compute stream waits for them; finish() waits once for the last,
// since the host reads the shards next (norm, overflow, CPU-Adam).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "runtime/accelerator/side_stream.h"
#include "runtime/zero/bucketer.h"
#include "runtime/zero/comm_dtypes.h"
#include "runtime/zero/loco_error_feedback.h"
#include "runtime/zero/quantized_reduction.h"
#include "runtime/zero/stage3_param.h"
#include "runtime/zero/zero_optimizer.h"

namespace deepspeed::runtime {

struct Stage3ReducerOptions {
  int64_t bucket_numel = 500000000;  // reduce_bucket_size
  bool overlap_comm = true;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  bool average = true;  // gradient_allreduce_op "mean"
  int average_divisor = 0;  // what "mean" divides by; 0: the group's size
  bool ignore_unused_parameters = true;
  at::ScalarType bucket_dtype = at::kFloat;  // communication_data_type
  /// Parameters reduced in another dtype (torch_autocast): buckets never mix dtypes.
  CommDtypes comm_dtypes;
  comm::Group group;  // the data-parallel group; shard r belongs to its group rank r
  /// ZeRO++'s qgZ: buckets reduce as Note [Quantized reduction] over these groups.
  std::optional<NodeGroups> quantized_reduction;
  /// LoCo's error feedback for those reductions (zeropp_loco_param).
  std::optional<LocoConfig> loco;
  /// The shards are host memory and the buckets device memory (Note [Stage-3 gradients to the
  /// host]); set on CPU too by DS_TEST_OFFLOAD_HOST_BUFFERS_ON_CPU, to test that logic.
  bool host_shards = false;
};

class Stage3GradReducer {
 public:
  /// `trainable` lists the parameters to reduce; `grad_shards[k]` is where parameter
  /// `trainable[k]`'s owned gradient chunk accumulates. `params` must outlive the reducer.
  Stage3GradReducer(std::vector<PartitionedParam>* params, std::vector<size_t> trainable,
                    std::vector<at::Tensor> grad_shards, Stage3ReducerOptions options);
  ~Stage3GradReducer();

  void prepare();
  void finish();
  /// zero_grad() zeroed every gradient shard: the next backward may copy instead of add.
  void shards_zeroed() { shards_zero_ = true; }
  /// After the loss scaler's update (Note [LoCo error feedback]): an overflow drops LoCo's
  /// errors, a scale `ratio` times the last rescales them.
  void loss_scale_updated(bool overflow, double ratio);
  bool armed() const { return bucketer_->armed(); }
  size_t num_buckets() const { return buckets_.size(); }
  /// Bucket buffers, and LoCo's errors kept between reductions.
  int64_t buffer_bytes() const;
  ReductionStats stats() const;

 private:
  struct Bucket {
    size_t index = 0;              // in buckets_
    std::vector<size_t> members;   // positions in trainable_
    std::vector<int64_t> offsets;  // each member's chunk offset inside a rank's region
    int64_t region = 0;            // elements per rank (sum of the members' shard sizes)
    at::ScalarType dtype = at::kFloat;  // the reduction's
  };
  void on_grad_ready(size_t k);
  void fill(const Bucket& b, size_t m, size_t buffer);
  std::vector<comm::Handle> launch(const Bucket& b, size_t buffer);
  void complete(const Bucket& b, size_t buffer);
  at::Tensor send_view(const Bucket& b, size_t buffer) const;
  at::Tensor receive_view(const Bucket& b, size_t buffer) const;

  std::vector<PartitionedParam>* params_;
  std::vector<size_t> trainable_;
  std::vector<at::Tensor> grad_shards_;
  Stage3ReducerOptions options_;
  int world_ = 1;
  int rank_ = 0;
  std::vector<Bucket> buckets_;
  // The Bucketer's pool, per bucket dtype: buffer i is send_buffers_[dtype][i] (W * region
  // elements) with receive_buffers_[dtype][i] (region elements, the reduce_scatter output).
  std::map<at::ScalarType, std::vector<at::Tensor>> send_buffers_;
  std::map<at::ScalarType, std::vector<at::Tensor>> receive_buffers_;
  // Note [Stage-3 gradients to the host]
  void copy_to_host_shards(const Bucket& b, size_t buffer);
  void wait_for_copies_from(size_t buffer);
  std::unique_ptr<SideStream> d2h_;  // with host_shards
  std::vector<bool> copies_read_;    // per buffer: copies in flight read it
  bool shards_zero_ = true;
  int64_t host_copies_ = 0;          // buckets sent to the host without a host wait, this backward
  std::unique_ptr<LocoErrorFeedback> loco_;  // qgZ with zeropp_loco_param
  // qgZ: per buffer, its bucket's first stage between launch and completion.
  std::vector<QuantizedReductionInFlight> quantized_in_flight_;
  std::unique_ptr<Bucketer> bucketer_;
  std::unique_ptr<GradReadyHooks> hooks_;  // last: removed first
};

}  // namespace deepspeed::runtime
