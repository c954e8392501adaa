// See stage3_checkpoint.h. The inner optimizer's parameters are the sub-groups' fp32 flats in
// sub-group order, so saved parameter index k is saved sub-group k; per-element optimizer
// state (exp_avg, ...) has the flat's layout and is re-laid exactly like the masters.
#include "runtime/zero/stage3_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/comm.h"
#include "deepspeed/optimizers.h"
#include "deepspeed/version.h"
#include "runtime/checkpoint/value_access.h"
#include "runtime/zero/repartition.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

namespace ckpt = checkpoint;
using c10::IValue;
using List = c10::impl::GenericList;
using ckpt::detail::DictReader;

// This engine's sub-groups as slots (names, shapes, shard sizes, offsets).
std::vector<std::vector<Stage3Slot>> own_slots(Stage3ZeroOptimizer& zero) {
  std::vector<std::vector<Stage3Slot>> slots(zero.sub_groups().size());
  for (const auto& info : zero.param_infos()) {
    slots.at(info.sub_group).push_back(
        Stage3Slot{info.name, info.shape, info.shard_numel, info.offset});
  }
  return slots;
}

bool same_slots(const std::vector<Stage3Slot>& a, const std::vector<Stage3Slot>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape ||
        a[i].shard_numel != b[i].shard_numel || a[i].offset != b[i].offset) {
      return false;
    }
  }
  return true;
}

// One rank's optimizer file, the parts a load needs.
struct Zero3File {
  std::string path;
  std::vector<at::Tensor> fp32_flat_groups;
  IValue inner;  // the inner optimizer's state dict
  ckpt::LossScalerState loss_scaler;
  int64_t partition_count = 0;
};

Zero3File read_optim_file(const std::string& tag_dir, int rank, int mp_rank, bool bf16) {
  Zero3File f;
  f.path = ckpt::find_zero_optim_states_file(tag_dir, rank, mp_rank, bf16);
  DictReader top(ckpt::load(f.path), f.path);
  DictReader osd(top.at("optimizer_state_dict"), f.path + ": optimizer_state_dict");
  const int64_t stage = ckpt::detail::as_zero_stage(osd.at("zero_stage"), osd.where("zero_stage"));
  DS_CHECK(stage == 3, CheckpointError, f.path, ": zero_stage is ", stage,
           ", this engine runs stage 3");
  const IValue& pc = osd.at("partition_count");
  if (pc.isInt()) {
    f.partition_count = pc.toInt();
  } else {
    for (const auto& v : ckpt::detail::as_sequence(pc, osd.where("partition_count"))) {
      f.partition_count = std::max(f.partition_count, ckpt::detail::as_int(v, osd.where("partition_count")));
    }
  }
  size_t i = 0;
  for (const auto& t : ckpt::detail::as_sequence(osd.at("fp32_flat_groups"),
                                                  osd.where("fp32_flat_groups"))) {
    f.fp32_flat_groups.push_back(
        ckpt::detail::as_tensor(t, osd.where("fp32_flat_groups") + "[" + std::to_string(i++) + "]")
            .reshape({-1}));
  }
  f.inner = osd.at("optimizer_state_dict");
  if (osd.has_value("loss_scaler")) {
    f.loss_scaler = ckpt::LossScalerState::from_ivalue(osd.at("loss_scaler"), osd.where("loss_scaler"));
  }
  return f;
}

ckpt::ModelStates read_model_states(const std::string& tag_dir, int rank, int mp_rank) {
  const std::string path = tag_dir + "/" + ckpt::zero3_model_states_file_name(rank, mp_rank);
  return ckpt::ModelStates::from_ivalue(ckpt::load(path), path);
}

}  // namespace

void fill_zero3_model_states(Stage3ZeroOptimizer& zero, const torch::nn::Module& module,
                             bool exclude_frozen_parameters, ckpt::ModelStates* states) {
  std::set<std::string> params;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : module.named_parameters()) {
    params.insert(p.key());
    shapes[p.key()] = p.value().sizes().vec();
  }
  // Matches DeepSpeed: a partitioned parameter's state_dict entry is an empty tensor.
  for (auto& item : states->module) {
    if (params.count(item.key())) item.value() = at::empty({0}, item.value().options());
  }
  std::vector<ckpt::ShapeDict> groups(zero.sub_groups().size());
  for (const auto& info : zero.param_infos()) groups.at(info.sub_group).insert(info.name, info.shape);
  states->param_shapes = std::move(groups);
  if (exclude_frozen_parameters) return;
  ckpt::ShapeDict frozen_shapes;
  ckpt::TensorDict fragments;
  for (const auto& [name, shard] : zero.frozen_shards()) {
    frozen_shapes.insert(name, shapes.at(name));
    fragments.insert(name, shard);
  }
  states->frozen_param_shapes = std::move(frozen_shapes);
  states->frozen_param_fragments = std::move(fragments);
}

IValue zero3_optimizer_file(Stage3ZeroOptimizer& zero, torch::optim::Optimizer& optimizer,
                            const ckpt::LossScalerState& scaler, bool python_objects,
                            const nlohmann::json& ds_config) {
  ckpt::Dict osd = ckpt::new_dict();
  osd.insert("zero_stage", int64_t{3});
  osd.insert("loss_scaler", scaler.to_ivalue(python_objects));
  osd.insert("dynamic_loss_scale", scaler.dynamic);
  osd.insert("overflow", false);
  osd.insert("partition_count", static_cast<int64_t>(zero.world_size()));
  osd.insert("optimizer_state_dict", optim::optimizer_state_dict(optimizer));
  List flats(c10::AnyType::get());
  for (auto& sg : zero.sub_groups()) flats.push_back(sg.fp32);
  osd.insert("fp32_flat_groups", flats);
  ckpt::Dict top = ckpt::new_dict();
  top.insert("optimizer_state_dict", osd);
  top.insert("ds_config", ckpt::ivalue_from_json(ds_config));
  top.insert("ds_version", std::string(kDeepSpeedCompatVersion));
  return top;
}

Zero3Restore read_zero3_checkpoint(Stage3ZeroOptimizer& zero, const std::string& tag_dir,
                                   bool bf16, bool want_optimizer_state, int mp_rank) {
  const int rank = zero.rank();
  const int world = zero.world_size();
  Zero3Restore out;
  Zero3File file0 = read_optim_file(tag_dir, 0, mp_rank, bf16);
  out.saved_world = file0.partition_count;
  out.loss_scaler = file0.loss_scaler;
  const int own = rank < out.saved_world ? rank : 0;
  out.model_file = tag_dir + "/" + ckpt::zero3_model_states_file_name(own, mp_rank);
  out.states = read_model_states(tag_dir, own, mp_rank);
  DS_CHECK(out.states.param_shapes.has_value(), CheckpointError, out.model_file,
           ": has no param_shapes, so it is not a ZeRO-3 checkpoint");
  const auto& shapes = *out.states.param_shapes;
  auto& groups = zero.sub_groups();
  const auto slots = own_slots(zero);
  auto frozen = zero.frozen_shards();

  bool same = out.saved_world == world && shapes.size() == groups.size();
  for (size_t g = 0; same && g < groups.size(); ++g) {
    same = same_slots(stage3_slots(shapes[g], world), slots[g]);
  }
  if (same) {
    Zero3File f = rank == 0 ? file0 : read_optim_file(tag_dir, rank, mp_rank, bf16);
    DS_CHECK(f.partition_count == world && f.fp32_flat_groups.size() == groups.size(),
             CheckpointError, f.path, ": partition_count ", f.partition_count, " and ",
             f.fp32_flat_groups.size(), " fp32 flat groups; rank 0's file says ", world, " and ",
             groups.size(), " (files of two saves mixed?)");
    for (size_t g = 0; g < groups.size(); ++g) {
      DS_CHECK(f.fp32_flat_groups[g].numel() == groups[g].numel, CheckpointError, f.path,
               ": fp32_flat_groups[", g, "] has ", f.fp32_flat_groups[g].numel(),
               " elements, this rank's sub-group ", groups[g].numel);
      out.fp32.push_back(f.fp32_flat_groups[g].to(at::kFloat));
    }
    if (want_optimizer_state) out.optimizer_state = f.inner;
    for (const auto& [name, shard] : frozen) {
      const at::Tensor* saved = out.states.frozen_param_fragments
                                    ? out.states.frozen_param_fragments->find(name)
                                    : nullptr;
      DS_CHECK(saved && saved->numel() == shard.numel(), CheckpointError, out.model_file,
               ": no fragment of frozen parameter '", name, "' with ", shard.numel(),
               " elements (part 'frozen_param_fragments')");
      out.frozen.push_back(saved->reshape({-1}));
    }
    return out;
  }

  // Another world size or sub-group layout: every saved rank's files, re-laid by name.
  char mp_suffix[64];  // this model-parallel rank's files only
  std::snprintf(mp_suffix, sizeof mp_suffix, "mp_rank_%02d_optim_states.pt", mp_rank);
  const auto present = ckpt::list_files_with_suffix(tag_dir, mp_suffix);
  DS_CHECK(static_cast<int64_t>(present.size()) == out.saved_world, CheckpointError, tag_dir,
           ": expected ", out.saved_world, " '*_optim_states.pt' files (partition_count) but "
           "found ", present.size(), "; possibly an overwrite of an old checkpoint");
  std::vector<Zero3File> files{file0};
  for (int r = 1; r < out.saved_world; ++r) {
    files.push_back(read_optim_file(tag_dir, r, mp_rank, bf16));
  }
  std::vector<std::vector<Stage3Slot>> saved_slots;
  for (const auto& s : shapes) saved_slots.push_back(stage3_slots(s, out.saved_world));
  const auto flats_of = [&](size_t g, const std::function<at::Tensor(const Zero3File&)>& pick) {
    std::vector<at::Tensor> flats;
    for (const auto& f : files) flats.push_back(pick(f));
    return flats;
  };
  SavedParams masters;
  for (size_t g = 0; g < shapes.size(); ++g) {
    for (const auto& f : files) {
      DS_CHECK(f.fp32_flat_groups.size() == shapes.size(), CheckpointError, f.path, ": ",
               f.fp32_flat_groups.size(), " fp32 flat groups, param_shapes lists ", shapes.size());
    }
    split_stage3_flats(flats_of(g, [&](const Zero3File& f) { return f.fp32_flat_groups[g]; }),
                       saved_slots[g], file0.path, &masters);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    out.fp32.push_back(assemble_stage3_flat(slots[g], groups[g].numel, rank, masters, at::kFloat,
                                            file0.path));
  }

  if (want_optimizer_state) {
    const auto base_of = [](const Zero3File& f) { return f.inner.toGenericDict(); };
    ckpt::Dict base0 = base_of(file0);
    DS_CHECK(base0.contains("param_groups") && base0.contains("state"), CheckpointError,
             file0.path, ": the inner optimizer_state_dict has no param_groups/state");
    auto saved_groups = base0.at("param_groups").toListRef();
    size_t optimizer_groups = 0;
    for (const auto& sg : groups) optimizer_groups = std::max(optimizer_groups, sg.param_group + 1);
    DS_CHECK(saved_groups.size() >= optimizer_groups, CheckpointError, file0.path, ": ",
             saved_groups.size(), " optimizer param groups, this engine has ", optimizer_groups);
    // Per-element state by name, scalars by param group (every sub-group of a group takes the
    // same number of steps).
    std::map<std::string, SavedParams> by_key;
    std::map<std::string, at::ScalarType> dtype_of;
    std::map<size_t, ckpt::Dict> scalars_of_group;
    ckpt::Dict saved_state = base0.at("state").toGenericDict();
    for (size_t pg = 0; pg < saved_groups.size(); ++pg) {
      for (const auto& id : saved_groups[pg].toGenericDict().at("params").toListRef()) {
        const int64_t k = id.toInt();
        if (!saved_state.contains(k)) continue;
        DS_CHECK(k >= 0 && static_cast<size_t>(k) < shapes.size(), CheckpointError, file0.path,
                 ": optimizer state for parameter ", k, " but only ", shapes.size(),
                 " sub-groups");
        const int64_t flat_numel = file0.fp32_flat_groups[k].numel();
        ckpt::Dict scalars = ckpt::new_dict();
        for (const auto& item : saved_state.at(k).toGenericDict()) {
          const std::string key = item.key().toStringRef();
          const IValue& v = item.value();
          if (!(v.isTensor() && v.toTensor().dim() == 1 && v.toTensor().numel() == flat_numel)) {
            scalars.insert(key, v);
            continue;
          }
          dtype_of[key] = v.toTensor().scalar_type();
          split_stage3_flats(flats_of(k, [&](const Zero3File& f) {
                               return base_of(f).at("state").toGenericDict().at(k)
                                   .toGenericDict().at(key).toTensor();
                             }),
                             saved_slots[k], file0.path, &by_key[key]);
        }
        if (!scalars_of_group.count(pg)) scalars_of_group.emplace(pg, scalars);
      }
    }
    ckpt::Dict state = ckpt::new_dict();
    List new_groups(c10::AnyType::get());
    for (size_t pg = 0; pg < saved_groups.size(); ++pg) {
      ckpt::Dict group = saved_groups[pg].toGenericDict().copy();
      List ids(c10::AnyType::get());
      for (size_t g = 0; g < groups.size(); ++g) {
        if (groups[g].param_group == pg) ids.push_back(static_cast<int64_t>(g));
      }
      group.insert_or_assign("params", ids);
      new_groups.push_back(group);
    }
    for (size_t g = 0; g < groups.size() && !by_key.empty(); ++g) {
      ckpt::Dict entry = ckpt::new_dict();
      auto scalars = scalars_of_group.find(groups[g].param_group);
      if (scalars != scalars_of_group.end()) {
        for (const auto& item : scalars->second) entry.insert(item.key(), item.value());
      }
      for (const auto& [key, saved] : by_key) {
        entry.insert(key, assemble_stage3_flat(slots[g], groups[g].numel, rank, saved,
                                               dtype_of[key], file0.path));
      }
      state.insert(static_cast<int64_t>(g), entry);
    }
    ckpt::Dict base = ckpt::new_dict();
    base.insert("state", state);
    base.insert("param_groups", new_groups);
    out.optimizer_state = base;
  }

  // Frozen parameters: every saved rank's fragment, concatenated, cut for this rank.
  if (!frozen.empty()) {
    std::vector<ckpt::ModelStates> all;
    for (int r = 0; r < out.saved_world; ++r) all.push_back(read_model_states(tag_dir, r, mp_rank));
    for (const auto& [name, shard] : frozen) {
      std::vector<at::Tensor> pieces;
      for (int r = 0; r < out.saved_world; ++r) {
        const at::Tensor* t = all[r].frozen_param_fragments ? all[r].frozen_param_fragments->find(name)
                                                            : nullptr;
        DS_CHECK(t != nullptr, CheckpointError, tag_dir, "/",
                 ckpt::zero3_model_states_file_name(r, mp_rank), ": no fragment of frozen parameter '",
                 name, "' (part 'frozen_param_fragments')");
        pieces.push_back(t->reshape({-1}));
      }
      at::Tensor full = at::cat(pieces);
      const auto* shape = out.states.frozen_param_shapes ? out.states.frozen_param_shapes->find(name)
                                                         : nullptr;
      DS_CHECK(shape != nullptr, CheckpointError, out.model_file, ": frozen parameter '", name,
               "' has no entry in frozen_param_shapes");
      int64_t numel = 1;
      for (int64_t d : *shape) numel *= d;
      full = full.narrow(0, 0, std::min(numel, full.numel()));  // drop the last shard's padding
      const int64_t begin = rank * shard.numel();
      at::Tensor mine = at::zeros({shard.numel()}, full.options());
      const int64_t n = std::clamp<int64_t>(full.numel() - begin, 0, shard.numel());
      if (n > 0) mine.narrow(0, 0, n).copy_(full.narrow(0, begin, n));
      out.frozen.push_back(mine);
    }
  }
  return out;
}

void apply_zero3_restore(Stage3ZeroOptimizer& zero, const Zero3Restore& restore) {
  at::NoGradGuard no_grad;
  auto& groups = zero.sub_groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].fp32.copy_(restore.fp32[g]);
  auto frozen = zero.frozen_shards();
  for (size_t i = 0; i < frozen.size() && i < restore.frozen.size(); ++i) {
    frozen[i].second.copy_(restore.frozen[i]);
  }
  zero.masters_to_params();
}

}  // namespace deepspeed::runtime
