// DeepSpeed's MoE checkpoint layout (engine._save_moe_checkpoint / load_moe_state_dict): each
// expert of each MoE layer in its own file, named by its global id, written by the ranks of
// expert-data-parallel rank 0; the model-states file without the expert entries; the (non-ZeRO)
// optimizer in expp_rank_<ep rank>_mp_rank_XX_optim_states.pt. A model loads its experts by
// global id, so the files load onto another ep_size (docs/moe.md, docs/checkpoints.md).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "deepspeed/checkpoint.h"

namespace deepspeed::runtime {

/// What precedes an expert's id in its keys, after the MoE layer's module name:
/// "<layer>.deepspeed_moe.experts.deepspeed_experts.<id>.<param>".
inline constexpr const char* kExpertKeyPrefix = "deepspeed_moe.experts.deepspeed_experts.";

/// layer_<L>_expert_<E>_mp_rank_<mp:02d>_model_states.pt
std::string expert_file_name(int moe_layer_id, int64_t global_expert_id, int mp_rank = 0);
/// expp_rank_<ep>_mp_rank_<mp:02d>_optim_states.pt
std::string expert_optimizer_file_name(int ep_rank, int mp_rank = 0);

/// DeepSpeed 0.19.8's rule (_get_non_moe_state_dict) for what the model-states file leaves out
/// of `module`'s state: within each MoE layer, the keys containing "expert" other than its
/// gate's ("moe.gate.wg.weight"); of each AutoEP layer only its stacked experts
/// ("<layer>.experts.w1/w2/w3": its router and shared experts stay). Those of `keys`.
std::set<std::string> expert_state_keys(torch::nn::Module& module,
                                        const std::vector<std::string>& keys);
checkpoint::TensorDict without_expert_states(torch::nn::Module& module,
                                             const checkpoint::TensorDict& module_state);

/// Writes this rank's experts (on expert-data-parallel rank 0 only, or with `node_local` on the
/// first of each node), keys renamed from local to global expert ids.
void save_expert_files(torch::nn::Module& module, const std::string& tag_dir, int mp_rank,
                       bool node_local, const checkpoint::FileSaver& save_file);

/// Reads this rank's experts from their files (by global id) into `module_state`, keys renamed
/// to this rank's local ids. CheckpointError naming the file when one is missing or lacks a key.
void add_expert_states(torch::nn::Module& module, const std::string& tag_dir, int mp_rank,
                       checkpoint::TensorDict* module_state);

/// This rank's expert entries: key with the local expert id -> key with the global id (the
/// names of the expert files and of a universal checkpoint's parameter folders). Empty
/// without MoE layers; AutoEP's stacked weights, named alike on every rank, are not listed.
std::map<std::string, std::string> expert_global_names(torch::nn::Module& module);

/// Per MoE layer (named_modules order), its num_experts: the model states' 'num_experts' list,
/// which DeepSpeed's load_checkpoint reads from an MoE checkpoint.
std::vector<int64_t> moe_num_experts(torch::nn::Module& module);

/// How many expp_rank_*_mp_rank_<mp> optimizer files the tag directory holds (the saving
/// ep_size of the largest expert group).
int count_expert_optimizer_files(const std::string& tag_dir, int mp_rank);

}  // namespace deepspeed::runtime
