// Universal checkpoints: the engine's record of its tensor-parallel splits
// (universal_checkpoint_info), the offline conversion (ds_to_universal) and the per-rank slice
// a universal load takes. Layout as DeepSpeed's ds_to_universal.py writes it; see
// include/deepspeed/universal_checkpoint.h.
#include "deepspeed/universal_checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/errors.h"
#include "deepspeed/tensor_parallel.h"
#include "runtime/checkpoint/universal_source.h"
#include "runtime/checkpoint/value_access.h"
#include "runtime/zero/repartition.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;
using List = c10::impl::GenericList;

constexpr const char* kInfoKey = "universal_checkpoint_info";
constexpr double kUniversalVersion = 0.2;  // DeepSpeed's universal_checkpoint_version for
                                           // Megatron-style checkpoints

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

List string_list(const std::vector<std::string>& names) {
  List l(c10::StringType::get());
  for (const auto& n : names) l.push_back(n);
  return l;
}

std::string mp_file(const std::string& dir, int64_t m) {
  return dir + "/" + model_states_file_name(static_cast<int>(m));
}

using detail::UniversalSource;

// A pipeline stage's model-states file keeps no module (DeepSpeed's layout): its weights are
// put back from the layer files, under the names the file lists, so the readers below see a
// complete file.
IValue with_layer_module(const IValue& raw, const ModelStates& states,
                         const std::string& tag_dir, const std::string& path, int tp_rank) {
  if (!states.module_in_layer_files) return raw;
  const std::vector<std::string> names = listed_state_names(states);
  DS_CHECK(!names.empty(), CheckpointError, path, ": 'module' is None and 'param_shapes' too: "
           "a pipeline checkpoint written without a ZeRO or bf16 optimizer, which records no "
           "parameter names beside its layer files, so they cannot be matched to its optimizer "
           "state");
  Dict dict = raw.toGenericDict().copy();
  dict.insert_or_assign("module",
                        ivalue_from_tensors(module_from_layer_files(tag_dir, names, tp_rank)));
  return IValue(dict);
}

// A ZeRO 0-2 tag folder's model-parallel rank m: its mp_rank_XX_model_states.pt (`model`, as
// read) and (stages 1/2) every data-parallel rank's optimizer file. `moe`: the rank's experts,
// if any.
UniversalSource read_zero012_source(const std::string& dir, int64_t m, const IValue& model,
                                    const ModelStates& states, const detail::MoeExperts* moe) {
  UniversalSource out;
  const std::string model_path = mp_file(dir, m);
  out.model_states = model;
  // Stage 0 keeps its optimizer in the model states (MoE: each expert-parallel rank's in a
  // file of its own).
  if (!states.optimizer.isNone()) {
    return moe ? detail::read_zero0_moe_source(dir, m, out.model_states, model_path, *moe)
               : detail::read_zero0_source(out.model_states, model_path);
  }
  DS_CHECK(states.param_shapes.has_value(), CheckpointError, model_path,
           ": 'param_shapes' is None and it holds no optimizer, so it was saved without one and "
           "has no fp32 state to read (its 'module' is the whole model state dict)");
  const auto& shapes = *states.param_shapes;
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "mp_rank_%02d_optim_states.pt", static_cast<int>(m));
  const auto files = list_files_with_suffix(dir, suffix);
  DS_CHECK(!files.empty(), CheckpointError, dir, ": no '*_", suffix,
           "' files for model-parallel rank ", m, " (a ZeRO 1/2 checkpoint has one per rank)");
  std::vector<ZeroOptimizerStates> ranks;
  detail::MoeExperts::StackedPieces stacked;  // AutoEP's weights, by expert-parallel rank
  for (const auto& f : files) {
    const IValue raw = load(f);
    ZeroOptimizerStates z = ZeroOptimizerFile::from_ivalue(raw, f).optimizer_state_dict;
    // Note [Elastic ZeRO checkpoints]: no param_groups to carry over (DeepSpeed's converter
    // fails on these files too).
    DS_CHECK(!z.elastic(), NotSupportedError, f, ": saved with zero_optimization."
             "elastic_checkpoint, which keeps no param_groups, so it has no universal form; "
             "load it with load_checkpoint (onto any data-parallel size) and save it again "
             "without elastic_checkpoint");
    // Matches DeepSpeed: the global part is rank 0's optimizer_state_dict without its
    // partitioned parts, plus the inner optimizer's param_groups.
    if (out.optimizer_state.isNone()) {
      out.optimizer_state = detail::global_optimizer_state(
          raw, {"base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups"},
          f);
    }
    ranks.push_back(std::move(z));
  }
  int64_t saved_world = 0;
  for (int64_t c : ranks[0].partition_count) saved_world = std::max(saved_world, c);
  DS_CHECK(static_cast<int64_t>(ranks.size()) == saved_world, CheckpointError, dir,
           ": model-parallel rank ", m, " has ", ranks.size(), " optimizer-states files but "
           "partition_count says ", saved_world);
  for (size_t g = 0; g < shapes.size(); ++g) {
    // The ranks whose partitions join into the group's flat: every rank, or (an MoE expert
    // group, partitioned over its expert-data-parallel group) those of each expert-parallel
    // rank, whose local expert names are renamed to global ones.
    const int64_t count = g < ranks[0].partition_count.size() ? ranks[0].partition_count[g] : 0;
    for (const auto& holders : detail::partition_holders(count, saved_world, g, moe, files[0])) {
      std::vector<at::Tensor> masters;
      std::map<std::string, std::vector<at::Tensor>> per_element;
      std::optional<at::Tensor> step;
      for (int r : holders) {
        const std::string& file = files[static_cast<size_t>(r)];
        const auto& z = ranks[static_cast<size_t>(r)];
        const auto& parts = z.single_partition_of_fp32_groups;
        DS_CHECK(parts.size() == shapes.size() && z.partition_count.size() == shapes.size() &&
                     z.partition_count[g] == count,
                 CheckpointError, file, ": ", parts.size(), " fp32 partition groups (group ", g,
                 " partitioned over ", count, " ranks in ", files[0], "), param_shapes lists ",
                 shapes.size());
        const int64_t real = parts[g].numel();
        masters.push_back(parts[g]);
        Dict base = z.base_optimizer_state.toGenericDict();
        DS_CHECK(base.contains("state") && base.contains("param_groups"), CheckpointError, file,
                 ": base_optimizer_state has no state/param_groups");
        Dict state = base.at("state").toGenericDict();
        const IValue key(static_cast<int64_t>(g));
        if (!state.contains(key)) continue;  // no step taken yet
        for (const auto& e : state.at(key).toGenericDict()) {
          const std::string name = e.key().toStringRef();
          const IValue& v = e.value();
          if (v.isTensor() && v.toTensor().dim() == 1 && v.toTensor().numel() >= real &&
              name != "step") {
            per_element[name].push_back(v.toTensor().narrow(0, 0, real));
          } else if (name == "step" && !step) {
            step = detail::as_step_tensor(v, file + ": state[" + std::to_string(g) + "]");
          }
        }
      }
      std::map<std::string, runtime::SavedParams> group;  // by local name
      runtime::split_saved_group(at::cat(masters), shapes[g], files[0], &group["fp32"]);
      for (auto& [name, pieces] : per_element) {
        DS_CHECK(pieces.size() == holders.size(), CheckpointError, dir, ": optimizer state '",
                 name, "' of group ", g, " is missing on some data-parallel ranks of "
                 "model-parallel rank ", m);
        runtime::split_saved_group(at::cat(pieces), shapes[g], files[0], &group[name]);
      }
      for (const auto& item : shapes[g]) {
        const std::string name = moe ? moe->global_name(item.key(), holders[0]) : item.key();
        if (moe && moe->is_stacked(name)) {  // one expert-parallel rank's rows
          const int64_t ep_rank = moe->stacked_ep_rank(name, holders[0]);
          if (!stacked.count(name)) out.order.push_back(name);
          for (auto& [key, params] : group) {
            stacked[name][key].emplace(ep_rank, params.at(item.key()));
          }
          if (step) out.step[name] = *step;
          continue;
        }
        out.order.push_back(name);
        for (auto& [key, params] : group) out.states[key][name] = params.at(item.key());
        if (step) out.step[name] = *step;
      }
    }
  }
  if (moe) moe->join_stacked(stacked, dir, &out);
  detail::add_frozen_from_module(states, &out);
  return out;
}

// `experts`: AutoEP's stacked weight of that many experts (DeepSpeed's marks, by which its
// load takes each expert-parallel rank's rows), else 0.
void save_param_state(const std::string& folder, const std::string& key, const at::Tensor& t,
                      const TensorParallelSplit* split, int64_t experts = 0) {
  Dict d = new_dict();
  d.insert("param", t.contiguous());
  if (experts > 0) {
    d.insert("cat_dim", int64_t{0});
    d.insert("is_expert_param", true);
    d.insert("ep_num_experts", experts);
  }
  if (split) {
    d.insert("cat_dim", static_cast<int64_t>(split->partition_dim));
    if (split->partition_stride > 1) {
      d.insert("param_n_sub_params", static_cast<int64_t>(split->partition_stride));
    }
    if (split->original_vocab_size >= 0) d.insert("vocab_tensor", true);
  }
  save(d, folder + "/" + key + ".pt");
}

// A model-states file as ZeRO-3 writes it: every module entry but the buffers is a
// 0-element tensor of its dtype.
IValue with_placeholders(const IValue& model_states) {
  Dict states = model_states.toGenericDict().copy();
  const ModelStates parsed = ModelStates::from_ivalue(model_states, "model states");
  const std::set<std::string> buffers(parsed.buffer_names.begin(), parsed.buffer_names.end());
  Dict module = states.at("module").toGenericDict().copy();
  for (const auto& item : module.copy()) {
    if (!item.value().isTensor() || buffers.count(item.key().toStringRef())) continue;
    module.insert_or_assign(item.key(), at::empty({0}, item.value().toTensor().options()));
  }
  states.insert_or_assign("module", module);
  return states;
}

// Rank 0's model states with the module entries (and buffer names) of every rank that rank 0
// lacks.
IValue with_modules_of(const std::vector<UniversalSource>& ranks) {
  Dict states = ranks[0].model_states.toGenericDict().copy();
  Dict module = states.at("module").toGenericDict().copy();
  List buffers = states.at("buffer_names").toList().copy();
  std::set<std::string> buffer_set;
  for (const IValue& b : buffers.vec()) buffer_set.insert(b.toStringRef());
  for (size_t r = 1; r < ranks.size(); ++r) {
    Dict other = ranks[r].model_states.toGenericDict();
    for (const auto& item : other.at("module").toGenericDict()) {
      if (!module.contains(item.key())) module.insert(item.key(), item.value());
    }
    for (const IValue& b : other.at("buffer_names").toList().vec()) {
      if (buffer_set.insert(b.toStringRef()).second) buffers.push_back(b);
    }
  }
  states.insert_or_assign("module", module);
  states.insert_or_assign("buffer_names", buffers);
  return states;
}

}  // namespace

namespace detail {

void add_frozen_from_module(const ModelStates& states, UniversalSource* out) {
  // Tied aliases and buffers are not parameters of their own.
  std::set<std::string> skip(states.buffer_names.begin(), states.buffer_names.end());
  for (const auto& [alias, source] : states.shared_params.value_or(
           std::vector<std::pair<std::string, std::string>>{})) {
    skip.insert(alias);
  }
  auto& fp32 = out->states["fp32"];
  for (const auto& item : states.module) {
    if (skip.count(item.key()) || fp32.count(item.key())) continue;
    const at::Tensor t = item.value().to(at::kFloat);
    fp32[item.key()] = runtime::SavedParam{t.reshape(-1), t.sizes().vec()};
    out->order.push_back(item.key());
    out->frozen.emplace(item.key(), item.value().scalar_type());
  }
}

at::Tensor as_step_tensor(const IValue& v, const std::string& where) {
  if (v.isTensor()) return v.toTensor().detach().clone();
  if (v.isInt()) return at::scalar_tensor(static_cast<double>(v.toInt()), at::kFloat);
  if (v.isDouble()) return at::scalar_tensor(v.toDouble(), at::kFloat);
  DS_CHECK(false, CheckpointError, where, ": 'step' is neither a number nor a tensor");
  return {};
}

IValue global_optimizer_state(const IValue& raw, const std::vector<std::string>& drop,
                              const std::string& path) {
  DictReader top(raw, path);
  DictReader osd(top.at("optimizer_state_dict"), path + ": optimizer_state_dict");
  Dict out = new_dict();
  for (const auto& e : osd.dict()) {
    if (e.key().isString() &&
        std::find(drop.begin(), drop.end(), e.key().toStringRef()) != drop.end()) {
      continue;
    }
    out.insert(e.key(), e.value());
  }
  const char* inner_key =
      osd.has("base_optimizer_state") ? "base_optimizer_state" : "optimizer_state_dict";
  DictReader inner(osd.at(inner_key), osd.where(inner_key));
  out.insert_or_assign("param_groups", inner.at("param_groups"));
  // DeepSpeed's ZeRO-3 universal load takes the step count from the inner optimizer's
  // state[0] here; the per-element states (rank 0's partitions of them) are left out.
  Dict steps = new_dict();
  if (inner.has_value("state")) {
    for (const auto& e : inner.at("state").toGenericDict()) {
      if (!e.value().isGenericDict()) continue;
      const Dict per = e.value().toGenericDict();
      if (!per.contains("step")) continue;
      Dict only = new_dict();  // a tensor: torch 2's Adam refuses a plain number
      only.insert("step", as_step_tensor(per.at("step"), inner.where("state")));
      steps.insert(e.key(), only);
    }
  }
  Dict steps_only = new_dict();
  steps_only.insert("state", steps);
  steps_only.insert("param_groups", inner.at("param_groups"));
  out.insert_or_assign("optimizer_state_dict", steps_only);
  // DeepSpeed's ZeRO 1/2 universal load refuses a global state without ds_version.
  if (!out.contains("ds_version") && top.has("ds_version")) {
    out.insert("ds_version", top.at("ds_version"));
  }
  // DeepSpeed's universal load installs this value as its loss scaler and calls it: it must be
  // DeepSpeed's object even where the source file holds a plain dict (the default,
  // DS_CHECKPOINT_PYTHON_OBJECTS unset).
  if (osd.has_value("loss_scaler")) {
    out.insert_or_assign("loss_scaler", LossScalerState::from_ivalue(osd.at("loss_scaler"),
                                                                     osd.where("loss_scaler"))
                                            .to_ivalue(/*as_object=*/true));
  }
  return out;
}

}  // namespace detail

c10::IValue universal_checkpoint_info(const torch::nn::Module& module, int64_t tp_degree) {
  Dict info = new_dict();
  info.insert("universal_checkpoint_version", kUniversalVersion);
  info.insert("tp_degree", tp_degree);
  Dict splits = new_dict();
  std::vector<std::string> row, vocab;
  int64_t original_vocab = -1, padded_vocab = -1;
  for (const auto& m : module.named_modules()) {
    const auto* emb = dynamic_cast<const tensor_parallel::VocabParallelEmbeddingImpl*>(
        m.value().get());
    if (emb == nullptr) continue;
    vocab.push_back(m.key().empty() ? "weight" : m.key() + ".weight");
    original_vocab = emb->vocab_size();
    padded_vocab = emb->padded_vocab_size();
  }
  for (const auto& p : module.named_parameters()) {
    if (!tensor_parallel::is_tensor_parallel(p.value())) continue;
    const auto s = tensor_parallel::shard_info(p.value());
    Dict d = new_dict();
    d.insert("partition_dim", static_cast<int64_t>(s.partition_dim));
    d.insert("partition_stride", static_cast<int64_t>(s.partition_stride));
    splits.insert(p.key(), d);
    if (s.partition_dim == 1) row.push_back(p.key());
  }
  info.insert("tensor_parallel_parameters", splits);
  info.insert("parameter_with_row_parallelism_patterns", string_list(row));
  info.insert("vocabulary_parameter_patterns", string_list(vocab));
  if (original_vocab >= 0) {
    info.insert("original_vocab_size", original_vocab);
    info.insert("padded_vocab_size", padded_vocab);
  }
  return info;
}

std::map<std::string, TensorParallelSplit> tensor_parallel_splits(const c10::IValue& info,
                                                                  const std::string& source) {
  std::map<std::string, TensorParallelSplit> out;
  DS_CHECK(info.isGenericDict(), CheckpointError, source, ": ", kInfoKey, " is not a dict");
  Dict d = info.toGenericDict();
  if (!d.contains("tensor_parallel_parameters")) return out;
  int64_t original_vocab = -1;
  if (d.contains("original_vocab_size")) original_vocab = d.at("original_vocab_size").toInt();
  std::vector<std::string> vocab;
  if (d.contains("vocabulary_parameter_patterns")) {
    for (const auto& v : d.at("vocabulary_parameter_patterns").toListRef()) {
      vocab.push_back(v.toStringRef());
    }
  }
  for (const auto& e : d.at("tensor_parallel_parameters").toGenericDict()) {
    Dict s = e.value().toGenericDict();
    TensorParallelSplit split;
    split.partition_dim = static_cast<int>(s.at("partition_dim").toInt());
    split.partition_stride = static_cast<int>(s.at("partition_stride").toInt());
    const std::string name = e.key().toStringRef();
    if (std::find(vocab.begin(), vocab.end(), name) != vocab.end()) {
      split.original_vocab_size = original_vocab;
    }
    out[name] = split;
  }
  return out;
}

int count_model_parallel_files(const std::string& tag_dir) {
  int n = 0;
  for (const auto& path : list_files_with_suffix(tag_dir, "_model_states.pt")) {
    const std::string base = path.substr(path.rfind('/') + 1);
    if (base.rfind("mp_rank_", 0) == 0) ++n;
  }
  return n;
}

namespace detail {
namespace {

// The recorded splits name experts by the module's local ids; the parameters here have global
// ones. Every expert of a layer is split alike, so each takes its layer's split.
void add_expert_splits(ModelParallelCheckpoint* ckpt) {
  std::map<std::string, TensorParallelSplit> by_layer;
  for (const auto& [name, split] : ckpt->splits) {
    if (const auto key = MoeExperts::without_expert_id(name)) by_layer.emplace(*key, split);
  }
  if (by_layer.empty()) return;
  for (const auto& name : ckpt->names) {
    const auto key = MoeExperts::without_expert_id(name);
    const auto split = key ? by_layer.find(*key) : by_layer.end();
    if (split != by_layer.end()) ckpt->splits.emplace(name, split->second);
  }
}

}  // namespace

ModelParallelCheckpoint read_model_parallel_checkpoint(const std::string& tag_dir) {
  struct stat st {};
  DS_CHECK(::stat(tag_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), CheckpointError,
           "checkpoint folder ", tag_dir, " does not exist");
  ModelParallelCheckpoint out;
  out.tag_dir = tag_dir;
  // ZeRO-3 writes a model-states file per data-parallel rank, ZeRO 0-2 one per
  // model-parallel rank.
  const std::string zero3_first = tag_dir + "/" + zero3_model_states_file_name(0);
  out.zero3 = !file_exists(mp_file(tag_dir, 0)) && file_exists(zero3_first);
  const std::string first = out.zero3 ? zero3_first : mp_file(tag_dir, 0);
  DS_CHECK(file_exists(first), CheckpointError, tag_dir, " has no ", model_states_file_name(0),
           " or ", zero3_model_states_file_name(0),
           ", so it is not the tag folder of a checkpoint (<dir>/<tag>)");
  const IValue raw0 = load(first);
  const ModelStates states0 = ModelStates::from_ivalue(raw0, first);
  const int64_t mp = std::max<int64_t>(1, states0.mp_world_size);  // model-parallel files
  bool has_info = false;
  for (const auto& [key, value] : states0.client_state) {
    if (key == kInfoKey) {
      out.splits = tensor_parallel_splits(value, first);
      has_info = true;
    }
  }
  DS_CHECK(mp == 1 || has_info, CheckpointError, first, ": written with mp_world_size ", mp,
           " but without ", kInfoKey, ", so the tensor-parallel splits are unknown");
  // Model-parallel ranks are tensor-parallel ones (every rank holds every parameter, a split
  // one its piece), a pipeline's stages (each holds its own layers; a tied one is on two stages
  // and kept equal by the engine), or both (3D: rank stage * T + tensor-parallel rank).
  // checkpoint_parallel_dimensions says which; files that predate it record {1, 1}, and then
  // a pipeline is the one without split parameters.
  const auto& dims = states0.checkpoint_parallel_dimensions;
  const bool has_dims = dims.pp_degree * dims.tp_degree == mp;
  out.pp = has_dims ? dims.pp_degree : (out.splits.empty() ? mp : 1);
  out.tp = mp / out.pp;
  out.dp = states0.dp_world_size;
  for (int64_t m = 0; m < mp; ++m) {
    const std::string path = out.zero3 ? tag_dir + "/" + zero3_model_states_file_name(
                                                             0, static_cast<int>(m))
                                       : mp_file(tag_dir, m);
    DS_CHECK(file_exists(path), CheckpointError, path, " is missing (mp_world_size is ", mp,
             ")");
    // MoE: expert parameters get their global ids. Each model-parallel rank has its own expert
    // files: a pipeline stage its own MoE layers (or none), a tensor-parallel rank its shards
    // of the experts. ZeRO-3 refuses MoE.
    const IValue loaded = m == 0 ? raw0 : load(path);
    const IValue raw =
        with_layer_module(loaded, m == 0 ? states0 : ModelStates::from_ivalue(loaded, path),
                          tag_dir, path, out.tp > 1 ? static_cast<int>(m % out.tp) : -1);
    const ModelStates states = ModelStates::from_ivalue(raw, path);
    const auto moe = MoeExperts::read(tag_dir, m, states, path);
    DS_CHECK(!moe || !out.zero3 || !moe->has_native_layers(), NotSupportedError, path,
             ": an MoE checkpoint with ZeRO stage 3: the experts of ZeRO 0-2 models and AutoEP's "
             "are read (MoE training refuses ZeRO-3)");
    out.ranks.push_back(out.zero3 ? read_zero3_source(tag_dir, m, moe ? &*moe : nullptr)
                                  : read_zero012_source(tag_dir, m, raw, states,
                                                        moe ? &*moe : nullptr));
    if (moe) moe->add_frozen(&out.ranks.back());
    // A pipeline stage records the splits of its own layers.
    const Dict rank_states = out.ranks.back().model_states.toGenericDict();
    if (m > 0 && rank_states.contains(kInfoKey)) {
      for (auto& [name, split] : tensor_parallel_splits(rank_states.at(kInfoKey), path)) {
        out.splits.emplace(name, split);
      }
    }
  }
  std::set<std::string> seen;
  for (const auto& r : out.ranks) {
    for (const auto& n : r.order) {
      if (seen.insert(n).second) out.names.push_back(n);
    }
  }
  add_expert_splits(&out);
  return out;
}

int64_t ModelParallelCheckpoint::stage_of(const std::string& name) const {
  for (int64_t stage = 0; stage < pp; ++stage) {
    const auto& states = ranks[static_cast<size_t>(stage * tp)].states;
    const auto fp32 = states.find("fp32");
    if (fp32 != states.end() && fp32->second.count(name)) return stage;
  }
  DS_CHECK(false, CheckpointError, tag_dir, ": no pipeline stage's first tensor-parallel rank "
           "holds parameter ", name);
  return -1;
}

std::optional<at::Tensor> ModelParallelCheckpoint::full(const std::string& name,
                                                        const std::string& key) const {
  const int64_t stage = stage_of(name);
  const auto& holder = ranks[static_cast<size_t>(stage * tp)].states;
  const auto params = holder.find(key);
  if (params == holder.end() || !params->second.count(name)) return std::nullopt;
  const runtime::SavedParam& p = params->second.at(name);
  const auto split = splits.find(name);
  if (split == splits.end()) return p.flat.view(p.shape);
  std::vector<at::Tensor> parts;
  for (int64_t m = stage * tp; m < (stage + 1) * tp; ++m) {
    const auto& mine = ranks[static_cast<size_t>(m)].states;
    const auto rank_params = mine.find(key);
    const bool has = rank_params != mine.end() && rank_params->second.count(name);
    DS_CHECK(has, CheckpointError, mp_file(tag_dir, m), ": model-parallel rank ", m,
             " has no '", key, "' state for parameter ", name);
    const runtime::SavedParam& piece = rank_params->second.at(name);
    parts.push_back(piece.flat.view(piece.shape));
  }
  at::Tensor whole = tensor_parallel::unshard(parts, split->second.partition_dim,
                                              split->second.partition_stride);
  if (split->second.original_vocab_size >= 0) {  // Megatron's padding rows are dropped
    whole = whole.narrow(split->second.partition_dim, 0, split->second.original_vocab_size);
  }
  return whole;
}

}  // namespace detail

namespace {

// DeepSpeed's AutoEPMoELayer names an AutoEP layer's gate "<layer>.router.gate.weight" where our
// TokenChoiceMoE (and the Hugging Face blocks it stands for) says "<layer>.gate.weight". A load in
// DeepSpeed looks for its own name under zero/, so the gate of a layer with stacked experts gets
// that folder too (the same small files); ours reads "gate.weight" first. Nothing when the source
// already uses DeepSpeed's names.
std::optional<std::string> deepspeed_autoep_router_name(const std::string& name,
                                                        const UniversalSource& holder,
                                                        const std::set<std::string>& names) {
  static const std::string kGate = "gate.weight";
  if (name.size() < kGate.size() ||
      name.compare(name.size() - kGate.size(), kGate.size(), kGate) != 0) {
    return std::nullopt;
  }
  const std::string prefix = name.substr(0, name.size() - kGate.size());
  if (!prefix.empty() && prefix.back() != '.') return std::nullopt;  // e.g. "up_gate.weight"
  if (holder.stacked_experts.count(prefix + "experts.w1") == 0) return std::nullopt;
  const std::string theirs = prefix + "router." + kGate;
  if (names.count(theirs) > 0) return std::nullopt;
  return theirs;
}

}  // namespace

UniversalConversion ds_to_universal(const std::string& input_tag_dir,
                                    const std::string& output_dir, bool write_latest) {
  const detail::ModelParallelCheckpoint ckpt = detail::read_model_parallel_checkpoint(
      input_tag_dir);
  const std::string zero_dir = output_dir + "/zero";
  create_directories(zero_dir);
  UniversalConversion result;
  result.tp_degree = ckpt.tp;
  result.pp_degree = ckpt.pp;
  result.dp_degree = ckpt.dp;
  const std::set<std::string> names(ckpt.names.begin(), ckpt.names.end());
  for (const auto& name : ckpt.names) {
    const auto it = ckpt.splits.find(name);
    const TensorParallelSplit* split = it == ckpt.splits.end() ? nullptr : &it->second;
    const UniversalSource& holder = ckpt.ranks[static_cast<size_t>(ckpt.stage_of(name) * ckpt.tp)];
    const auto stacked = holder.stacked_experts.find(name);
    const int64_t experts = stacked == holder.stacked_experts.end() ? 0 : stacked->second;
    std::vector<std::string> folders = {name};
    if (const auto alias = deepspeed_autoep_router_name(name, holder, names)) {
      folders.push_back(*alias);
    }
    for (const auto& folder_name : folders) {
      const std::string folder = zero_dir + "/" + folder_name;
      create_directories(folder);
      for (const auto& item : holder.states) {
        // Frozen parameters have fp32 only.
        if (const auto full = ckpt.full(name, item.first)) {
          save_param_state(folder, item.first, *full, split, experts);
        }
      }
      // Matches DeepSpeed: step.pt holds the bare count, which its loader installs as the
      // optimizer's step as it is. Frozen parameters have none.
      const auto s = holder.step.find(name);
      if (s != holder.step.end()) save(s->second, folder + "/step.pt");
    }
    ++result.parameters;
  }
  Dict opt = ckpt.ranks[0].optimizer_state.toGenericDict();
  opt.insert_or_assign("universal_checkpoint_version", kUniversalVersion);
  save(opt, zero_dir + "/optimizer_state.pt");
  // A pipeline stage's module holds its own layers: a load reads mp_rank_00's, so that one
  // gets every stage's buffers.
  IValue first_states = ckpt.pp > 1 ? with_modules_of(ckpt.ranks) : ckpt.ranks[0].model_states;
  for (size_t m = 0; m < ckpt.ranks.size(); ++m) {  // the model states (module, counters, ...)
    const auto& source = ckpt.ranks[m];
    const IValue& states = m == 0 ? first_states : source.model_states;
    save(states, output_dir + "/" + model_states_file_name(static_cast<int>(m)));
    for (const auto& f : source.copy_files) {
      save(load(f), output_dir + "/" + f.substr(f.rfind('/') + 1));
    }
    if (ckpt.zero3) continue;
    // Beyond DeepSpeed's tool: its ZeRO-3 universal load reads the counters from
    // zero_pp_rank_0_mp_rank_XX_model_states.pt (and the weights from zero/), so a ZeRO 1/2
    // source gets that file too, with ZeRO-3's 0-element placeholders for the parameters.
    save(with_placeholders(states),
         output_dir + "/" + zero3_model_states_file_name(0, static_cast<int>(m)));
  }
  if (!write_latest) return result;
  // latest_universal beside the output folder names it, as DeepSpeed's tool writes it.
  std::string out = output_dir;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  const size_t slash = out.rfind('/');
  const std::string parent = slash == std::string::npos ? "." : out.substr(0, slash);
  const std::string tag = slash == std::string::npos ? out : out.substr(slash + 1);
  write_file_atomically(parent + "/latest_universal", tag);
  return result;
}

std::optional<std::string> read_latest_universal(const std::string& dir) {
  const std::string path = dir + "/latest_universal";
  if (!file_exists(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string tag = ss.str();
  const auto first = tag.find_first_not_of(" \t\r\n");
  DS_CHECK(first != std::string::npos, CheckpointError, path,
           " is empty: it should name the universal checkpoint folder");
  return tag.substr(first, tag.find_last_not_of(" \t\r\n") - first + 1);
}

at::Tensor load_universal_state(const std::string& universal_dir, const std::string& param,
                                const std::string& key, bool* vocab_tensor) {
  const std::string path = universal_dir + "/zero/" + param + "/" + key + ".pt";
  DS_CHECK(file_exists(universal_dir + "/zero/" + param), CheckpointError,
           "universal checkpoint ", universal_dir, ": no folder for parameter ", param, " (",
           universal_dir, "/zero/", param, ")");
  DS_CHECK(file_exists(path), CheckpointError, "universal checkpoint ", universal_dir,
           ": parameter ", param, " has no ", key, ".pt (", path, ")");
  const IValue v = load(path);
  if (vocab_tensor) *vocab_tensor = false;
  if (v.isTensor()) return v.toTensor();  // DeepSpeed's ZeRO-3 conversion saves bare tensors
  // DeepSpeed's step.pt holds the source's step as it was: a tensor or a plain number.
  if (key == "step" && (v.isInt() || v.isDouble())) return detail::as_step_tensor(v, path);
  DS_CHECK(v.isGenericDict() && v.toGenericDict().contains("param") &&
               v.toGenericDict().at("param").isTensor(),
           CheckpointError, path,
           ": not a universal state file (neither a tensor nor a dict with a tensor under "
           "'param')");
  Dict d = v.toGenericDict();
  if (vocab_tensor) {
    *vocab_tensor = d.contains("vocab_tensor") && d.at("vocab_tensor").isBool() &&
                    d.at("vocab_tensor").toBool();
  }
  return d.at("param").toTensor();
}

std::optional<at::Tensor> universal_global_step(const std::string& universal_dir) {
  const std::string path = universal_dir + "/zero/optimizer_state.pt";
  if (!file_exists(path)) return std::nullopt;
  const IValue v = load(path);
  if (!v.isGenericDict()) return std::nullopt;
  Dict d = v.toGenericDict();
  if (!d.contains("optimizer_state_dict") || !d.at("optimizer_state_dict").isGenericDict()) {
    return std::nullopt;
  }
  Dict inner = d.at("optimizer_state_dict").toGenericDict();
  if (!inner.contains("state") || !inner.at("state").isGenericDict()) return std::nullopt;
  Dict state = inner.at("state").toGenericDict();
  const IValue first(int64_t{0});
  if (!state.contains(first) || !state.at(first).isGenericDict()) return std::nullopt;
  Dict s0 = state.at(first).toGenericDict();
  if (!s0.contains("step")) return std::nullopt;
  return detail::as_step_tensor(s0.at("step"), path + ": optimizer_state_dict.state[0]");
}

at::Tensor universal_slice(const at::Tensor& full, at::IntArrayRef local_shape,
                           const TensorParallelSplit* split, int tp_rank, int tp_size,
                           const std::string& name) {
  std::ostringstream want;
  want << local_shape;
  if (!split) {
    DS_CHECK(full.sizes().equals(local_shape), CheckpointError, "universal checkpoint: parameter ",
             name, " has shape ", full.sizes(), ", the model's is ", want.str());
    return full;
  }
  const int dim = split->partition_dim;
  DS_CHECK(dim >= 0 && dim < full.dim() && full.dim() == static_cast<int64_t>(local_shape.size()),
           CheckpointError, "universal checkpoint: parameter ", name, " of shape ", full.sizes(),
           " cannot be split along dimension ", dim, " into ", want.str(), " pieces");
  const int64_t target = local_shape[static_cast<size_t>(dim)] * tp_size;
  at::Tensor padded = full;
  if (full.size(dim) < target && split->original_vocab_size >= 0) {
    std::vector<int64_t> pad_shape = full.sizes().vec();
    pad_shape[static_cast<size_t>(dim)] = target - full.size(dim);
    padded = at::cat({full, at::zeros(pad_shape, full.options())}, dim);
  }
  std::vector<int64_t> expect = local_shape.vec();
  expect[static_cast<size_t>(dim)] = target;
  DS_CHECK(padded.sizes().equals(expect), CheckpointError, "universal checkpoint: parameter ",
           name, " has shape ", full.sizes(), "; ", tp_size, " tensor-parallel pieces of ",
           want.str(), " need ", at::IntArrayRef(expect));
  return tensor_parallel::shard_of(padded, dim, tp_size, tp_rank, split->partition_stride);
}

}  // namespace deepspeed::checkpoint
