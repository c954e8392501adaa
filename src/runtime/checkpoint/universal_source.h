// What ds_to_universal reads from one model-parallel rank of a ZeRO checkpoint, whatever the
// stage that wrote it: every parameter's fp32 weight and per-element optimizer states, merged
// over the data-parallel ranks with the padding dropped. The conversion (universal.cpp) then
// joins the model-parallel ranks and writes one folder per parameter.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

#include "deepspeed/checkpoint.h"
#include "deepspeed/universal_checkpoint.h"
#include "runtime/zero/repartition.h"

namespace deepspeed::checkpoint::detail {

class MoeExperts;

struct UniversalSource {
  /// "fp32", "exp_avg", ... -> parameter -> its elements. Frozen parameters have "fp32" only.
  std::map<std::string, runtime::SavedParams> states;
  std::map<std::string, at::Tensor> step;  // parameter -> its step count (a 0-d tensor)
  std::vector<std::string> order;          // parameter names: trainable in param_shapes order,
                                           // then frozen ones
  /// Those the optimizer does not hold (fp32 only), with the dtype they were saved in.
  std::map<std::string, at::ScalarType> frozen;
  /// zero/optimizer_state.pt as DeepSpeed writes it: rank 0's optimizer_state_dict (loss
  /// scaler, ds_version, clip_grad, ...) without its partitioned parts, plus `param_groups`.
  c10::IValue optimizer_state;
  /// The model-states file the output folder carries as mp_rank_XX_model_states.pt (counters,
  /// scheduler, buffers, client state), with every parameter present in the module.
  c10::IValue model_states;
  /// Files the output folder carries as they are (ZeRO-3: every rank's model states, which
  /// DeepSpeed's ZeRO-3 universal load reads).
  std::vector<std::string> copy_files;
  /// AutoEP's stacked expert weights ("<layer>.experts.w1"), whole over the expert-parallel
  /// ranks, with their layer's number of experts: DeepSpeed marks their states
  /// is_expert_param / ep_num_experts, and a load takes its ranks' rows.
  std::map<std::string, int64_t> stacked_experts;
};

/// Every model-parallel rank of a ZeRO 0-3 tag folder (tensor-parallel ranks, pipeline stages or
/// both), read as UniversalSource, and what joins them into whole parameters. ds_to_universal
/// writes it out; zero_to_fp32 takes the weights of a model-parallel checkpoint from it.
struct ModelParallelCheckpoint {
  std::string tag_dir;
  std::vector<UniversalSource> ranks;  // by model-parallel rank: stage * tp + tensor-parallel rank
  std::map<std::string, TensorParallelSplit> splits;  // the split parameters, every stage's
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t dp = 1;
  bool zero3 = false;
  std::vector<std::string> names;  // rank 0's parameters, then those the other ranks add

  /// The first stage holding parameter `name`: ranks[stage * tp] has its state.
  int64_t stage_of(const std::string& name) const;
  /// State `key` ("fp32", "exp_avg", ...) of parameter `name` whole: its first stage's, the
  /// tensor-parallel pieces joined along their partition_dim and a vocabulary's padding rows
  /// dropped. nullopt where the parameter has no such state (a frozen one has fp32 only).
  /// Throws CheckpointError naming the rank that lacks a piece.
  std::optional<at::Tensor> full(const std::string& name, const std::string& key) const;
};

/// Reads `tag_dir` (ds_to_universal's input). Throws CheckpointError naming the missing or
/// inconsistent folder or file, NotSupportedError for MoE under ZeRO-3.
ModelParallelCheckpoint read_model_parallel_checkpoint(const std::string& tag_dir);

/// A ZeRO-3 tag folder's model-parallel rank `mp_rank`: zero_pp_rank_<r>_mp_rank_XX files of
/// every data-parallel rank. `moe`: AutoEP's layers, whose expert sub-groups are partitioned over
/// each expert-parallel rank's expert-data-parallel group. Throws CheckpointError naming the
/// missing or inconsistent file.
UniversalSource read_zero3_source(const std::string& tag_dir, int64_t mp_rank,
                                  const MoeExperts* moe = nullptr);

/// A ZeRO-0 tag folder's model-parallel rank `mp_rank`: its mp_rank_XX_model_states.pt
/// (`model_states`, read from `path`), whose 'optimizer' holds the whole optimizer: the
/// optimizer's own state dict (fp32) or FP16_Optimizer's dict with the flat fp32 masters
/// (fp16/bf16). Beyond DeepSpeed's tool, which converts ZeRO 1-3 only. Throws CheckpointError
/// naming the file. An MoE checkpoint's experts are read_zero0_moe_source's.
UniversalSource read_zero0_source(const c10::IValue& model_states, const std::string& path);

/// The experts of an MoE checkpoint (DeepSpeed's layout, runtime/checkpoint/moe_checkpoint.h):
/// each data-parallel rank's optimizer states name its experts by local id; the universal
/// checkpoint names them by global id, as the expert files do, so that it loads onto any
/// ep_size. Beyond DeepSpeed's tool, which skips native MoE experts.
///
/// AutoEP's layers (ds_autoep_layers, per_expert_files) stack a rank's experts in one tensor
/// per weight under one name on every rank ("<prefix>.w1", rows [ep_rank * n, (ep_rank + 1) *
/// n) of the whole): their states join along dim 0 in expert-parallel order, as DeepSpeed's
/// tool consolidates them.
class MoeExperts {
 public:
  /// nullopt without MoE (no num_experts in `states`, read from `path`). Reads every expert
  /// file of the tag folder `dir` for model-parallel rank `mp`. Throws CheckpointError naming
  /// the missing expert file, or the layer whose ep_size the checkpoint does not tell.
  static std::optional<MoeExperts> read(const std::string& dir, int64_t mp,
                                        const ModelStates& states, const std::string& path);

  bool is_expert(const std::string& name) const;
  /// An expert entry's name with its expert id left out ("<layer>...deepspeed_experts.*.<rest>"):
  /// every expert of a layer has the same shape and tensor-parallel split. nullopt for a name
  /// that is not an expert's.
  static std::optional<std::string> without_expert_id(const std::string& name);
  /// `name` as data-parallel rank `rank` holds it (a local expert id), named by its global id;
  /// a name that is not an expert's as it is.
  std::string global_name(const std::string& name, int rank) const;
  /// Rank `rank`'s experts under their local names (from the expert files).
  TensorDict local_weights(int rank) const;
  /// Per expert-parallel rank, the data-parallel ranks holding its experts in an expert group
  /// partitioned over `count` ranks (its expert-data-parallel group, in order).
  std::vector<std::vector<int>> holders(int64_t count) const;
  /// Every expert parameter without fp32 state in `out` (a frozen one), whole from its file.
  void add_frozen(UniversalSource* out) const;
  /// Every expert entry (parameters and buffers) by global key, as the expert files hold it.
  const TensorDict& weights() const { return weights_; }

  /// Whether the checkpoint has MoE layers of its own (not AutoEP's).
  bool has_native_layers() const { return !layers_.empty(); }
  /// AutoEP: whether `name` is a stacked expert weight ("<prefix>.w1/w2/w3").
  bool is_stacked(const std::string& name) const { return stacked_.count(name) > 0; }
  /// AutoEP: the expert-parallel rank whose rows data-parallel rank `rank` holds of stacked
  /// weight `name`, and the layer's ep_size.
  int64_t stacked_ep_rank(const std::string& name, int rank) const;
  int64_t stacked_ep_size(const std::string& name) const;
  /// AutoEP: every stacked weight's name, and one whole from the expert files (every expert).
  std::vector<std::string> stacked_names() const;
  at::Tensor stacked_whole(const std::string& name) const;
  /// AutoEP: joins each stacked weight's per-expert-parallel-rank pieces (`pieces[name][key]`
  /// by ep rank) into `out`'s states, whole; `where` names the checkpoint in errors.
  using StackedPieces =
      std::map<std::string, std::map<std::string, std::map<int64_t, runtime::SavedParam>>>;
  void join_stacked(const StackedPieces& pieces, const std::string& where,
                    UniversalSource* out) const;

 private:
  struct Layer {
    int64_t num_experts = 0;
    int64_t ep_size = 0;  // 0: no trainable expert parameter tells it
  };
  int64_t ep_rank_of(int rank, int64_t ep_size) const;
  void read_stacked_layer(const std::string& dir, int64_t mp, int layer_id,
                          const nlohmann::json& entry, const std::string& path);
  // A rank's rows of stacked weight `name` from the expert files (a frozen one, or ZeRO-0's
  // module, which has none); experts [first, first + count) of it.
  at::Tensor stacked_local(const std::string& name, int rank) const;
  at::Tensor stacked_rows(const std::string& name, int64_t first, int64_t count) const;

  int world_ = 1;
  bool data_before_expert_ = false;  // use_data_before_expert_parallelism
  std::map<std::string, Layer> layers_;  // by the MoE layer's key prefix ("moe.")
  TensorDict weights_;                   // every expert entry by global key
  std::vector<std::string> buffers_;     // expert buffers, as "<prefix>|<rest>"
  std::map<std::string, Layer> stacked_;  // AutoEP: by stacked weight name ("<prefix>.w1")
  TensorDict stacked_weights_;            // AutoEP: "<prefix>.w1.<global id>" from the files
};

/// The data-parallel ranks whose partitions of param group `g` (partitioned over `count` of
/// `world` ranks) join into whole flats: one set of every rank, or (an MoE expert group, over
/// its expert-data-parallel group) one per expert-parallel rank. CheckpointError naming `path`
/// for a smaller count without `moe`.
std::vector<std::vector<int>> partition_holders(int64_t count, int64_t world, size_t g,
                                                const MoeExperts* moe, const std::string& path);

/// A ZeRO-0 MoE checkpoint's model-parallel rank `mp_rank`: the optimizer of each
/// expert-parallel rank in its expp_rank_<e> file; dense parameters from the first, experts
/// by global id from each. `model_states` was read from `path`.
UniversalSource read_zero0_moe_source(const std::string& dir, int64_t mp_rank,
                                      const c10::IValue& model_states, const std::string& path,
                                      const MoeExperts& moe);

/// Every module entry of `states` that `out` has no fp32 state for and that is neither a
/// buffer nor a tied alias: a frozen parameter, whole in the module, kept as fp32 only.
void add_frozen_from_module(const ModelStates& states, UniversalSource* out);

/// DeepSpeed's global optimizer state from a ZeRO optimizer file `raw` (read from `path`): its
/// optimizer_state_dict less the keys in `drop`, with the inner optimizer's `param_groups`
/// (under base_optimizer_state for ZeRO 1/2, optimizer_state_dict for ZeRO-3) at the top, its
/// step counts as `optimizer_state_dict` {state: {k: {step}}, param_groups} (where DeepSpeed's
/// ZeRO-3 load reads them), the loss scaler as DeepSpeed's object, and ds_version.
c10::IValue global_optimizer_state(const c10::IValue& raw, const std::vector<std::string>& drop,
                                   const std::string& path);

/// A step count as a 0-d tensor (DeepSpeed stores a number or a tensor); `where` names it.
at::Tensor as_step_tensor(const c10::IValue& v, const std::string& where);

}  // namespace deepspeed::checkpoint::detail
