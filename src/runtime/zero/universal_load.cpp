// checkpoint.load_universal (DeepSpeed's universal_checkpoint.py load_hp_checkpoint_state): see
// universal_load.h.
#include "runtime/zero/universal_load.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/auto_ep.h"
#include "deepspeed/optimizers.h"
#include "deepspeed/tensor_parallel.h"
#include "deepspeed/universal_checkpoint.h"
#include "runtime/checkpoint/moe_checkpoint.h"
#include "runtime/zero/repartition.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

namespace ckpt = checkpoint;
using c10::IValue;

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// DeepSpeed's ZeRO-3 conversion saves each state flat: given the parameter's shape back.
at::Tensor as_shape(const at::Tensor& t, at::IntArrayRef shape) {
  if (t.dim() != 1 || shape.size() == 1 || t.numel() != c10::multiply_integers(shape)) return t;
  return t.view(shape);
}

// The universal states of this rank's parameters, sliced to its tensor-parallel piece. An MoE
// expert's folder is named by its global expert id (ds_to_universal), the module's by the
// rank's local one.
class UniversalReader {
 public:
  UniversalReader(const ZeroCheckpointContext& ctx, int tp_rank, int tp_size)
      : dir_(ctx.tag_dir),
        tp_rank_(tp_rank),
        tp_size_(tp_size),
        folders_(expert_global_names(*ctx.module)) {
    for (const auto& p : ctx.module->named_parameters()) params_.emplace(p.key(), p.value());
    for (const auto& [name, layer] : moe::token_choice_layers(*ctx.module)) {
      const std::string dot = name.empty() ? "" : name + ".";
      for (const char* w : {"w1", "w2", "w3"}) {
        stacked_[dot + "experts." + w] = {layer->first_expert(), layer->num_experts()};
      }
      // DeepSpeed's AutoEPMoELayer names the gate router.gate: its universal checkpoints hold
      // "<layer>.router.gate.weight" where ours hold "<layer>.gate.weight".
      const std::string gate = dot + "gate.weight", theirs = dot + "router.gate.weight";
      if (!exists(dir_ + "/zero/" + gate) && exists(dir_ + "/zero/" + theirs)) {
        folders_.emplace(gate, theirs);
      }
    }
  }

  /// The folder of parameter `name` under zero/.
  const std::string& folder(const std::string& name) const {
    const auto f = folders_.find(name);
    return f == folders_.end() ? name : f->second;
  }

  /// AutoEP: whether `name` is a stacked expert weight of the model.
  bool is_stacked(const std::string& name) const { return stacked_.count(name) > 0; }

  /// Parameter `name`'s `key` state, this rank's piece, in the live parameter's shape (or
  /// `shape`, where the live one is a ZeRO-3 placeholder).
  at::Tensor local(const std::string& name, const std::string& key,
                   std::optional<at::IntArrayRef> shape = std::nullopt) {
    const at::Tensor& live = params_.at(name);
    const at::IntArrayRef sizes = shape ? *shape : live.sizes();
    bool vocab = false;
    at::Tensor full = ckpt::load_universal_state(dir_, folder(name), key, &vocab);
    if (key == "step") return full;  // a count, the same for every piece
    if (const auto s = stacked_.find(name); s != stacked_.end()) {
      // AutoEP: every expert in the file, this rank's rows [first, first + local) in the model
      // (DeepSpeed's load_hp_checkpoint_state slices its ep rank's alike).
      const auto [first, experts] = s->second;
      DS_CHECK(full.dim() == static_cast<int64_t>(sizes.size()) && full.size(0) == experts,
               CheckpointError, "universal checkpoint ", dir_, ": AutoEP weight ", name,
               " has shape ", full.sizes(), "; the model's layer has ", experts, " experts of ",
               sizes.slice(1));
      full = full.narrow(0, first, sizes[0]);
      if (shape) return full;
    }
    if (!tensor_parallel::is_tensor_parallel(live)) {
      return ckpt::universal_slice(as_shape(full, live.sizes()), live.sizes(), nullptr, tp_rank_,
                                   tp_size_, name);
    }
    const auto info = tensor_parallel::shard_info(live);
    ckpt::TensorParallelSplit split;
    split.partition_dim = info.partition_dim;
    split.partition_stride = info.partition_stride;
    split.original_vocab_size = vocab ? full.size(info.partition_dim) : -1;
    return ckpt::universal_slice(full, live.sizes(), &split, tp_rank_, tp_size_, name);
  }

  /// The parameter's step count: its step.pt, else the checkpoint's global one (DeepSpeed's
  /// ZeRO-3 conversion writes no step.pt); nullopt when saved before the first step.
  std::optional<at::Tensor> step(const std::string& name) {
    if (has(name, "step")) return ckpt::load_universal_state(dir_, folder(name), "step");
    if (!global_step_read_) {
      global_step_ = ckpt::universal_global_step(dir_);
      global_step_read_ = true;
    }
    return global_step_;
  }

  bool has(const std::string& name, const std::string& key) const {
    return exists(dir_ + "/zero/" + folder(name) + "/" + key + ".pt");
  }
  bool is_param(const std::string& name) const { return params_.count(name) > 0; }
  const std::map<std::string, at::Tensor>& params() const { return params_; }

 private:
  std::string dir_;
  int tp_rank_, tp_size_;
  std::map<std::string, at::Tensor> params_;
  std::map<std::string, std::string> folders_;  // local expert name -> global one
  // AutoEP's stacked weights: the rank's first expert and the layer's number of experts.
  std::map<std::string, std::pair<int64_t, int64_t>> stacked_;
  bool global_step_read_ = false;
  std::optional<at::Tensor> global_step_;
};

// The per-element state names the checkpoint holds in parameter folder `first` (of a group's
// first parameter): every state file but fp32 and step, as DeepSpeed's loader takes them
// (exp_avg and exp_avg_sq for Adam, momentum_buffer for SGD, ...). Sorted.
std::vector<std::string> element_keys(const std::string& dir, const std::string& first) {
  std::vector<std::string> keys;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/zero/" + first, ec)) {
    const std::string file = e.path().filename().string();
    if (file.size() <= 3 || file.compare(file.size() - 3, 3, ".pt") != 0) continue;
    const std::string key = file.substr(0, file.size() - 3);
    if (key != "fp32" && key != "step") keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

// Counters, scheduler, buffers, client state: the copied model states of model-parallel rank 0.
void read_model_states(const std::string& dir, ZeroLoadPlan* plan) {
  DS_CHECK(exists(dir + "/zero"), CheckpointError, "load_universal: ", dir,
           " is not a universal checkpoint (no zero/ folder; convert with ds_to_universal)");
  plan->model_file = dir + "/" + ckpt::model_states_file_name(0);
  // DeepSpeed's conversion of a ZeRO-3 checkpoint carries the ranks' model states only (the
  // module's parameters are placeholders there; they come from the fp32 states anyway).
  const std::string zero3 = dir + "/" + ckpt::zero3_model_states_file_name(0);
  if (!exists(plan->model_file) && exists(zero3)) plan->model_file = zero3;
  plan->raw_states = ckpt::load(plan->model_file);
  plan->states = ckpt::ModelStates::from_ivalue(plan->raw_states, plan->model_file);
}

// optimizer_state.pt's loss scaler, when there is one.
void read_loss_scaler(const std::string& dir, ZeroLoadPlan* plan) {
  const std::string opt_file = dir + "/zero/optimizer_state.pt";
  if (!exists(opt_file)) return;
  ckpt::Dict d = ckpt::load(opt_file).toGenericDict();
  if (d.contains("loss_scaler")) {
    plan->loss_scaler =
        loss_scaler_json(ckpt::LossScalerState::from_ivalue(d.at("loss_scaler"), opt_file));
  }
}

}  // namespace

void read_universal_checkpoint(const ZeroCheckpointContext& ctx, FlatZeroOptimizer* zero,
                               int tp_rank, int tp_size, ZeroLoadPlan* plan) {
  const std::string& dir = ctx.tag_dir;
  read_model_states(dir, plan);
  plan->optimizer_in_model_states = zero && ctx.config->zero_optimization.stage == 0;

  UniversalReader reader(ctx, tp_rank, tp_size);
  // The module: every parameter from its fp32 state (tied aliases from their source), buffers
  // from the model states.
  std::map<std::string, std::string> alias_of(ctx.shared_params.begin(), ctx.shared_params.end());
  ckpt::TensorDict module;
  std::map<std::string, at::Tensor> fp32;
  for (const auto& item : ckpt::module_state_dict(*ctx.module)) {
    const std::string& name = item.key();
    if (!reader.is_param(name)) {
      const at::Tensor* saved = plan->states.module.find(name);
      DS_CHECK(saved != nullptr, CheckpointError, plan->model_file, ": has no buffer ", name);
      module.insert(name, *saved);
      continue;
    }
    const auto a = alias_of.find(name);
    const std::string source = a == alias_of.end() ? name : a->second;
    if (!fp32.count(source)) fp32[source] = reader.local(source, "fp32");
    module.insert(name, fp32[source].to(item.value().scalar_type()));
  }
  plan->states.module = std::move(module);
  if (ctx.want_optimizer) plan->load_optimizer = true;  // the saved stage does not matter
  ctx.check_model_states(plan);
  if (!plan->load_optimizer || !zero) return;

  auto* optimizer = ctx.optimizer;
  ckpt::Dict current = optim::optimizer_state_dict(*optimizer).toGenericDict();
  ckpt::Dict state = ckpt::new_dict();
  const auto layout = zero->flat_layout();
  if (!layout.empty()) {  // fp32 masters in flat groups: stages 1/2 (and 16-bit stage 0)
    for (size_t g = 0; g < layout.size(); ++g) {
      SavedParams masters;
      for (const auto& [name, shape] : layout[g].params) {
        masters[name] = SavedParam{fp32.count(name) ? fp32[name] : reader.local(name, "fp32"),
                                   shape};
        masters[name].flat = masters[name].flat.reshape({-1});
      }
      plan->masters.push_back(assemble_partition(layout[g], masters, at::kFloat, dir));
      if (layout[g].params.empty()) continue;
      const std::string& first = layout[g].params.front().first;
      const auto step = reader.step(first);
      const auto keys = element_keys(dir, reader.folder(first));
      if (!step && keys.empty()) continue;  // saved before the first step
      ckpt::Dict s = ckpt::new_dict();
      if (step) s.insert("step", *step);  // SGD keeps none
      for (const auto& key : keys) {
        SavedParams per;
        for (const auto& [name, shape] : layout[g].params) {
          per[name] = SavedParam{reader.local(name, key).reshape({-1}), shape};
        }
        s.insert(key, assemble_partition(layout[g], per, at::kFloat, dir));
      }
      state.insert(static_cast<int64_t>(g), s);
    }
  } else {  // fp32 stage 0: the optimizer steps the parameters themselves
    std::map<const void*, std::string> name_of;
    for (const auto& [name, p] : reader.params()) {  // tied aliases are stepped as their source
      if (!alias_of.count(name)) name_of.emplace(p.unsafeGetTensorImpl(), name);
    }
    int64_t index = 0;
    for (const auto& group : optimizer->param_groups()) {
      for (const auto& p : group.params()) {
        const auto n = name_of.find(p.unsafeGetTensorImpl());
        DS_CHECK(n != name_of.end(), CheckpointError, "load_universal: an optimizer parameter "
                 "is not a parameter of the module");
        const std::string& name = n->second;
        const auto step = reader.step(name);
        const auto keys = element_keys(dir, reader.folder(name));
        if (step || !keys.empty()) {  // else saved before the first step
          ckpt::Dict s = ckpt::new_dict();
          if (step) s.insert("step", *step);
          for (const auto& key : keys) s.insert(key, reader.local(name, key));
          state.insert(index, s);
        }
        ++index;
      }
    }
  }
  current.insert_or_assign("state", state);
  plan->optimizer_state = current;
  read_loss_scaler(dir, plan);
  plan->masters_note = "fp32 masters and optimizer state from the universal checkpoint (sliced "
                       "for tensor-parallel rank " + std::to_string(tp_rank) + " of " +
                       std::to_string(tp_size) + ")";
}

void read_universal_checkpoint(const ZeroCheckpointContext& ctx, Stage3ZeroOptimizer& zero,
                               ZeroLoadPlan* plan) {
  const std::string& dir = ctx.tag_dir;
  read_model_states(dir, plan);
  // The module's parameters come from the fp32 states (checked by name); buffers from the file.
  for (const auto& p : ctx.module->named_parameters()) plan->placeholders.insert(p.key());
  if (ctx.want_optimizer) plan->load_optimizer = true;
  UniversalReader reader(ctx, 0, 1);  // for the step counts, the state names, AutoEP's rows
  // An AutoEP checkpoint's module holds no experts (DeepSpeed's layout): their universal
  // folders stand for them.
  for (const auto& p : ctx.module->named_parameters()) {
    if (reader.is_stacked(p.key()) && !plan->states.module.contains(p.key())) {
      plan->states.module.insert(p.key(), at::empty({0}, p.value().options()));
    }
  }
  ctx.check_model_states(plan);

  // A parameter's full state (AutoEP's experts: this rank's rows), checked against the model's
  // shape.
  auto full = [&](const std::string& name, const std::string& key, const ckpt::Shape& shape) {
    const at::Tensor t = reader.is_stacked(name)
                             ? reader.local(name, key, shape)
                             : as_shape(ckpt::load_universal_state(dir, name, key), shape);
    DS_CHECK(t.sizes().equals(shape), CheckpointError, "universal checkpoint ", dir,
             ": parameter ", name, " has shape ", t.sizes(), ", the model's is ",
             at::IntArrayRef(shape));
    return SavedParam{t.reshape({-1}).to(at::kFloat), shape};
  };
  auto& groups = zero.sub_groups();
  // A sub-group's shards are cut for its partition group (AutoEP's experts: the
  // expert-data-parallel group, Note [Expert partitions]); this rank's place in it.
  const auto rank_in = [&](const Stage3SubGroup& g) {
    return zero.partition_group(g.partition).rank();
  };
  std::vector<std::vector<Stage3Slot>> slots(groups.size());
  for (const auto& info : zero.param_infos()) {
    slots.at(info.sub_group).push_back(
        Stage3Slot{info.name, info.shape, info.shard_numel, info.offset});
  }
  ckpt::Dict state = ckpt::new_dict();
  for (size_t g = 0; g < groups.size(); ++g) {  // one sub-group's full tensors at a time
    SavedParams masters;
    for (const auto& s : slots[g]) masters[s.name] = full(s.name, "fp32", s.shape);
    const int rank = rank_in(groups[g]);
    plan->masters.push_back(
        assemble_stage3_flat(slots[g], groups[g].numel, rank, masters, at::kFloat, dir));
    if (!plan->load_optimizer || slots[g].empty()) continue;
    // The inner optimizer's parameter g is sub-group g (sub-groups follow the param groups).
    const std::string& first = slots[g].front().name;
    const auto step = reader.step(first);
    const auto keys = element_keys(dir, first);
    if (!step && keys.empty()) continue;  // saved before the first step
    ckpt::Dict s = ckpt::new_dict();
    if (step) s.insert("step", *step);
    for (const auto& key : keys) {
      SavedParams per;
      for (const auto& slot : slots[g]) per[slot.name] = full(slot.name, key, slot.shape);
      s.insert(key, assemble_stage3_flat(slots[g], groups[g].numel, rank, per, at::kFloat, dir));
    }
    state.insert(static_cast<int64_t>(g), s);
  }
  // Frozen parameters: this rank's ceil(numel / W) elements of each (AutoEP's experts: of its
  // expert-parallel rank's rows, W its expert-data-parallel group, Note [Expert partitions]).
  for (const auto& info : zero.frozen_param_infos()) {
    const std::string& name = info.name;
    const bool experts = reader.is_stacked(name);
    const comm::Group& group = zero.partition_group(experts ? 1 : 0);
    const int64_t world = experts ? group.size() : zero.world_size();
    const int rank = experts ? group.rank() : zero.rank();
    const int64_t shard = info.shard_numel;
    const at::Tensor t = experts ? full(name, "fp32", info.shape).flat
                                 : ckpt::load_universal_state(dir, name, "fp32").reshape({-1});
    DS_CHECK((t.numel() + world - 1) / world == shard, CheckpointError,
             "universal checkpoint ", dir, ": frozen parameter ", name, " has ", t.numel(),
             " elements; this rank's shard of ", shard, " is not 1/", world, " of them");
    at::Tensor mine = at::zeros({shard}, t.options());
    const int64_t begin = rank * shard;
    const int64_t n = std::clamp<int64_t>(t.numel() - begin, 0, shard);
    if (n > 0) mine.narrow(0, 0, n).copy_(t.narrow(0, begin, n));
    plan->frozen.push_back(mine);
  }
  if (plan->load_optimizer) {
    ckpt::Dict current = optim::optimizer_state_dict(*ctx.optimizer).toGenericDict();
    current.insert_or_assign("state", state);
    plan->optimizer_state = current;
    read_loss_scaler(dir, plan);
  }
  plan->masters_note = "fp32 master shards from the universal checkpoint (data-parallel rank " +
                       std::to_string(zero.rank()) + " of " +
                       std::to_string(zero.world_size()) + ")";
}

}  // namespace deepspeed::runtime
