// FlatZeroOptimizer's checkpoints (see the header): what stages 0-2 write, and how they read a
// checkpoint back into a ZeroLoadPlan (this rank's file when the layout is the same, every
// saved rank's re-partitioned otherwise).
#include "runtime/zero/flat_zero_optimizer.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/optimizers.h"
#include "deepspeed/version.h"
#include "runtime/checkpoint/autoep_layers_metadata.h"
#include "runtime/checkpoint/moe_checkpoint.h"
#include "runtime/checkpoint/shared_file_writers.h"
#include "runtime/checkpoint/value_access.h"
#include "runtime/zero/bf16_optimizer_layout.h"
#include "runtime/zero/repartition.h"
#include "runtime/zero/unfused_fp16_layout.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

namespace ckpt = checkpoint;
using c10::IValue;
using List = c10::impl::GenericList;

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// This rank's real (unpadded) element count in a flat group.
int64_t real_partition_numel(const FlatGroupLayout& layout) {
  const int64_t begin = static_cast<int64_t>(layout.partition) * layout.partition_numel;
  return std::clamp<int64_t>(layout.numel - begin, 0, layout.partition_numel);
}

at::Tensor padded_to(const at::Tensor& t, int64_t numel, const std::string& where) {
  DS_CHECK(t.dim() == 1 && t.numel() <= numel, CheckpointError, where, " has ", t.numel(),
           " elements, this rank's partition holds ", numel,
           " (the model or the number of ranks differs from the checkpoint's)");
  at::Tensor out = at::zeros({numel}, t.options().dtype(at::kFloat));
  out.narrow(0, 0, t.numel()).copy_(t);
  return out;
}

// The saved partitions re-laid for this engine's flat groups (any saved world size): each saved
// group's partitions concatenated in rank order and cut by param_shapes (zero_to_fp32's walk).
RepartitionedZeroState repartition_flat_groups(const std::vector<ckpt::ZeroOptimizerFile>& files,
                                               const std::vector<std::string>& paths,
                                               const std::vector<ckpt::ShapeDict>& shapes,
                                               const std::vector<FlatGroupLayout>& layout) {
  const std::string source = paths.front();
  const auto& first = files.front().optimizer_state_dict;
  DS_CHECK(first.single_partition_of_fp32_groups.size() == shapes.size(), CheckpointError,
           source, ": ", first.single_partition_of_fp32_groups.size(),
           " fp32 partition groups but param_shapes lists ", shapes.size());
  SavedZeroRanks saved;
  saved.source = source;
  for (size_t r = 0; r < files.size(); ++r) {
    const auto& groups = files[r].optimizer_state_dict.single_partition_of_fp32_groups;
    DS_CHECK(groups.size() == shapes.size(), CheckpointError, paths[r], ": ", groups.size(),
             " fp32 partition groups, rank 0's file has ", shapes.size());
    saved.masters.push_back(groups);
  }
  ckpt::Dict base0 = first.base_optimizer_state.toGenericDict();
  DS_CHECK(base0.contains("param_groups") && base0.contains("state"), CheckpointError, source,
           ": base_optimizer_state has no param_groups/state");
  const size_t saved_groups = base0.at("param_groups").toListRef().size();
  DS_CHECK(saved_groups == layout.size(), CheckpointError, source, ": ", saved_groups,
           " optimizer param groups, this engine has ", layout.size(),
           " (with trainable parameters); the param groups must match to re-partition");
  for (const auto& f : files) {
    saved.optimizer_states.push_back(f.optimizer_state_dict.base_optimizer_state);
  }
  // Per-element state has a saved partition's size, padding included.
  for (size_t g = 0; g < shapes.size(); ++g) {
    saved.state_numel.push_back(first.single_partition_of_fp32_groups[g].numel() +
                                (first.group_paddings.size() > g ? first.group_paddings[g] : 0));
  }

  RepartitionLayout relayout;
  relayout.split = [&](size_t k, const std::vector<at::Tensor>& per_rank, SavedParams* out) {
    split_saved_group(at::cat(per_rank), shapes[k], source, out);
  };
  relayout.assemble = [&](size_t g, const SavedParams& params, at::ScalarType dtype) {
    return assemble_partition(layout[g], params, dtype, source);
  };
  relayout.saved_flat_of = [](size_t pg, int64_t /*id*/) { return pg; };  // one flat per group
  relayout.own_flats = layout.size();
  for (size_t g = 0; g < layout.size(); ++g) relayout.own_param_group.push_back(g);
  return repartition_zero_state(saved, relayout);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// save

std::string FlatZeroOptimizer::model_states_file_name(bool writes_replicated, int mp_rank) const {
  // One rank per model-parallel rank writes it (as DeepSpeed's save_non_zero_checkpoint).
  return writes_replicated ? ckpt::model_states_file_name(mp_rank) : std::string();
}

void FlatZeroOptimizer::use_moe_checkpoint(std::shared_ptr<torch::nn::Module> module,
                                           const std::vector<ExpertParams>& experts,
                                           const std::vector<int>& expert_of) {
  if (experts.empty()) return;
  MoeCheckpoint m;
  m.module = std::move(module);
  for (int e : expert_of) m.group_names.push_back(e < 0 ? "" : experts[static_cast<size_t>(e)].name);
  for (const auto& e : experts) {
    if (e.expert_parallel.size() < m.ep_size) continue;
    m.ep_size = e.expert_parallel.size();
    m.ep_rank = e.expert_parallel.rank();
    m.expert_data_parallel = e.expert_data_parallel;
  }
  moe_ = std::move(m);
}

void FlatZeroOptimizer::add_model_states(const ZeroCheckpointContext& ctx,
                                         ckpt::ModelStates* m) {
  // MoE: the experts go to files of their own (optimizer_states_file); at stage 0 the
  // optimizer too, in the expp_rank file, as every expert-parallel rank's differs.
  if (moe_) {
    m->module = without_expert_states(*moe_->module, m->module);
    // At stage 0 DeepSpeed also leaves rank 0's optimizer state in the model states
    // (_common_checkpoint_state); its MoE loader reads the expp_rank files.
    if (stage_ == 0) m->optimizer = stage0_optimizer_state(ctx);
    // DeepSpeed's load_checkpoint reads this list from every MoE checkpoint.
    c10::List<int64_t> counts;
    for (int64_t n : moe_num_experts(*moe_->module)) counts.push_back(n);
    m->client_state.emplace_back("num_experts", IValue(counts));
    // As DeepSpeed: AutoEP's layers described (their experts in per-expert files), else None.
    const auto autoep = autoep_layers_metadata(*moe_->module, /*zero3_partitioned=*/false);
    m->client_state.emplace_back(kAutoEPLayersKey,
                                 autoep.empty() ? IValue() : ckpt::ivalue_from_json(autoep));
    if (!autoep.empty()) {
      m->client_state.emplace_back(kUniversalInfoKey, autoep_universal_checkpoint_info(autoep));
    }
  }
  auto shapes = param_shapes(ctx);
  if (stage_ > 0 || !shapes.empty()) m->param_shapes = std::move(shapes);
  m->shared_params = ctx.shared_params;
  if (stage_ == 0) {
    if (!moe_) m->optimizer = stage0_optimizer_state(ctx);
    return;
  }
  // Matches DeepSpeed: frozen parameters are recorded from stage 2 on (zero_to_fp32 needs them
  // there), unless excluded.
  if (stage_ >= 2 && !ctx.exclude_frozen_parameters) {
    ckpt::ShapeDict frozen_shapes;
    ckpt::TensorDict fragments;
    for (const auto& p : ctx.module->named_parameters()) {
      if (p.value().requires_grad() || frozen_shapes.contains(p.key())) continue;
      frozen_shapes.insert(p.key(), p.value().sizes().vec());
      fragments.insert(p.key(), p.value().detach());
    }
    m->frozen_param_shapes = std::move(frozen_shapes);
    m->frozen_param_fragments = std::move(fragments);
  }
}

std::vector<ckpt::ShapeDict> FlatZeroOptimizer::param_shapes(
    const ZeroCheckpointContext& ctx) const {
  std::vector<ckpt::ShapeDict> shapes;
  const auto layout = flat_layout();
  for (const auto& l : layout) {
    ckpt::ShapeDict s;
    for (const auto& [name, shape] : l.params) s.insert(name, shape);
    shapes.push_back(std::move(s));
  }
  if (!layout.empty()) return shapes;
  // fp32 stage 0: the optimizer's groups hold the module's parameters themselves. A tied
  // parameter is named by its source (the first name), as in shared_params.
  std::set<std::string> aliases;
  for (const auto& [alias, source] : ctx.shared_params) aliases.insert(alias);
  std::map<const void*, std::string> name_of;
  for (const auto& p : ctx.module->named_parameters()) {
    if (!aliases.count(p.key())) name_of.emplace(p.value().unsafeGetTensorImpl(), p.key());
  }
  for (const auto& group : ctx.optimizer->param_groups()) {
    ckpt::ShapeDict s;
    for (const auto& p : group.params()) {
      const auto n = name_of.find(p.unsafeGetTensorImpl());
      // A client optimizer's tensor outside the module has no name: no param_shapes then
      // (None, as DeepSpeed writes at stage 0), rather than a failed save.
      if (n == name_of.end()) return {};
      s.insert(n->second, p.sizes().vec());
    }
    shapes.push_back(std::move(s));
  }
  return shapes;
}

IValue FlatZeroOptimizer::base_optimizer_state(const ZeroCheckpointContext& ctx) const {
  IValue base = optim::optimizer_state_dict(*ctx.optimizer);
  if (!moe_) return base;
  // DeepSpeed's MoE param groups carry their expert group's name and 'moe': True (its ZeRO
  // restore paths look for them).
  auto groups = base.toGenericDict().at("param_groups").toList();
  for (size_t g = 0; g < groups.size() && g < moe_->group_names.size(); ++g) {
    if (moe_->group_names[g].empty()) continue;
    ckpt::Dict group = groups.get(g).toGenericDict();
    group.insert_or_assign("name", moe_->group_names[g]);
    group.insert_or_assign("moe", true);
  }
  return base;
}

IValue FlatZeroOptimizer::stage0_optimizer_state(const ZeroCheckpointContext& ctx) {
  IValue base = base_optimizer_state(ctx);
  const auto layout = flat_layout();
  if (layout.empty()) return base;  // fp32: the optimizer steps the parameters themselves
  // fp16/bf16 at stage 0: the state_dict of the wrapper DeepSpeed would pick for this optimizer
  // (FP16_Optimizer or FP16_UnfusedOptimizer, unfused_fp16_layout.h; fp32 masters replicated),
  // plus our full loss-scaler state so that hysteresis resumes exactly.
  const nlohmann::json& scaler = ctx.loss_scaler;
  ckpt::Dict d = ckpt::new_dict();
  d.insert("dynamic_loss_scale", scaler.value("dynamic", false));
  d.insert("cur_scale", scaler.value("cur_scale", 1.0));
  d.insert("cur_iter", scaler.value("cur_iter", int64_t{0}));
  if (scaler.value("dynamic", false)) {
    d.insert("last_overflow_iter", scaler.at("last_overflow_iter").get<int64_t>());
    d.insert("scale_factor", scaler.at("scale_factor").get<double>());
    d.insert("scale_window", scaler.at("scale_window").get<int64_t>());
  }
  if (deepspeed_wraps_unfused(*ctx.optimizer)) {  // FP16_UnfusedOptimizer's per-parameter dict
    std::vector<at::Tensor> masters;
    for (size_t g = 0; g < layout.size(); ++g) masters.push_back(master_partition(g));
    PerParameterState split = split_into_parameters(layout, masters, base);
    d.insert("optimizer_state_dict", split.optimizer_state_dict);
    d.insert("fp32_groups", split.fp32_groups);
  } else {
    d.insert("optimizer_state_dict", base);
    List flats(c10::AnyType::get());
    for (size_t g = 0; g < layout.size(); ++g) {
      flats.push_back(master_partition(g).narrow(0, 0, layout[g].numel));
    }
    d.insert("fp32_groups_flat", flats);
  }
  d.insert("clip_grad", ctx.config->gradient_clipping);
  d.insert("loss_scaler", ckpt::ivalue_from_json(scaler));
  return d;
}

std::optional<std::pair<std::string, IValue>> FlatZeroOptimizer::optimizer_states_file(
    const ZeroCheckpointContext& ctx) {
  if (moe_) {
    const bool node_local = ctx.config->checkpoint.use_node_local_storage;
    save_expert_files(*moe_->module, ctx.tag_dir, ctx.mp_rank, node_local, ctx.save_file);
    if (stage_ == 0) {
      // DeepSpeed's _save_moe_checkpoint: expert-data-parallel rank 0 of each expert-parallel
      // rank writes {'optimizer': <the optimizer's state_dict>} (Note [Node-local checkpoint
      // storage]: the first of each node).
      if (!ckpt::writes_shared_files(*moe_->expert_data_parallel, node_local)) {
        return std::nullopt;
      }
      ckpt::Dict d = ckpt::new_dict();
      d.insert("optimizer", stage0_optimizer_state(ctx));
      return std::make_pair(expert_optimizer_file_name(moe_->ep_rank, ctx.mp_rank), IValue(d));
    }
  }
  if (stage_ == 0) return std::nullopt;  // in the model states
  return std::make_pair(
      ckpt::zero_optim_states_file_name(dp_rank_, ctx.mp_rank, ctx.config->bf16.enabled),
      zero_optimizer_file(ctx).to_ivalue());
}

ckpt::ZeroOptimizerFile FlatZeroOptimizer::zero_optimizer_file(const ZeroCheckpointContext& ctx) {
  ckpt::ZeroOptimizerStates z;
  z.loss_scaler = ctx.loss_scaler_state;
  z.dynamic_loss_scale = z.loss_scaler.dynamic;
  z.clip_grad = ctx.config->gradient_clipping;
  z.base_optimizer_state = base_optimizer_state(ctx);
  z.zero_stage = stage_;
  z.ds_version = kDeepSpeedCompatVersion;
  z.python_objects = ctx.python_objects;
  z.bf16_optimizer = bf16_layout();
  const auto layout = flat_layout();
  for (size_t g = 0; g < layout.size(); ++g) {
    const auto& l = layout[g];
    const int64_t real = real_partition_numel(l);
    z.single_partition_of_fp32_groups.push_back(master_partition(g).narrow(0, 0, real));
    z.group_paddings.push_back(l.partition_numel - real);
    z.partition_count.push_back(l.partitions);
    torch::OrderedDict<std::string, ckpt::FragmentAddress> mapping;
    const int64_t begin = static_cast<int64_t>(l.partition) * l.partition_numel;
    int64_t offset = 0;
    for (const auto& [name, shape] : l.params) {
      const int64_t n = numel_of(shape);
      const int64_t a = std::max(offset, begin);
      const int64_t b = std::min(offset + n, begin + real);
      if (a < b) mapping.insert(name, ckpt::FragmentAddress{b - a, a - begin});
      offset += n;
    }
    z.param_slice_mappings.push_back(std::move(mapping));
  }
  // Note [Elastic ZeRO checkpoints]. BF16_Optimizer's state has no elastic layout in DeepSpeed.
  // Its step as the optimizer DeepSpeed would run keeps it: CPU-Adam with offload, an int.
  const auto& zero = ctx.config->zero_optimization;
  if (zero.elastic_checkpoint && !z.bf16_optimizer) {
    z.make_elastic(/*step_as_tensor=*/zero.optimizer_offload() == OffloadDevice::kNone);
  }
  ckpt::ZeroOptimizerFile f;
  f.optimizer_state_dict = std::move(z);
  f.ds_config = ctx.config->raw;
  f.ds_version = kDeepSpeedCompatVersion;
  return f;
}

// ---------------------------------------------------------------------------------------------
// load

void read_replicated_model_states(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan) {
  plan->model_file = ctx.tag_dir + "/" + ckpt::model_states_file_name(ctx.mp_rank);
  plan->raw_states = ckpt::load(plan->model_file);
  plan->states = ckpt::ModelStates::from_ivalue(plan->raw_states, plan->model_file);
  ctx.check_model_states(plan);
}

void FlatZeroOptimizer::read_checkpoint(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan) {
  if (moe_) {
    // The model states lack the experts: they come from their files by global id, so the
    // weights load onto any ep_size.
    plan->model_file = ctx.tag_dir + "/" + ckpt::model_states_file_name(ctx.mp_rank);
    plan->raw_states = ckpt::load(plan->model_file);
    plan->states = ckpt::ModelStates::from_ivalue(plan->raw_states, plan->model_file);
    add_expert_states(*moe_->module, ctx.tag_dir, ctx.mp_rank, &plan->states.module);
    plan->optimizer_in_model_states = false;
    ctx.check_model_states(plan);
  } else {
    plan->optimizer_in_model_states = stage_ == 0;
    read_replicated_model_states(ctx, plan);
  }
  if (!plan->load_optimizer) return;
  if (stage_ != 0) return read_partitions(ctx, plan);
  if (moe_) return read_expert_optimizer(ctx, plan);
  DS_CHECK(!plan->states.optimizer.isNone(), CheckpointError, plan->model_file,
           ": has no optimizer state (part 'optimizer'); load with "
           "load_optimizer_states=false");
  const IValue& optimizer = plan->states.optimizer;
  if (optimizer.isGenericDict() &&
      optimizer.toGenericDict().contains("single_partition_of_fp32_groups")) {
    return read_bf16_optimizer_files(ctx, plan);
  }
  read_stage0_optimizer(optimizer, plan->model_file, plan);
}

void FlatZeroOptimizer::read_bf16_optimizer_files(const ZeroCheckpointContext& ctx,
                                                  ZeroLoadPlan* plan) {
  const auto layout = flat_layout();
  DS_CHECK(!layout.empty(), CheckpointError, plan->model_file,
           ": holds BF16_Optimizer's state (bf16 fp32 masters), this engine trains in fp32");
  const ckpt::detail::DictReader d(plan->states.optimizer, plan->model_file + ": 'optimizer'");
  int64_t world = 0;
  for (int64_t n : ckpt::detail::as_ints(d.at("partition_count"), d.where("partition_count"))) {
    world = std::max(world, n);
  }
  std::vector<ckpt::ZeroOptimizerFile> files;
  std::vector<std::string> paths;
  for (int r = 0; r < world; ++r) {
    paths.push_back(ckpt::find_zero_optim_states_file(ctx.tag_dir, r, ctx.mp_rank, true));
    files.push_back(ckpt::ZeroOptimizerFile::from_ivalue(ckpt::load(paths.back()), paths.back()));
  }
  // The flats hold the stage's parameters in the module's order on both sides (DeepSpeed's
  // pipeline checkpoints carry no param_shapes).
  std::vector<ckpt::ShapeDict> shapes(layout.size());
  for (size_t g = 0; g < layout.size(); ++g) {
    for (const auto& [name, shape] : layout[g].params) shapes[g].insert(name, shape);
  }
  RepartitionedZeroState joined = repartition_flat_groups(files, paths, shapes, layout);
  plan->masters = std::move(joined.masters);
  plan->optimizer_state = std::move(joined.optimizer_state);
  plan->masters_note = "fp32 master weights (BF16_Optimizer's partitions of " +
                       std::to_string(world) + " rank(s))";
}

void FlatZeroOptimizer::read_expert_optimizer(const ZeroCheckpointContext& ctx,
                                              ZeroLoadPlan* plan) {
  const int saved_ep = count_expert_optimizer_files(ctx.tag_dir, ctx.mp_rank);
  DS_CHECK(saved_ep == moe_->ep_size, CheckpointError, ctx.tag_dir, ": holds ", saved_ep,
           " expp_rank_*_optim_states.pt files (saved with ep_size ", saved_ep,
           "), this engine runs ep_size ", moe_->ep_size,
           "; the experts' optimizer states cannot be re-laid: load with "
           "load_optimizer_states=false (the weights load onto any ep_size)");
  const std::string path =
      ctx.tag_dir + "/" + expert_optimizer_file_name(moe_->ep_rank, ctx.mp_rank);
  c10::IValue file = ckpt::load(path);
  DS_CHECK(file.isGenericDict() && file.toGenericDict().contains("optimizer"), CheckpointError,
           path, ": has no 'optimizer' entry");
  const IValue optimizer = file.toGenericDict().at("optimizer");
  DS_CHECK(!optimizer.isNone(), CheckpointError, path,
           ": its 'optimizer' is None (saved under ZeRO stage 1 or 2?)");
  read_stage0_optimizer(optimizer, path, plan);
}

void FlatZeroOptimizer::read_stage0_optimizer(const IValue& optimizer, const std::string& path,
                                              ZeroLoadPlan* plan) {
  const auto layout = flat_layout();
  if (layout.empty()) {
    plan->optimizer_state = optimizer;
    return;
  }
  // 16-bit stage 0: FP16_Optimizer's or FP16_UnfusedOptimizer's dict with replicated fp32
  // masters, whichever wrote it.
  DS_CHECK(optimizer.isGenericDict(), CheckpointError, path,
           ": 'optimizer' is not a dict (part 'fp32 master weights')");
  ckpt::Dict d = optimizer.toGenericDict();
  DS_CHECK(!d.contains("single_partition_of_fp32_groups"), NotSupportedError, path,
           ": 'optimizer' is DeepSpeed's BF16_Optimizer state, which this engine does not read "
           "with MoE layers; load with load_optimizer_states=false to take the weights (the fp32 "
           "masters are rebuilt from them)");
  DS_CHECK((d.contains("fp32_groups_flat") || d.contains("fp32_groups")) &&
               d.contains("optimizer_state_dict"),
           CheckpointError, path,
           ": 'optimizer' has no fp32_groups_flat or fp32_groups, or no optimizer_state_dict "
           "(part 'fp32 master weights'): written without fp16/bf16?");
  if (d.contains("loss_scaler")) {
    plan->loss_scaler = ckpt::json_from_ivalue(d.at("loss_scaler"), path);
  }
  plan->masters_note = "fp32 master weights";
  if (!d.contains("fp32_groups_flat")) {
    FlatState joined =
        join_parameters(layout, d.at("fp32_groups"), d.at("optimizer_state_dict"), path);
    plan->masters = std::move(joined.masters);
    plan->optimizer_state = std::move(joined.optimizer_state_dict);
    return;
  }
  auto flats = d.at("fp32_groups_flat").toListRef();
  DS_CHECK(flats.size() == layout.size(), CheckpointError, path, ": ", flats.size(),
           " fp32 master groups, this engine has ", layout.size());
  for (size_t g = 0; g < layout.size(); ++g) {
    const at::Tensor t = flats[g].toTensor();
    DS_CHECK(t.numel() == layout[g].numel, CheckpointError, path, ": fp32_groups_flat[", g,
             "] has ", t.numel(), " elements, the model's group ", layout[g].numel);
    plan->masters.push_back(padded_to(t, layout[g].partition_numel, path));
  }
  plan->optimizer_state = d.at("optimizer_state_dict");
}

void FlatZeroOptimizer::read_partitions(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan) {
  // ZeRO 1/2: this rank's file when the layout is the same, else every saved rank's.
  DS_CHECK(plan->states.param_shapes.has_value(), CheckpointError, plan->model_file,
           ": has no param_shapes, so it is not a ZeRO checkpoint");
  const auto& shapes = *plan->states.param_shapes;
  const auto layout = flat_layout();
  const int world = dp_size_;  // the partition count this engine trains with
  const bool bf16 = ctx.config->bf16.enabled;
  // Note [Elastic ZeRO checkpoints]: an elastic file is read as the rigid one of its rank, with
  // this optimizer's hyper-parameters (DeepSpeed does not restore them from it either).
  std::optional<IValue> param_groups;
  const auto read_file = [&](const std::string& path) {
    auto file = ckpt::ZeroOptimizerFile::from_ivalue(ckpt::load(path), path);
    if (file.optimizer_state_dict.elastic()) {
      if (!param_groups) {
        param_groups = base_optimizer_state(ctx).toGenericDict().at("param_groups");
      }
      file.optimizer_state_dict.make_rigid(*param_groups, path);
    }
    return file;
  };
  const auto read = [&](int r, std::string* path) {
    *path = ckpt::find_zero_optim_states_file(ctx.tag_dir, r, ctx.mp_rank, bf16);
    return read_file(*path);
  };
  // This rank's own file decides whether the layout is the same where it exists: a node's
  // folder need hold no other rank's (Note [Node-local checkpoint storage]). Else rank 0's.
  const auto own_path =
      ckpt::find_zero_optim_states_file_if_any(ctx.tag_dir, dp_rank_, ctx.mp_rank, bf16);
  const int first = own_path ? dp_rank_ : 0;
  std::string first_path = own_path.value_or("");
  const ckpt::ZeroOptimizerFile first_file =
      own_path ? read_file(*own_path) : read(0, &first_path);
  const auto& counts = first_file.optimizer_state_dict.partition_count;
  int64_t saved_world = 0;
  for (int64_t c : counts) saved_world = std::max(saved_world, c);
  // Each group against its own partition count: an MoE expert group's is its
  // expert-data-parallel size.
  bool same = saved_world == world && shapes.size() == layout.size() &&
              counts.size() == layout.size();
  for (size_t g = 0; same && g < layout.size(); ++g) {
    same = same_layout(layout[g], shapes[g], counts[g]);
  }
  ckpt::ZeroOptimizerStates z;
  if (!same && moe_) {
    std::string mine;
    for (const auto& l : layout) mine += " " + std::to_string(l.partitions);
    std::string saved;
    for (int64_t c : counts) saved += " " + std::to_string(c);
    DS_CHECK(false, CheckpointError, first_path, ": partitioned over", saved,
             " ranks per param group, this engine over", mine, " (ep_size ", moe_->ep_size,
             ", ", world, " data-parallel ranks); MoE expert groups cannot be re-partitioned "
             "onto another ep_size or data-parallel size: load with load_optimizer_states=false "
             "(the weights load onto any ep_size)");
  }
  if (same) {
    std::string path = first_path;  // read() names the file a failed save left out
    const ckpt::ZeroOptimizerFile own = first == dp_rank_ ? first_file : read(dp_rank_, &path);
    if (moe_) {
      for (size_t g = 0; g < layout.size(); ++g) {
        const auto& own_counts = own.optimizer_state_dict.partition_count;
        DS_CHECK(own_counts.size() == layout.size() && own_counts[g] == layout[g].partitions,
                 CheckpointError, path, ": param group ", g, " is not partitioned over ",
                 layout[g].partitions, " ranks");
      }
    } else {
      own.optimizer_state_dict.check_partition_count(world, path);
    }
    const auto& parts = own.optimizer_state_dict.single_partition_of_fp32_groups;
    DS_CHECK(parts.size() == layout.size(), CheckpointError, path, ": ", parts.size(),
             " fp32 partition groups, the model has ", layout.size());
    for (size_t g = 0; g < layout.size(); ++g) {
      DS_CHECK(parts[g].numel() == real_partition_numel(layout[g]), CheckpointError, path,
               ": fp32 partition ", g, " has ", parts[g].numel(), " elements, expected ",
               real_partition_numel(layout[g]));
      plan->masters.push_back(padded_to(parts[g], layout[g].partition_numel, path));
    }
    plan->optimizer_state = own.optimizer_state_dict.base_optimizer_state;
    z = own.optimizer_state_dict;
    plan->masters_note = "fp32 master partitions";
  } else {
    // Re-partition: as many files as the checkpoint's ranks, no more (an old save's extra
    // rank files in the same tag directory would be a different checkpoint).
    char mp_suffix[64];  // this model-parallel rank's files only
    std::snprintf(mp_suffix, sizeof mp_suffix, "mp_rank_%02d_optim_states.pt", ctx.mp_rank);
    const auto present = ckpt::list_files_with_suffix(ctx.tag_dir, mp_suffix);
    DS_CHECK(static_cast<int64_t>(present.size()) == saved_world, CheckpointError, ctx.tag_dir,
             ": expected ", saved_world, " '*_optim_states.pt' files (partition_count) but "
             "found ", present.size(), "; possibly an overwrite of an old checkpoint");
    std::vector<ckpt::ZeroOptimizerFile> files;
    std::vector<std::string> paths;
    for (int r = 0; r < saved_world; ++r) {
      std::string p = first_path;
      files.push_back(r == first ? first_file : read(r, &p));
      paths.push_back(p);
    }
    auto re = repartition_flat_groups(files, paths, shapes, layout);
    plan->masters = std::move(re.masters);
    plan->optimizer_state = re.optimizer_state;
    z = files.front().optimizer_state_dict;
    plan->masters_note = "fp32 master partitions re-partitioned from " +
                         std::to_string(saved_world) + " to " + std::to_string(world) + " ranks";
  }
  plan->loss_scaler = loss_scaler_json(z.loss_scaler);
}

void FlatZeroOptimizer::apply_checkpoint(const ZeroCheckpointContext& ctx,
                                         const ZeroLoadPlan& plan,
                                         std::vector<std::string>* restored) {
  ckpt::load_module_state_dict(*ctx.module, plan.states.module, ctx.load_module_strict,
                               plan.model_file);
  restored->insert(restored->begin(), "module");
  at::NoGradGuard no_grad;
  if (!plan.masters.empty() && ctx.config->zero_optimization.load_from_fp32_weights) {
    for (size_t g = 0; g < plan.masters.size(); ++g) master_partition(g).copy_(plan.masters[g]);
    restored->push_back(plan.masters_note);
  } else {
    // Matches DeepSpeed (_restore_from_bit16_weights / refresh_fp32_params).
    params_to_masters();
    if (!flat_layout().empty()) restored->push_back("fp32 masters from the weights");
  }
}

}  // namespace deepspeed::runtime
