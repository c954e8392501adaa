// Stage3ZeroOptimizer's checkpoints (see stage3.h; reference §6.1-6.3): what each rank writes,
// and how a checkpoint is read into a ZeroLoadPlan and applied. The inner optimizer's parameters
// are the sub-groups' fp32 flats in sub-group order, so saved parameter index k is saved
// sub-group k; per-element optimizer state (exp_avg, ...) has the flat's layout and is re-laid
// exactly like the masters (repartition_zero_state). zero_to_fp32 consolidates these files.
#include "runtime/zero/stage3.h"

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
#include "runtime/checkpoint/autoep_layers_metadata.h"
#include "runtime/checkpoint/moe_checkpoint.h"
#include "runtime/checkpoint/value_access.h"
#include "runtime/zero/repartition.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

namespace ckpt = checkpoint;
using c10::IValue;
using List = c10::impl::GenericList;
using ckpt::detail::DictReader;

const IValue* client_value(const ckpt::ModelStates& states, const std::string& key) {
  for (const auto& [k, v] : states.client_state) {
    if (k == key) return &v;
  }
  return nullptr;
}

// This engine's sub-groups as slots (names, shapes, shard sizes, offsets).
std::vector<std::vector<Stage3Slot>> own_slots(Stage3ZeroOptimizer& zero) {
  std::vector<std::vector<Stage3Slot>> slots(zero.sub_groups().size());
  for (const auto& info : zero.param_infos()) {
    slots.at(info.sub_group).push_back(
        Stage3Slot{info.name, info.shape, info.shard_numel, info.offset});
  }
  return slots;
}

// `names`: the parameters' names must agree too. Without load_module_strict they need not:
// DeepSpeed itself restores the shards by position, whatever its module calls them (its AutoEP
// layer names the gate moe.router.gate where a C++ TokenChoiceMoE says moe.gate).
bool same_slots(const std::vector<Stage3Slot>& a, const std::vector<Stage3Slot>& b,
                bool names = true) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if ((names && a[i].name != b[i].name) || a[i].shape != b[i].shape ||
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
  IValue partition_groups;  // DeepSpeed's ds_zero_partition_groups (AutoEP), else None
};

// DeepSpeed's ds_zero_partition_groups, written when some sub-group holds AutoEP's experts
// (Note [Expert partitions]): per sub-group, the group it is cut for, this rank's place in it
// and which kind of parameters it holds. DeepSpeed loads such a checkpoint only where its own
// metadata is the same.
nlohmann::json partition_groups_metadata(Stage3ZeroOptimizer& zero) {
  nlohmann::json out = nlohmann::json::array();
  const auto& groups = zero.sub_groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    const comm::Group& g = zero.partition_group(groups[i].partition);
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < g.size(); ++r) ranks.push_back(g.global_rank(r));
    const bool expert = groups[i].partition != 0;
    out.push_back({{"sub_group", i},
                   {"partition_count", g.size()},
                   {"partition_rank", g.rank()},
                   {"partition_ranks", ranks},
                   {"families", {expert ? "autoep_expert" : "replicated"}},
                   {"group_names", {expert ? zero.expert_group_name() : "replicated"}}});
  }
  return out;
}

Zero3File read_optim_file(const std::string& tag_dir, int rank, int mp_rank, bool bf16) {
  Zero3File f;
  f.path = ckpt::find_zero_optim_states_file(tag_dir, rank, mp_rank, bf16);
  DictReader top(ckpt::load(f.path), f.path);
  DictReader osd(top.at("optimizer_state_dict"), f.path + ": optimizer_state_dict");
  const int64_t stage = ckpt::detail::as_zero_stage(osd.at("zero_stage"), osd.where("zero_stage"));
  DS_CHECK(stage == 3, CheckpointError, f.path, ": zero_stage is ", stage,
           ", this engine runs stage 3");
  for (int64_t n : ckpt::detail::as_ints(osd.at("partition_count"), osd.where("partition_count"))) {
    f.partition_count = std::max(f.partition_count, n);
  }
  f.fp32_flat_groups =
      ckpt::detail::as_flat_tensors(osd.at("fp32_flat_groups"), osd.where("fp32_flat_groups"));
  f.inner = osd.at("optimizer_state_dict");
  if (osd.has_value("ds_zero_partition_groups")) {
    f.partition_groups = osd.at("ds_zero_partition_groups");
  }
  if (osd.has_value("loss_scaler")) {
    f.loss_scaler = ckpt::LossScalerState::from_ivalue(osd.at("loss_scaler"), osd.where("loss_scaler"));
  }
  return f;
}

ckpt::ModelStates read_model_states(const std::string& tag_dir, int rank, int mp_rank) {
  const std::string path = tag_dir + "/" + ckpt::zero3_model_states_file_name(rank, mp_rank);
  return ckpt::ModelStates::from_ivalue(ckpt::load(path), path);
}

// Another world size or sub-group layout: every saved rank's files, re-laid by name.
void read_other_layout(Stage3ZeroOptimizer& zero, const ZeroCheckpointContext& ctx,
                       const Zero3File& file0, ZeroLoadPlan* plan) {
  const std::string& tag_dir = ctx.tag_dir;
  const int mp_rank = ctx.mp_rank;
  const int rank = zero.rank();
  const int64_t saved_world = file0.partition_count;
  const auto& shapes = *plan->states.param_shapes;
  auto& groups = zero.sub_groups();
  const auto slots = own_slots(zero);
  const auto frozen = zero.frozen_param_infos();

  char mp_suffix[64];  // this model-parallel rank's files only
  std::snprintf(mp_suffix, sizeof mp_suffix, "mp_rank_%02d_optim_states.pt", mp_rank);
  const auto present = ckpt::list_files_with_suffix(tag_dir, mp_suffix);
  DS_CHECK(static_cast<int64_t>(present.size()) == saved_world, CheckpointError, tag_dir,
           ": expected ", saved_world, " '*_optim_states.pt' files (partition_count) but "
           "found ", present.size(), "; possibly an overwrite of an old checkpoint");
  std::vector<Zero3File> files{file0};
  for (int r = 1; r < saved_world; ++r) {
    files.push_back(read_optim_file(tag_dir, r, mp_rank, ctx.config->bf16.enabled));
  }
  SavedZeroRanks saved;
  saved.source = file0.path;
  for (const auto& f : files) {
    DS_CHECK(f.fp32_flat_groups.size() == shapes.size(), CheckpointError, f.path, ": ",
             f.fp32_flat_groups.size(), " fp32 flat groups, param_shapes lists ", shapes.size());
    saved.masters.push_back(f.fp32_flat_groups);
  }
  if (ctx.want_optimizer) {
    ckpt::Dict base0 = file0.inner.toGenericDict();
    DS_CHECK(base0.contains("param_groups") && base0.contains("state"), CheckpointError,
             file0.path, ": the inner optimizer_state_dict has no param_groups/state");
    const size_t saved_groups = base0.at("param_groups").toListRef().size();
    size_t optimizer_groups = 0;
    for (const auto& sg : groups) optimizer_groups = std::max(optimizer_groups, sg.param_group + 1);
    DS_CHECK(saved_groups >= optimizer_groups, CheckpointError, file0.path, ": ", saved_groups,
             " optimizer param groups, this engine has ", optimizer_groups);
    for (const auto& f : files) saved.optimizer_states.push_back(f.inner);
    // Per-element state has the layout of the saved flat (every sub-group of a group takes the
    // same number of steps, so scalars come from the group's first sub-group).
    for (const auto& flat : file0.fp32_flat_groups) saved.state_numel.push_back(flat.numel());
  }
  std::vector<std::vector<Stage3Slot>> saved_slots;
  for (const auto& s : shapes) saved_slots.push_back(stage3_slots(s, saved_world));
  RepartitionLayout layout;
  layout.split = [&](size_t k, const std::vector<at::Tensor>& per_rank, SavedParams* out) {
    split_stage3_flats(per_rank, saved_slots[k], file0.path, out);
  };
  layout.assemble = [&](size_t g, const SavedParams& params, at::ScalarType dtype) {
    return assemble_stage3_flat(slots[g], groups[g].numel, rank, params, dtype, file0.path);
  };
  layout.saved_flat_of = [](size_t /*pg*/, int64_t id) { return static_cast<size_t>(id); };
  layout.own_flats = groups.size();
  for (const auto& sg : groups) layout.own_param_group.push_back(sg.param_group);
  RepartitionedZeroState re = repartition_zero_state(saved, layout);
  plan->masters = std::move(re.masters);
  plan->optimizer_state = re.optimizer_state;

  // Frozen parameters: every saved rank's fragment, concatenated, cut for this rank.
  if (!frozen.empty()) {
    std::vector<ckpt::ModelStates> all;
    for (int r = 0; r < saved_world; ++r) all.push_back(read_model_states(tag_dir, r, mp_rank));
    for (const auto& info : frozen) {
      const std::string& name = info.name;
      std::vector<at::Tensor> pieces;
      for (int r = 0; r < saved_world; ++r) {
        const at::Tensor* t = all[r].frozen_param_fragments ? all[r].frozen_param_fragments->find(name)
                                                            : nullptr;
        DS_CHECK(t != nullptr, CheckpointError, tag_dir, "/",
                 ckpt::zero3_model_states_file_name(r, mp_rank), ": no fragment of frozen parameter '",
                 name, "' (part 'frozen_param_fragments')");
        pieces.push_back(t->reshape({-1}));
      }
      at::Tensor full = at::cat(pieces);
      const auto* shape = plan->states.frozen_param_shapes
                              ? plan->states.frozen_param_shapes->find(name)
                              : nullptr;
      DS_CHECK(shape != nullptr, CheckpointError, plan->model_file, ": frozen parameter '", name,
               "' has no entry in frozen_param_shapes");
      int64_t numel = 1;
      for (int64_t d : *shape) numel *= d;
      full = full.narrow(0, 0, std::min(numel, full.numel()));  // drop the last shard's padding
      const int64_t begin = rank * info.shard_numel;
      at::Tensor mine = at::zeros({info.shard_numel}, full.options());
      const int64_t n = std::clamp<int64_t>(full.numel() - begin, 0, info.shard_numel);
      if (n > 0) mine.narrow(0, 0, n).copy_(full.narrow(0, begin, n));
      plan->frozen.push_back(mine);
    }
  }
}

}  // namespace

std::string Stage3ZeroOptimizer::model_states_file_name(bool /*writes_replicated*/,
                                                         int mp_rank) const {
  // Every rank writes its own: its frozen shards, placeholders for the partitioned parameters.
  // Named by partition rank: under MiCS the first shard group's ranks write zero_pp_rank_0..S-1.
  if (!writes_checkpoint()) return {};
  return ckpt::zero3_model_states_file_name(rank(), mp_rank);
}

void Stage3ZeroOptimizer::add_model_states(const ZeroCheckpointContext& ctx,
                                           ckpt::ModelStates* states) {
  states->shared_params = ctx.shared_params;
  std::set<std::string> params;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : ctx.module->named_parameters()) {
    params.insert(p.key());
    shapes[p.key()] = p.value().sizes().vec();
  }
  // Matches DeepSpeed: a partitioned parameter's state_dict entry is an empty tensor.
  for (auto& item : states->module) {
    if (params.count(item.key())) item.value() = at::empty({0}, item.value().options());
  }
  if (has_expert_partition()) {
    // Matches DeepSpeed's _save_moe_checkpoint under ZeRO-3 with AutoEP: no expert entries in
    // the module (the experts are in the optimizer shards), the MoE keys beside it.
    states->module = without_expert_states(*ctx.module, states->module);
    c10::List<int64_t> counts;
    for (int64_t n : moe_num_experts(*ctx.module)) counts.push_back(n);
    states->client_state.emplace_back("num_experts", IValue(counts));
    const auto autoep = autoep_layers_metadata(*ctx.module, /*zero3_partitioned=*/true);
    states->client_state.emplace_back(kAutoEPLayersKey, ckpt::ivalue_from_json(autoep));
    states->client_state.emplace_back(kUniversalInfoKey, autoep_universal_checkpoint_info(autoep));
  }
  std::vector<ckpt::ShapeDict> groups(sub_groups().size());
  for (const auto& info : param_infos()) groups.at(info.sub_group).insert(info.name, info.shape);
  states->param_shapes = std::move(groups);
  if (ctx.exclude_frozen_parameters) return;
  ckpt::ShapeDict frozen_shapes;
  ckpt::TensorDict fragments;
  for (const auto& [name, shard] : frozen_shards()) {
    frozen_shapes.insert(name, shapes.at(name));
    fragments.insert(name, shard);
  }
  states->frozen_param_shapes = std::move(frozen_shapes);
  states->frozen_param_fragments = std::move(fragments);
}

// {"optimizer_state_dict": {zero_stage: 3, loss_scaler, dynamic_loss_scale, overflow,
// partition_count, optimizer_state_dict, fp32_flat_groups}, "ds_config", "ds_version"}.
std::optional<std::pair<std::string, IValue>> Stage3ZeroOptimizer::optimizer_states_file(
    const ZeroCheckpointContext& ctx) {
  if (!writes_checkpoint()) return std::nullopt;
  const ckpt::LossScalerState& scaler = ctx.loss_scaler_state;
  ckpt::Dict osd = ckpt::new_dict();
  osd.insert("zero_stage", int64_t{3});
  osd.insert("loss_scaler", scaler.to_ivalue(ctx.python_objects));
  osd.insert("dynamic_loss_scale", scaler.dynamic);
  osd.insert("overflow", false);
  osd.insert("partition_count", static_cast<int64_t>(world_size()));
  if (has_expert_partition()) {
    osd.insert("ds_zero_partition_groups",
               ckpt::ivalue_from_json(partition_groups_metadata(*this)));
  }
  osd.insert("optimizer_state_dict", optim::optimizer_state_dict(*ctx.optimizer));
  List flats(c10::AnyType::get());
  for (auto& sg : sub_groups()) flats.push_back(sg.master);
  osd.insert("fp32_flat_groups", flats);
  ckpt::Dict top = ckpt::new_dict();
  top.insert("optimizer_state_dict", osd);
  top.insert("ds_config", ckpt::ivalue_from_json(ctx.config->raw));
  top.insert("ds_version", std::string(kDeepSpeedCompatVersion));
  return std::make_pair(
      ckpt::zero_optim_states_file_name(rank(), ctx.mp_rank, ctx.config->bf16.enabled),
      IValue(top));
}

// Reads every data-parallel rank's files when the data-parallel size or the sub-group layout
// differs, only this rank's otherwise.
void Stage3ZeroOptimizer::read_checkpoint(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan) {
  const std::string& tag_dir = ctx.tag_dir;
  const int mp_rank = ctx.mp_rank;
  const bool bf16 = ctx.config->bf16.enabled;
  const bool want_optimizer_state = ctx.want_optimizer;
  const int rank = this->rank();
  const int world = world_size();
  // This rank's own file decides whether the layout is the same where it exists: a node's
  // folder need hold no other rank's (Note [Node-local checkpoint storage]). Else rank 0's.
  const bool has_own =
      rank != 0 && ckpt::find_zero_optim_states_file_if_any(tag_dir, rank, mp_rank, bf16);
  Zero3File first = read_optim_file(tag_dir, has_own ? rank : 0, mp_rank, bf16);
  const int64_t saved_world = first.partition_count;
  const int own = rank < saved_world ? rank : 0;
  plan->model_file = tag_dir + "/" + ckpt::zero3_model_states_file_name(own, mp_rank);
  plan->states = read_model_states(tag_dir, own, mp_rank);
  DS_CHECK(plan->states.param_shapes.has_value(), CheckpointError, plan->model_file,
           ": has no param_shapes, so it is not a ZeRO-3 checkpoint");
  const auto& shapes = *plan->states.param_shapes;
  auto& groups = sub_groups();
  const auto slots = own_slots(*this);
  const auto frozen = frozen_param_infos();

  bool same = saved_world == world && shapes.size() == groups.size();
  for (size_t g = 0; same && g < groups.size(); ++g) {
    same = same_slots(stage3_slots(shapes[g], groups[g].world), slots[g],
                      ctx.load_module_strict);
  }
  // Note [Expert partitions]: expert shards are cut for an expert-data-parallel group, which
  // the re-partitioning below knows nothing of. As in DeepSpeed, such a checkpoint loads only
  // with the placement it was saved with.
  const IValue* saved_experts = client_value(plan->states, kAutoEPLayersKey);
  const bool saved_partitioned =
      saved_experts && has_zero3_partitioned_experts(*saved_experts, plan->model_file);
  if (saved_partitioned) check_autoep_placement(*saved_experts, *ctx.module, plan->model_file);
  DS_CHECK(same || !(saved_partitioned || has_expert_partition()), CheckpointError, tag_dir,
           ": AutoEP ZeRO-3 checkpoints load only with the parameter placement they were saved "
           "with (the same data-parallel size, expert_parallel.autoep_size and "
           "zero_optimization.sub_group_size); this one was saved on ", saved_world,
           " ranks, this engine has ", world, " (or another sub-group layout)");
  if (same) {
    Zero3File f = has_own || rank == 0 ? first : read_optim_file(tag_dir, rank, mp_rank, bf16);
    if (!f.partition_groups.isNone()) {
      // As DeepSpeed's _rigid_load_state_dict: the saved sub-groups' placement must be ours.
      const auto saved = ckpt::json_from_ivalue(f.partition_groups,
                                                f.path + ": ds_zero_partition_groups");
      const auto own = partition_groups_metadata(*this);
      DS_CHECK(saved == own, CheckpointError, f.path, ": AutoEP ZeRO-3 checkpoints can only be "
               "loaded with the same parameter placement topology: ds_zero_partition_groups is ",
               saved.dump(), ", this rank's is ", own.dump());
    }
    DS_CHECK(f.partition_count == world && f.fp32_flat_groups.size() == groups.size(),
             CheckpointError, f.path, ": partition_count ", f.partition_count, " and ",
             f.fp32_flat_groups.size(), " fp32 flat groups; this engine expects ", world, " and ",
             groups.size(), " (files of two saves mixed?)");
    for (size_t g = 0; g < groups.size(); ++g) {
      DS_CHECK(f.fp32_flat_groups[g].numel() == groups[g].numel, CheckpointError, f.path,
               ": fp32_flat_groups[", g, "] has ", f.fp32_flat_groups[g].numel(),
               " elements, this rank's sub-group ", groups[g].numel);
      plan->masters.push_back(f.fp32_flat_groups[g].to(at::kFloat));
    }
    if (want_optimizer_state) plan->optimizer_state = f.inner;
    for (const auto& info : frozen) {
      const at::Tensor* saved = plan->states.frozen_param_fragments
                                    ? plan->states.frozen_param_fragments->find(info.name)
                                    : nullptr;
      DS_CHECK(saved && saved->numel() == info.shard_numel, CheckpointError, plan->model_file,
               ": no fragment of frozen parameter '", info.name, "' with ", info.shard_numel,
               " elements (part 'frozen_param_fragments')");
      plan->frozen.push_back(saved->reshape({-1}));
    }
  } else {
    read_other_layout(*this, ctx, has_own ? read_optim_file(tag_dir, 0, mp_rank, bf16) : first,
                      plan);
  }

  plan->raw_states = ckpt::load(plan->model_file);
  for (const auto& p : ctx.module->named_parameters()) plan->placeholders.insert(p.key());
  if (saved_partitioned) {
    // The save left the experts out of the module (they are in the shards): placeholders, as
    // every partitioned parameter's entry is.
    std::vector<std::string> names;
    for (const auto& p : ctx.module->named_parameters()) names.push_back(p.key());
    const std::set<std::string> experts = expert_state_keys(*ctx.module, names);
    for (const auto& p : ctx.module->named_parameters()) {
      if (experts.count(p.key()) && plan->states.module.find(p.key()) == nullptr) {
        plan->states.module.insert(p.key(), at::empty({0}, p.value().options()));
      }
    }
  }
  plan->masters_note = saved_world == world
                           ? "fp32 master shards"
                           : "fp32 master shards re-partitioned from " +
                                 std::to_string(saved_world) + " to " + std::to_string(world) +
                                 " ranks";
  if (want_optimizer_state) {
    plan->load_optimizer = true;
    plan->loss_scaler = loss_scaler_json(first.loss_scaler);
  }
  ctx.check_model_states(plan);
}

void Stage3ZeroOptimizer::apply_checkpoint(const ZeroCheckpointContext& ctx,
                                           const ZeroLoadPlan& plan,
                                           std::vector<std::string>* restored) {
  // Buffers from the module; the parameters from the fp32 shards (the file holds placeholders
  // for them).
  ckpt::TensorDict buffers;
  for (const auto& b : ckpt::module_buffer_names(*ctx.module)) {
    if (const at::Tensor* t = plan.states.module.find(b)) buffers.insert(b, *t);
  }
  ckpt::load_module_state_dict(*ctx.module, buffers, /*strict=*/false, plan.model_file);
  {
    at::NoGradGuard no_grad;
    auto& groups = sub_groups();
    for (size_t g = 0; g < groups.size(); ++g) groups[g].master.copy_(plan.masters[g]);
    // plan.frozen follows frozen_shards()' order (read_checkpoint, from frozen_param_infos(),
    // which reads no int8-kept shard back: Note [Quantized frozen shards]).
    for (size_t i = 0; i < plan.frozen.size(); ++i) set_frozen_shard(i, plan.frozen[i]);
    masters_to_params();
  }
  restored->insert(restored->begin(), {"module", plan.masters_note});
}

}  // namespace deepspeed::runtime
