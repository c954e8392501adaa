// Universal checkpoints (DeepSpeed's deepspeed/checkpoint/ds_to_universal.py and
// universal_checkpoint.py): a checkpoint rewritten as one folder per parameter holding the full,
// unpartitioned fp32 weight and optimizer states, which loads on any tensor- and data-parallel
// shape (`checkpoint.load_universal`).
//
//   <out>/zero/<param>/fp32.pt, exp_avg.pt, exp_avg_sq.pt   {"param": full tensor, "cat_dim": d,
//                                                           ...}
//   <out>/zero/<param>/step.pt       the bare step count
//   <out>/zero/optimizer_state.pt    the optimizer's non-per-parameter state and param_groups
//   <out>/mp_rank_XX_model_states.pt copies of the source's
//   <out>/../latest_universal        the tag (the output folder's name)
//
// The engine records in every model-states file what the conversion needs about tensor
// parallelism (`universal_checkpoint_info`: which parameters are split, along which dimension,
// with which stride, and the vocabulary padding). See docs/checkpoints.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace torch::nn {
class Module;
}

namespace deepspeed::checkpoint {

/// The per-parameter state files of a universal checkpoint, in DeepSpeed's names.
inline const std::vector<std::string>& universal_state_keys() {
  static const std::vector<std::string> keys{"fp32", "exp_avg", "exp_avg_sq", "step"};
  return keys;
}

/// How one parameter of a model-parallel rank relates to the full tensor.
struct TensorParallelSplit {
  int partition_dim = 0;
  int partition_stride = 1;  // 3: a fused q|k|v, each block split alike
  /// Vocabulary parameters: the real number of rows (the rest of the full tensor is
  /// make_vocab_size_divisible_by padding); -1 otherwise.
  int64_t original_vocab_size = -1;
};

/// `universal_checkpoint_info` for `module` (its parameters' tensor-parallel marks):
/// {universal_checkpoint_version, tp_degree, tensor_parallel_parameters: {name: {partition_dim,
/// partition_stride}}, parameter_with_row_parallelism_patterns, vocabulary_parameter_patterns,
/// original_vocab_size, padded_vocab_size}.
c10::IValue universal_checkpoint_info(const torch::nn::Module& module, int64_t tp_degree);

/// The split parameters listed by a `universal_checkpoint_info` value; `source` names the file.
std::map<std::string, TensorParallelSplit> tensor_parallel_splits(const c10::IValue& info,
                                                                  const std::string& source);

struct UniversalConversion {
  int64_t parameters = 0;
  int64_t tp_degree = 1;
  int64_t pp_degree = 1;  // pipeline stages (their model-parallel ranks hold disjoint layers)
  int64_t dp_degree = 1;
};

/// ds_to_universal: converts `<input_tag_dir>` (ZeRO 0-2 with any tensor-parallel, pipeline or
/// data-parallel size, ZeRO-3 with any data-parallel size; frozen parameters get an fp32 state)
/// into `output_dir` and (`write_latest`) writes `latest_universal` (the output folder's name)
/// beside it. Throws CheckpointError naming the file or parameter that is missing or
/// inconsistent.
UniversalConversion ds_to_universal(const std::string& input_tag_dir,
                                    const std::string& output_dir, bool write_latest = true);

/// The number of mp_rank_XX_model_states.pt files in a tag folder (its tensor-parallel size).
int count_model_parallel_files(const std::string& tag_dir);

/// The tag in `<dir>/latest_universal` (surrounding whitespace dropped); nullopt when there is
/// no such file.
std::optional<std::string> read_latest_universal(const std::string& dir);

/// Reads `<universal_dir>/zero/<param>/<key>.pt`'s full tensor (a dict with it under `param`,
/// or the bare tensor DeepSpeed's ZeRO-3 conversion saves); CheckpointError naming the
/// parameter and the file when it is missing or holds neither. `vocab_tensor` (optional): set
/// to whether the file marks a vocabulary parameter (its padding rows were dropped).
at::Tensor load_universal_state(const std::string& universal_dir, const std::string& param,
                                const std::string& key, bool* vocab_tensor = nullptr);

/// The step count of a universal checkpoint that has no `step.pt` per parameter (DeepSpeed's
/// ZeRO-3 conversion): `optimizer_state_dict.state[0].step` of `<dir>/zero/optimizer_state.pt`,
/// or nullopt.
std::optional<at::Tensor> universal_global_step(const std::string& universal_dir);

/// This rank's piece of `full` for a local tensor of `local_shape`: the same tensor when not
/// split, else part `tp_rank` of `tp_size` along `split.partition_dim` (honouring the stride),
/// the full dimension first zero-padded to local size x tp_size (vocabulary padding).
/// CheckpointError naming `name` when the sizes do not fit.
at::Tensor universal_slice(const at::Tensor& full, at::IntArrayRef local_shape,
                           const TensorParallelSplit* split, int tp_rank, int tp_size,
                           const std::string& name);

}  // namespace deepspeed::checkpoint
