// A ZeRO-1/2 checkpoint built from known tensors with the checkpoint library's own builders, laid
// out the way DeepSpeed lays it out (reference §7.2): per param group a flat fp32 buffer padded to
// a multiple of 2*W, rank r's slice [r*P, (r+1)*P) saved with its padding stripped. Shared by the
// unit tests and the Python end-to-end test.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"

namespace deepspeed::testing {

struct SyntheticZeroCheckpoint {
  int world_size = 2;
  int zero_stage = 2;
  bool bf16 = false;  // module weights in bf16 and the bf16_ optimizer file prefix
  /// Trainable parameters per optimizer param group, in flattening order (fp32).
  std::vector<checkpoint::TensorDict> groups;
  checkpoint::TensorDict buffers;
  checkpoint::TensorDict frozen;  // full tensors (ZeRO-2 frozen_param_fragments)
  std::vector<std::pair<std::string, std::string>> shared_params;  // alias -> source
};

/// Rank r's part of a flat group of `numel` elements: [begin, begin + size) of the unpadded
/// buffer, and the padding its slice holds.
struct RankSlice {
  int64_t begin = 0, size = 0, padding = 0;
};
inline RankSlice rank_slice(int64_t numel, int world_size, int rank) {
  const int64_t unit = 2 * world_size;
  int64_t padded = (numel + unit - 1) / unit * unit;
  if (padded == 0) padded = unit;
  const int64_t part = padded / world_size;
  const int64_t lo = rank * part, hi = lo + part;
  RankSlice s;
  s.begin = std::min(lo, numel);
  s.size = std::max<int64_t>(0, std::min(hi, numel) - lo);
  s.padding = part - s.size;
  return s;
}

/// The optimizer-states file of `rank`.
inline checkpoint::ZeroOptimizerFile synthetic_optimizer_file(const SyntheticZeroCheckpoint& c,
                                                             int rank) {
  checkpoint::ZeroOptimizerFile file;
  auto& z = file.optimizer_state_dict;
  z.zero_stage = c.zero_stage;
  z.ds_version = "0.19.6";
  z.loss_scaler.dynamic = !c.bf16;
  z.loss_scaler.cur_scale = c.bf16 ? 1.0 : 65536.0;  // DeepSpeed's initial_scale_power 16
  z.dynamic_loss_scale = !c.bf16;
  z.clip_grad = 1.0;
  checkpoint::Dict state = checkpoint::new_dict();
  c10::impl::GenericList param_groups(c10::AnyType::get());
  for (size_t g = 0; g < c.groups.size(); ++g) {
    std::vector<at::Tensor> flat;
    torch::OrderedDict<std::string, checkpoint::FragmentAddress> mapping;
    int64_t offset = 0;
    for (const auto& item : c.groups[g]) flat.push_back(item.value().reshape(-1));
    const at::Tensor full = at::cat(flat);
    const RankSlice s = rank_slice(full.numel(), c.world_size, rank);
    for (const auto& item : c.groups[g]) {
      const int64_t n = item.value().numel();
      const int64_t a = std::max(offset, s.begin), b = std::min(offset + n, s.begin + s.size);
      if (a < b) mapping.insert(item.key(), checkpoint::FragmentAddress{b - a, a - s.begin});
      offset += n;
    }
    z.single_partition_of_fp32_groups.push_back(full.narrow(0, s.begin, s.size).clone());
    z.group_paddings.push_back(s.padding);
    z.partition_count.push_back(c.world_size);
    z.param_slice_mappings.push_back(std::move(mapping));
    checkpoint::Dict per_param = checkpoint::new_dict();
    per_param.insert("step", int64_t{3});
    per_param.insert("exp_avg", at::full({s.size + s.padding}, 0.5 + rank));
    state.insert(static_cast<int64_t>(g), per_param);
    checkpoint::Dict group = checkpoint::new_dict();
    group.insert("lr", 1e-3);
    c10::impl::GenericList params(c10::AnyType::get());
    params.push_back(static_cast<int64_t>(g));
    group.insert("params", params);
    param_groups.push_back(group);
  }
  checkpoint::Dict base = checkpoint::new_dict();
  base.insert("state", state);
  base.insert("param_groups", param_groups);
  z.base_optimizer_state = base;
  file.ds_config = {{"train_batch_size", 8}, {"zero_optimization", {{"stage", c.zero_stage}}}};
  file.ds_version = "0.19.6";
  return file;
}

inline checkpoint::ModelStates synthetic_model_states(const SyntheticZeroCheckpoint& c) {
  checkpoint::ModelStates m;
  const auto module_dtype = c.bf16 ? at::kBFloat16 : at::kFloat;
  m.param_shapes.emplace();
  for (const auto& group : c.groups) {
    checkpoint::ShapeDict shapes;
    for (const auto& item : group) {
      m.module.insert(item.key(), item.value().to(module_dtype));
      shapes.insert(item.key(), item.value().sizes().vec());
    }
    m.param_shapes->push_back(std::move(shapes));
  }
  m.frozen_param_shapes.emplace();
  m.frozen_param_fragments.emplace();
  for (const auto& item : c.frozen) {
    m.module.insert(item.key(), item.value());
    m.frozen_param_shapes->insert(item.key(), item.value().sizes().vec());
    m.frozen_param_fragments->insert(item.key(), item.value());
  }
  for (const auto& item : c.buffers) {
    m.module.insert(item.key(), item.value());
    m.buffer_names.push_back(item.key());
  }
  m.shared_params = c.shared_params;
  m.global_steps = 7;
  m.global_samples = 56;
  m.dp_world_size = c.world_size;
  m.ds_config = {{"train_batch_size", 8}, {"zero_optimization", {{"stage", c.zero_stage}}}};
  m.ds_version = "0.19.6";
  return m;
}

/// Writes <dir>/<tag>/ (model states + one optimizer file per rank, in DeepSpeed's elastic
/// layout when `elastic`) and <dir>/latest.
inline void write_synthetic_zero_checkpoint(const SyntheticZeroCheckpoint& c,
                                            const std::string& dir, const std::string& tag,
                                            bool elastic = false) {
  const std::string tag_dir = checkpoint::tag_directory(dir, tag);
  checkpoint::create_directories(tag_dir);
  checkpoint::save(synthetic_model_states(c).to_ivalue(),
                   tag_dir + "/" + checkpoint::model_states_file_name(0));
  for (int r = 0; r < c.world_size; ++r) {
    auto file = synthetic_optimizer_file(c, r);
    if (elastic) file.optimizer_state_dict.make_elastic(/*step_as_tensor=*/false);
    checkpoint::save(file.to_ivalue(),
                     tag_dir + "/" + checkpoint::zero_optim_states_file_name(r, 0, c.bf16));
  }
  checkpoint::commit_checkpoint(dir, tag, /*is_global_rank0=*/true, /*save_latest=*/true, [] {});
}

/// Known values 0.001*i + offset, shaped.
inline at::Tensor known_tensor(std::vector<int64_t> shape, double offset) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return (at::arange(n, at::kDouble) * 0.001 + offset).to(at::kFloat).reshape(shape);
}

/// A two-group model with sizes that leave padding on the last ranks for W = 2 and 3, frozen
/// parameters, buffers and a tied weight.
inline SyntheticZeroCheckpoint example_checkpoint(int world_size) {
  SyntheticZeroCheckpoint c;
  c.world_size = world_size;
  checkpoint::TensorDict g0, g1;
  g0.insert("embed.weight", known_tensor({7, 5}, 1.0));
  g0.insert("block.0.weight", known_tensor({5, 5}, 2.0));
  g0.insert("block.0.bias", known_tensor({5}, 3.0));
  g1.insert("norm.weight", known_tensor({5}, 4.0));
  g1.insert("head.bias", known_tensor({3}, 5.0));
  c.groups = {g0, g1};
  c.frozen.insert("frozen.weight", known_tensor({2, 3}, 6.0));
  c.buffers.insert("norm.running_mean", known_tensor({5}, 7.0).to(at::kHalf));
  c.shared_params = {{"head.weight", "embed.weight"}};
  return c;
}

}  // namespace deepspeed::testing
