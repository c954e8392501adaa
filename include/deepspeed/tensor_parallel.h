// Tensor parallelism (Megatron-LM's tensor model parallelism, DeepSpeed's AutoTP): each layer's
// matrices split across the ranks of a tensor-parallel group.
//
//   regions    Megatron's autograd pairs: copy_to (identity / all-reduce), reduce_from
//              (all-reduce / identity), scatter_to (split / all-gather), gather_from
//              (all-gather / split), on the last dimension, over a group.
//   layers     ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding and the
//              vocab-parallel cross-entropy (no full-logit gather), each initialized by building
//              the full weight with the caller's generator and keeping this rank's slice, so that
//              the full weights equal the single-process model's for the same seed.
//   marks      which parameters are split (and along which dimension): the engine counts them
//              once per rank in the gradient norm and replicated ones once per group
//              (DeepSpeed's `model_parallel` attribute).
//   RNG        Megatron's get_cuda_rng_tracker / model_parallel_cuda_manual_seed on CPU
//              generators.
//   auto_tp    DeepSpeed's AutoTP: shards the torch::nn::Linear layers of an existing model in
//              place (fused qkv and the layers before a block's output projection column-wise,
//              the output projections row-wise); the model runs them through tp::linear().
// See docs/tensor_parallel.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include "deepspeed/comm.h"

namespace deepspeed::tensor_parallel {

// ---------------------------------------------------------------------------------------------
// Regions (Megatron's mappings.py). Each is an autograd function; on a group of one rank each
// is the identity.

/// Forward: identity; backward: all-reduce (sum) of the gradient over `group`. The input of a
/// column-parallel layer.
at::Tensor copy_to_model_parallel_region(const at::Tensor& x, const comm::Group& group);
/// Forward: all-reduce (sum) over `group`; backward: identity. The output of a row-parallel layer.
at::Tensor reduce_from_model_parallel_region(const at::Tensor& x, const comm::Group& group);
/// Forward: this rank's slice of the last dimension; backward: all-gather of the gradient.
at::Tensor scatter_to_model_parallel_region(const at::Tensor& x, const comm::Group& group);
/// Forward: all-gather along the last dimension; backward: this rank's slice of the gradient.
at::Tensor gather_from_model_parallel_region(const at::Tensor& x, const comm::Group& group);

// ---------------------------------------------------------------------------------------------
// Which parameters are split

/// Records that `param` is this rank's shard of a weight split along `partition_dim` over
/// `group` (Megatron's set_tensor_model_parallel_attributes). `partition_stride` > 1: the full
/// dimension is `partition_stride` blocks (a fused q|k|v), each split alike.
void mark_tensor_parallel(const at::Tensor& param, const comm::Group& group, int partition_dim,
                          int partition_stride = 1);
/// Whether `param` was marked (DeepSpeed's `param.model_parallel`).
bool is_tensor_parallel(const at::Tensor& param);

struct ShardInfo {
  comm::Group group;
  int partition_dim = 0;
  int partition_stride = 1;
};
/// The mark of `param`; throws UsageError when it has none.
ShardInfo shard_info(const at::Tensor& param);

/// The full dimension `dim` of `full` split into `parts` along `dim` the way the layers do
/// (`stride` blocks each cut into `parts`): part `index`.
at::Tensor shard_of(const at::Tensor& full, int dim, int parts, int index, int stride = 1);
/// The inverse of shard_of: the full tensor from every part in order.
at::Tensor unshard(const std::vector<at::Tensor>& parts, int dim, int stride = 1);

// ---------------------------------------------------------------------------------------------
// Layers

/// Initializes a full weight in place (the single-process model's init); called with the
/// caller's generator state, so the same seed gives the same full weight on every rank.
using InitMethod = std::function<void(at::Tensor& full_weight)>;

struct ColumnParallelLinearOptions {
  bool bias = true;
  /// All-gather the output (Megatron's gather_output) instead of leaving it split.
  bool gather_output = false;
  /// Blocks of the output dimension split alike (3 for a fused q|k|v: each rank gets its heads'
  /// q, k and v rows).
  int partition_stride = 1;
  /// Default: torch::nn::Linear's initialization of the full [out, in] weight and [out] bias.
  InitMethod init_method;
};

/// Y = X A^T + b with A split by rows (output features): this rank holds out/T of them.
/// Input replicated over the group; output split (or gathered).
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features, comm::Group group,
                           ColumnParallelLinearOptions options = {});
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;  // [out / T, in]
  at::Tensor bias;    // [out / T] (undefined without bias)

 private:
  comm::Group group_;
  ColumnParallelLinearOptions options_;
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelLinearOptions {
  bool bias = true;
  /// The input is already split along its last dimension (the output of a column-parallel
  /// layer); false: this rank takes its slice.
  bool input_is_parallel = true;
  InitMethod init_method;  // default: torch::nn::Linear's
};

/// Y = X A^T + b with A split by columns (input features): partial products all-reduced, the
/// (replicated) bias added once after the reduction.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t in_features, int64_t out_features, comm::Group group,
                        RowParallelLinearOptions options = {});
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;  // [out, in / T]
  at::Tensor bias;    // [out], replicated

 private:
  comm::Group group_;
  RowParallelLinearOptions options_;
};
TORCH_MODULE(RowParallelLinear);

/// Megatron's _vocab_size_with_padding: `vocab_size` rounded up to a multiple of
/// make_vocab_size_divisible_by * tp_size.
int64_t padded_vocab_size(int64_t vocab_size, int64_t make_vocab_size_divisible_by, int tp_size);

struct VocabParallelEmbeddingOptions {
  /// Megatron's make_vocab_size_divisible_by (128 there; 1 here: pad only to a multiple of T).
  int64_t make_vocab_size_divisible_by = 1;
  /// Default: torch::nn::Embedding's N(0, 1) of the full [vocab_size, dim] weight. The padded
  /// rows are zero.
  InitMethod init_method;
};

/// An embedding whose rows (the vocabulary, padded) are split over the group: this rank looks up
/// the ids in its range, zeros the others, and the lookups are all-reduced.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab_size, int64_t embedding_dim, comm::Group group,
                             VocabParallelEmbeddingOptions options = {});
  at::Tensor forward(const at::Tensor& ids);

  int64_t vocab_size() const { return vocab_size_; }          // the real vocabulary
  int64_t padded_vocab_size() const { return padded_size_; }  // a multiple of T
  int64_t vocab_start() const { return start_; }              // this rank's first row
  int64_t vocab_end() const { return end_; }                  // one past its last row

  at::Tensor weight;  // [padded / T, dim]

 private:
  comm::Group group_;
  int64_t vocab_size_, padded_size_, start_, end_;
};
TORCH_MODULE(VocabParallelEmbedding);

/// Per-token cross-entropy from vocab-split logits: `logits` [..., V_local] are this rank's
/// columns [vocab_start, vocab_start + V_local) of the padded vocabulary; `targets` [...] hold
/// full-vocabulary ids (< vocab_size). Columns at or past `vocab_size` (the padding) are left out
/// of the softmax, so the loss equals the unpadded model's. Three small all-reduces over
/// `group` (max, target logit, sum of exponentials); the full logits are never gathered.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        const comm::Group& group, int64_t vocab_start,
                                        int64_t vocab_size);

// ---------------------------------------------------------------------------------------------
// RNG (Megatron's tensor_parallel/random.py on CPU generators)

/// Named generator states that code inside fork() draws from instead of the default generator:
/// dropout inside a tensor-parallel region (split heads) differs per rank, dropout outside it
/// (the replicated hidden states) uses the default generator, equal on every rank of the group.
class RngStatesTracker {
 public:
  void reset();
  /// Adds state `name` seeded with `seed`; UsageError if the name or the seed is taken.
  void add(const std::string& name, uint64_t seed);
  std::map<std::string, at::Tensor> get_states() const;
  void set_states(std::map<std::string, at::Tensor> states);
  bool has(const std::string& name) const { return states_.count(name) > 0; }

  /// Swaps the default CPU generator to state `name` until destroyed, then saves the advanced
  /// state back under `name` and restores the default generator (Megatron's fork()).
  class Fork {
   public:
    Fork(RngStatesTracker* tracker, std::string name);
    ~Fork();
    Fork(const Fork&) = delete;
    Fork& operator=(const Fork&) = delete;

   private:
    RngStatesTracker* tracker_;
    std::string name_;
    at::Tensor saved_default_;
  };
  Fork fork(const std::string& name = kModelParallelRngName) { return Fork(this, name); }

  static constexpr const char* kModelParallelRngName = "model-parallel-rng";

 private:
  std::map<std::string, at::Tensor> states_;
  std::vector<uint64_t> seeds_;
};

/// The process's tracker (Megatron's get_cuda_rng_tracker()).
RngStatesTracker& get_rng_tracker();
/// Megatron's model_parallel_cuda_manual_seed: the default generator gets `seed` (the same on
/// every rank of the tensor-parallel group), the tracker's "model-parallel-rng" state
/// seed + 2718 + (rank in `tp_group`).
void model_parallel_manual_seed(uint64_t seed, const comm::Group& tp_group);

// ---------------------------------------------------------------------------------------------
// AutoTP

struct AutoTpOptions {
  /// Attention heads of the model (the fused qkv split respects them); 0: unknown (only the
  /// divisibility of the widths is checked).
  int64_t num_heads = 0;
  /// Last name component of the row-parallel (output) projections: their siblings are
  /// column-parallel (DeepSpeed's AutoTP finds the layers before an all-reduce the same way).
  std::vector<std::string> row_parallel_names = {"c_proj", "o_proj", "out_proj", "down_proj",
                                                 "fc2",    "dense_4h_to_h", "wo"};
  /// Last name component of fused q|k|v projections (column-parallel with stride 3).
  std::vector<std::string> fused_qkv_names = {"c_attn", "qkv_proj", "query_key_value", "Wqkv"};
};

/// What auto_tp did, for the log: the sharded layers by role.
struct AutoTpPlan {
  std::vector<std::string> column, row, fused_qkv;
  std::string describe() const;
};

/// Shards `model`'s linear layers over `group` in place: every parameter is first broadcast
/// from the group's first rank (all ranks of the group start from the same full model), then
/// each selected layer keeps its slice (weights re-pointed with set_data, so the module's
/// members and registrations stay valid) and is marked. Throws ConfigError naming the layer and
/// the sizes when a width (or num_heads) is not divisible by the group size.
AutoTpPlan auto_tp(torch::nn::Module& model, const comm::Group& group, AutoTpOptions options = {});

/// Runs a torch::nn::Linear as auto_tp left it: a column-parallel one on
/// copy_to_model_parallel_region(x), a row-parallel one as a partial product all-reduced with
/// the bias added after; any other through compression::linear (its forward, or compressed).
/// Models written for AutoTP or compression_training call their projections through this.
at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x);

}  // namespace deepspeed::tensor_parallel
