// ds_to_universal's reader for ZeRO-3 checkpoints (see universal_source.h). Every data-parallel
// rank holds, per sub-group, one flat of ceil(numel / W) elements of each of its parameters
// (fp32_flat_groups) and the inner optimizer's state over that flat; a parameter is its W
// shards joined in rank order with the last one's padding dropped (zero_to_fp32's stage-3 walk).
// AutoEP's expert sub-groups are cut for each expert-parallel rank's expert-data-parallel group
// instead: each such group's shards make that rank's rows, which join into every expert.
// Frozen parameters come from each rank's frozen_param_fragments the same way (AutoEP's frozen
// experts from each expert-data-parallel group's fragments, as their trainable ones).
#include "runtime/checkpoint/universal_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/errors.h"
#include "runtime/checkpoint/value_access.h"
#include "util/check.h"

namespace deepspeed::checkpoint::detail {
namespace {

using c10::IValue;

// One data-parallel rank's optimizer file, the parts the conversion needs.
struct Zero3Rank {
  std::string path;
  IValue raw;  // the whole file
  int64_t partition_count = 0;
  std::vector<at::Tensor> flats;  // fp32_flat_groups, one per sub-group
  Dict inner = new_dict();        // the inner optimizer's {state, param_groups}
};

Zero3Rank read_rank(const std::string& path) {
  Zero3Rank r;
  r.path = path;
  r.raw = load(path);
  DictReader top(r.raw, path);
  DictReader osd(top.at("optimizer_state_dict"), path + ": optimizer_state_dict");
  const int64_t stage = as_zero_stage(osd.at("zero_stage"), osd.where("zero_stage"));
  DS_CHECK(stage == 3, CheckpointError, path, ": zero_stage is ", stage,
           " in a folder of ZeRO-3 model-states files (files of two saves mixed?)");
  for (int64_t n : as_ints(osd.at("partition_count"), osd.where("partition_count"))) {
    r.partition_count = std::max(r.partition_count, n);
  }
  r.flats = as_flat_tensors(osd.at("fp32_flat_groups"), osd.where("fp32_flat_groups"));
  DictReader inner(osd.at("optimizer_state_dict"), osd.where("optimizer_state_dict"));
  DS_CHECK(inner.has("state") && inner.has("param_groups"), CheckpointError, inner.where(),
           ": has no state/param_groups");
  r.inner = inner.dict();
  return r;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The module of the copied model-states file: every parameter (a 0-element placeholder under
// ZeRO-3, tied aliases included) gets its full tensor in the placeholder's dtype, so the file
// holds a complete module as a ZeRO 1/2 one does.
void fill_module(Dict module, const runtime::SavedParams& fp32,
                 const std::vector<std::pair<std::string, std::string>>& shared) {
  std::map<std::string, std::string> source_of(shared.begin(), shared.end());
  for (const auto& item : module.copy()) {
    const std::string name = item.key().toStringRef();
    const auto alias = source_of.find(name);
    const auto it = fp32.find(alias == source_of.end() ? name : alias->second);
    if (it == fp32.end() || !item.value().isTensor()) continue;  // a buffer
    const at::Tensor placeholder = item.value().toTensor();
    module.insert_or_assign(item.key(), it->second.flat.view(it->second.shape)
                                            .to(placeholder.scalar_type()));
  }
}

}  // namespace

UniversalSource read_zero3_source(const std::string& tag_dir, int64_t mp_rank,
                                  const MoeExperts* moe) {
  const int mp = static_cast<int>(mp_rank);
  const std::string model0_path = tag_dir + "/" + zero3_model_states_file_name(0, mp);
  const IValue raw0 = load(model0_path);
  const ModelStates states0 = ModelStates::from_ivalue(raw0, model0_path);
  DS_CHECK(states0.param_shapes.has_value(), CheckpointError, model0_path,
           ": has no param_shapes, so it was not written by ZeRO-3");
  const auto& shapes = *states0.param_shapes;

  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "mp_rank_%02d_optim_states.pt", mp);
  const auto files = list_files_with_suffix(tag_dir, suffix);
  DS_CHECK(!files.empty(), CheckpointError, tag_dir, ": no '*_", suffix, "' files beside ",
           model0_path, " (a ZeRO-3 checkpoint has one per data-parallel rank)");
  std::vector<Zero3Rank> ranks;
  for (const auto& f : files) ranks.push_back(read_rank(f));
  const int64_t world = ranks[0].partition_count;
  DS_CHECK(static_cast<int64_t>(ranks.size()) == world, CheckpointError, tag_dir, ": ",
           ranks.size(), " '*_", suffix, "' files but partition_count says ", world);
  for (const auto& r : ranks) {
    DS_CHECK(r.partition_count == world && r.flats.size() == shapes.size(), CheckpointError,
             r.path, ": partition_count ", r.partition_count, " and ", r.flats.size(),
             " fp32 flat groups; ", model0_path, " lists ", shapes.size(),
             " sub-groups and rank 0's file partition_count ", world,
             " (files of two saves mixed?)");
  }

  UniversalSource out;
  // Matches DeepSpeed: rank 0's optimizer_state_dict less its fp32 shards.
  out.optimizer_state = global_optimizer_state(ranks[0].raw, {"fp32_flat_groups"}, ranks[0].path);
  MoeExperts::StackedPieces stacked;  // AutoEP's weights, by expert-parallel rank
  for (size_t k = 0; k < shapes.size(); ++k) {
    // AutoEP's expert sub-groups (Note [Expert partitions]) are cut for each expert-parallel
    // rank's expert-data-parallel group: one set of holders per expert-parallel rank.
    const bool experts = moe != nullptr && !shapes[k].is_empty() &&
                         moe->is_stacked(shapes[k].begin()->key());
    std::vector<std::vector<int>> all_holders;
    if (experts) {
      all_holders = moe->holders(world / moe->stacked_ep_size(shapes[k].begin()->key()));
    } else {
      all_holders.emplace_back();
      for (int r = 0; r < static_cast<int>(world); ++r) all_holders.back().push_back(r);
    }
    for (const auto& holders : all_holders) {
      const auto slots = runtime::stage3_slots(shapes[k], static_cast<int64_t>(holders.size()));
      std::map<std::string, runtime::SavedParams> group;  // by state
      std::optional<at::Tensor> step;
      std::vector<at::Tensor> masters;
      for (int h : holders) masters.push_back(ranks[static_cast<size_t>(h)].flats[k]);
      runtime::split_stage3_flats(masters, slots, ranks[0].path, &group["fp32"]);
      // The inner optimizer's parameter k is sub-group k: its per-element states have the
      // flat's layout, its step is every parameter's step.
      const IValue key(static_cast<int64_t>(k));
      std::map<std::string, std::vector<at::Tensor>> per_element;
      for (int h : holders) {
        const Zero3Rank& r = ranks[static_cast<size_t>(h)];
        const Dict state = r.inner.at("state").toGenericDict();
        if (!state.contains(key)) continue;  // saved before the first step
        for (const auto& e : state.at(key).toGenericDict()) {
          const std::string name = e.key().toStringRef();
          const IValue& v = e.value();
          if (name != "step" && v.isTensor() && v.toTensor().numel() == r.flats[k].numel()) {
            per_element[name].push_back(v.toTensor().reshape(-1));
          } else if (name == "step" && !step) {
            step = as_step_tensor(v, r.path + ": state[" + std::to_string(k) + "]");
          }
        }
      }
      for (auto& [name, pieces] : per_element) {
        DS_CHECK(pieces.size() == holders.size(), CheckpointError, tag_dir, ": optimizer state '",
                 name, "' of sub-group ", k, " is missing on some data-parallel ranks");
        runtime::split_stage3_flats(pieces, slots, ranks[0].path, &group[name]);
      }
      for (const auto& s : slots) {
        if (experts) {
          const int64_t ep_rank = moe->stacked_ep_rank(s.name, holders.front());
          if (!stacked.count(s.name)) out.order.push_back(s.name);
          for (auto& [state, params] : group) {
            stacked[s.name][state].emplace(ep_rank, params.at(s.name));
          }
        } else {
          out.order.push_back(s.name);
          for (auto& [state, params] : group) out.states[state][s.name] = params.at(s.name);
        }
        if (step) out.step[s.name] = *step;
      }
    }
  }
  if (moe) moe->join_stacked(stacked, tag_dir, &out);

  for (int64_t r = 0; r < world; ++r) {
    const std::string path = tag_dir + "/" + zero3_model_states_file_name(static_cast<int>(r), mp);
    DS_CHECK(r == 0 || file_exists(path), CheckpointError, tag_dir, ": ", ranks.size(),
             " optimizer files but no ", path);
    out.copy_files.push_back(path);
  }
  // Frozen parameters: each rank's fragment, joined.
  if (states0.frozen_param_shapes && !states0.frozen_param_shapes->is_empty()) {
    std::vector<ModelStates> models{states0};
    for (int64_t r = 1; r < world; ++r) {
      const std::string& path = out.copy_files[static_cast<size_t>(r)];
      models.push_back(ModelStates::from_ivalue(load(path), path));
    }
    MoeExperts::StackedPieces frozen_stacked;  // AutoEP's frozen experts, by ep rank
    for (const auto& item : *states0.frozen_param_shapes) {
      const std::string& name = item.key();
      const bool experts = moe != nullptr && moe->is_stacked(name);
      // An expert weight's shape is its expert-parallel rank's rows (Note [Expert partitions]).
      std::vector<std::vector<int>> all_holders;
      if (experts) {
        all_holders = moe->holders(world / moe->stacked_ep_size(name));
      } else {
        all_holders.emplace_back();
        for (int r = 0; r < static_cast<int>(world); ++r) all_holders.back().push_back(r);
      }
      at::ScalarType saved_dtype = at::kFloat;
      for (const auto& holders : all_holders) {
        std::vector<at::Tensor> pieces;
        for (int r : holders) {
          const auto& m = models[static_cast<size_t>(r)];
          const at::Tensor* t =
              m.frozen_param_fragments ? m.frozen_param_fragments->find(name) : nullptr;
          DS_CHECK(t != nullptr, CheckpointError, tag_dir, "/",
                   zero3_model_states_file_name(r, mp), ": no fragment of frozen parameter '",
                   name, "' (part 'frozen_param_fragments')");
          pieces.push_back(t->reshape(-1).to(at::kFloat));
          saved_dtype = t->scalar_type();
        }
        const at::Tensor full = at::cat(pieces);
        const int64_t n = c10::multiply_integers(item.value());
        DS_CHECK(full.numel() >= n, CheckpointError, model0_path, ": frozen parameter '", name,
                 "' has ", full.numel(), " elements over ", holders.size(), " ranks, needs ", n);
        const runtime::SavedParam param{full.narrow(0, 0, n), item.value()};
        if (experts) {
          frozen_stacked[name]["fp32"].emplace(moe->stacked_ep_rank(name, holders.front()), param);
        } else {
          out.states["fp32"][name] = param;
        }
      }
      out.order.push_back(name);
      out.frozen.emplace(name, saved_dtype);
    }
    if (!frozen_stacked.empty()) moe->join_stacked(frozen_stacked, tag_dir, &out);
  }

  Dict model_states = raw0.toGenericDict().copy();
  const std::vector<std::pair<std::string, std::string>> shared =
      states0.shared_params.value_or(std::vector<std::pair<std::string, std::string>>{});
  Dict module = model_states.at("module").toGenericDict().copy();
  fill_module(module, out.states.at("fp32"), shared);
  model_states.insert_or_assign("module", module);
  // The rank-0 fragments would be read as full tensors by a ZeRO 1/2 loader.
  model_states.insert_or_assign("frozen_param_fragments", IValue());
  out.model_states = model_states;
  return out;
}

}  // namespace deepspeed::checkpoint::detail
