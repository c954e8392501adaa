// consolidate_zero_checkpoint(): the fp32 weights of a ZeRO checkpoint as one state dict, the
// algorithm of DeepSpeed's zero_to_fp32.py (reference §6.4) with errors that name the file.
// Stage 1/2: every rank's fp32 partition of a param group, concatenated in rank order, is the
// group's flat buffer without its tail padding; param_shapes cuts it. Stage 3: each parameter
// is split into ceil(numel/W) elements per rank at the same offset of every rank's flat buffer.
// MoE (beyond DeepSpeed's script): an expert group's partitions are those of each
// expert-parallel rank's expert-data-parallel group, and its experts are named by global id
// (AutoEP's stacked weights: every expert-parallel rank's rows joined, every expert).
// Model-parallel and ZeRO-0 checkpoints (beyond the script too) go through ds_to_universal's
// reader (universal_source.h).
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/universal_checkpoint.h"
#include "runtime/checkpoint/autoep_layers_metadata.h"
#include "runtime/checkpoint/universal_source.h"
#include "runtime/checkpoint/value_access.h"
#include "runtime/zero/bf16_optimizer_layout.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;
using detail::DictReader;

int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void put(TensorDict& dict, const std::string& key, const at::Tensor& value) {
  if (at::Tensor* existing = dict.find(key)) {
    *existing = value;
  } else {
    dict.insert(key, value);
  }
}

// What zero_to_fp32 needs of a model-states file (parsed leniently: only these keys).
struct ModelStateParts {
  std::string path;
  TensorDict buffers;
  std::vector<ShapeDict> param_shapes;
  ShapeDict frozen_param_shapes;
  TensorDict frozen_param_fragments;
  std::vector<std::pair<std::string, std::string>> shared_params;
  std::optional<detail::MoeExperts> moe;  // an MoE checkpoint's experts
};

ModelStateParts read_model_states(const std::string& tag_dir, const std::string& path) {
  DictReader r(load(path), path);
  DS_CHECK(r.has("buffer_names"), CheckpointError, path,
           " is not a model state checkpoint (no 'buffer_names')");
  ModelStateParts m;
  m.path = path;
  // Only the keys the reconstruction needs go through ModelStates; ds_config, client state
  // and the rest are not looked at.
  Dict subset = new_dict();
  for (const char* key : {"module", "buffer_names", "param_shapes", "frozen_param_shapes",
                          "frozen_param_fragments", "shared_params", "num_experts",
                          "ds_autoep_layers", "dp_world_size", "ds_config"}) {
    if (r.has(key)) subset.insert(key, r.at(key));
  }
  ModelStates states = ModelStates::from_ivalue(IValue(subset), path);
  m.moe = detail::MoeExperts::read(tag_dir, 0, states, path);
  DS_CHECK(states.param_shapes.has_value(), CheckpointError, path,
           ": 'param_shapes' is None, so this checkpoint was not written with a ZeRO optimizer "
           "(its module state dict is already complete: load 'module' directly)");
  if (states.module_in_layer_files && !states.buffer_names.empty()) {  // a pipeline stage's
    states.module = module_from_layer_files(tag_dir, states.buffer_names);
  }
  for (const auto& name : states.buffer_names) {
    if (const at::Tensor* t = states.module.find(name)) m.buffers.insert(name, t->to(at::kFloat));
  }
  m.param_shapes = std::move(*states.param_shapes);
  if (states.frozen_param_shapes) m.frozen_param_shapes = std::move(*states.frozen_param_shapes);
  if (states.frozen_param_fragments) {
    m.frozen_param_fragments = std::move(*states.frozen_param_fragments);
  }
  if (states.shared_params) m.shared_params = std::move(*states.shared_params);
  // Beyond DeepSpeed's script: ZeRO-1 (and a save that excluded them) records no frozen
  // parameters, which the script then leaves out; the module holds them whole (ZeRO-3's
  // 0-element placeholders aside), so they are taken from there.
  std::set<std::string> listed(states.buffer_names.begin(), states.buffer_names.end());
  for (const auto& [alias, source] : m.shared_params) listed.insert(alias);
  for (const auto& group : m.param_shapes) {
    for (const auto& item : group) listed.insert(item.key());
  }
  for (const auto& item : states.module) {
    const std::string& name = item.key();
    if (listed.count(name) || m.frozen_param_shapes.contains(name) ||
        item.value().numel() == 0 || (m.moe && m.moe->is_expert(name))) {
      continue;
    }
    m.frozen_param_shapes.insert(name, item.value().sizes().vec());
    m.frozen_param_fragments.insert(name, item.value());
  }
  return m;
}

struct OptimizerParts {
  std::string path;
  int64_t zero_stage = 0;
  int64_t world_size = 0;  // max(partition_count)
  std::vector<int64_t> partition_count;  // per param group (MoE expert groups: fewer ranks)
  std::vector<at::Tensor> fp32_groups;
};

OptimizerParts read_optimizer_states(const std::string& path) {
  DictReader file(load(path), path);
  DictReader r(file.at("optimizer_state_dict"), path + ": optimizer_state_dict");
  OptimizerParts o;
  o.path = path;
  // No zero_stage: DeepSpeed's BF16_Optimizer (bf16 at ZeRO-1 with fp32 gradient accumulation,
  // or under pipeline parallelism), partitioned as ZeRO-1 but each partition with its padding
  // (DeepSpeed's zero_to_fp32 refuses it).
  const bool bf16_optimizer = !r.has("zero_stage");
  o.zero_stage = bf16_optimizer ? 1 : detail::as_zero_stage(r.at("zero_stage"),
                                                            r.where("zero_stage"));
  o.partition_count = detail::as_ints(r.at("partition_count"), r.where("partition_count"));
  for (int64_t n : o.partition_count) o.world_size = std::max(o.world_size, n);
  DS_CHECK(o.world_size > 0, CheckpointError, r.where("partition_count"), " is empty or zero");
  const char* key = o.zero_stage <= 2 ? "single_partition_of_fp32_groups" : "fp32_flat_groups";
  o.fp32_groups = detail::as_flat_tensors(r.at(key), r.where(key));
  if (bf16_optimizer && r.has_value("group_paddings")) {
    runtime::drop_bf16_optimizer_padding(
        &o.fp32_groups, detail::as_ints(r.at("group_paddings"), r.where("group_paddings")));
  }
  return o;
}

// The rank files found vs expected: names the missing ranks rather than only counting.
void check_rank_files(const std::vector<std::string>& files, int64_t world_size,
                      const std::string& tag_dir) {
  static const std::regex rank_re("zero_pp_rank_([0-9]+)_");
  std::set<int64_t> ranks;
  for (const auto& f : files) {
    std::smatch m;
    const std::string name = f.substr(f.rfind('/') + 1);
    if (std::regex_search(name, m, rank_re)) ranks.insert(std::stoll(m[1]));
  }
  if (static_cast<int64_t>(files.size()) == world_size) return;
  std::ostringstream missing;
  for (int64_t r = 0, n = 0; r < world_size; ++r) {
    if (!ranks.count(r)) missing << (n++ ? ", " : "") << r;
  }
  DS_CHECK(false, CheckpointError, tag_dir, ": expected ", world_size,
           " '*_optim_states.pt' files (partition_count) but found ", files.size(),
           missing.str().empty() ? "" : "; missing data-parallel rank(s) " + missing.str(),
           ". A rank did not finish saving, or an older checkpoint with another world size was "
           "overwritten in this directory");
}

void merge_stage12(TensorDict& out, const ModelStateParts& model,
                   const std::vector<OptimizerParts>& ranks) {
  const int64_t world_size = ranks[0].world_size;
  const size_t groups = ranks[0].fp32_groups.size();
  DS_CHECK(groups == model.param_shapes.size(), CheckpointError, ranks[0].path, " has ", groups,
           " fp32 param groups but ", model.path, " lists param_shapes for ",
           model.param_shapes.size());
  // AutoEP's stacked weights: each expert-parallel rank's rows, joined below.
  std::map<std::string, std::map<int64_t, at::Tensor>> stacked;
  for (size_t g = 0; g < groups; ++g) {
    const auto& counts = ranks[0].partition_count;
    const int64_t count = g < counts.size() ? counts[g] : world_size;
    const int64_t align = 2 * count;
    auto aligned = [&](int64_t n) { return (n + align - 1) / align * align; };
    // Every rank's partition, or (an MoE expert group, partitioned over its
    // expert-data-parallel group) those of each expert-parallel rank's group.
    for (const auto& holders : detail::partition_holders(
             count, world_size, g, model.moe ? &*model.moe : nullptr, ranks[0].path)) {
      std::vector<at::Tensor> parts;
      for (int r : holders) {
        const auto& rank = ranks[static_cast<size_t>(r)];
        DS_CHECK(g >= rank.partition_count.size() || rank.partition_count[g] == count,
                 CheckpointError, rank.path, ": param group ", g, " is partitioned over ",
                 rank.partition_count[g], " ranks, over ", count, " in ", ranks[0].path);
        parts.push_back(rank.fp32_groups[g]);
      }
      const at::Tensor full = at::cat(parts);
      const int64_t available = full.numel();
      int64_t offset = 0;
      for (const auto& item : model.param_shapes[g]) {
        const int64_t n = numel_of(item.value());
        DS_CHECK(offset + n <= available, CheckpointError, model.path, ": parameter '",
                 item.key(), "' (group ", g, ") needs elements [", offset, ", ", offset + n,
                 ") but the ", holders.size(), " rank partitions hold only ", available,
                 " elements");
        const std::string name =
            model.moe ? model.moe->global_name(item.key(), holders[0]) : item.key();
        const at::Tensor value = full.narrow(0, offset, n).view(item.value());
        if (model.moe && model.moe->is_stacked(name)) {
          stacked[name].emplace(model.moe->stacked_ep_rank(name, holders[0]), value);
        } else {
          put(out, name, value);
        }
        offset += n;
      }
      // Padding only reaches the next multiple of 2*W: more left over means a layout mismatch.
      DS_CHECK(aligned(offset) == aligned(available), CheckpointError, model.path,
               ": consumed ", offset, " of the ", available, " elements of param group ", g,
               " (padding alignment ", align, "); the optimizer files do not belong to this "
               "model-states file");
    }
  }
  for (const auto& [name, rows] : stacked) {
    DS_CHECK(static_cast<int64_t>(rows.size()) == model.moe->stacked_ep_size(name),
             CheckpointError, model.path, ": AutoEP weight ", name, " has rows from ",
             rows.size(), " of its ", model.moe->stacked_ep_size(name),
             " expert-parallel ranks");
    std::vector<at::Tensor> parts;
    for (const auto& [ep_rank, t] : rows) parts.push_back(t);
    put(out, name, at::cat(parts));
  }
  // MoE: what the optimizer does not hold of the experts (frozen parameters, buffers) comes
  // whole from the expert files, by global id (AutoEP's stacked, every expert).
  if (model.moe) {
    for (const auto& item : model.moe->weights()) {
      if (!out.contains(item.key())) out.insert(item.key(), item.value().to(at::kFloat));
    }
    for (const auto& name : model.moe->stacked_names()) {
      if (!out.contains(name)) out.insert(name, model.moe->stacked_whole(name).to(at::kFloat));
    }
  }
}

void merge_stage3(TensorDict& out, const std::vector<ModelStateParts>& models,
                  const std::vector<OptimizerParts>& ranks, bool exclude_frozen) {
  const int64_t world_size = ranks[0].world_size;
  std::vector<at::Tensor> flat;
  for (const auto& rank : ranks) flat.push_back(at::cat(rank.fp32_groups));
  const int64_t per_rank = flat[0].numel();
  for (const auto& f : flat) {
    DS_CHECK(f.numel() == per_rank, CheckpointError, "ZeRO-3 rank partitions differ in size (",
             f.numel(), " vs ", per_rank, ")");
  }
  if (!exclude_frozen) {
    for (const auto& item : models[0].frozen_param_shapes) {
      std::vector<at::Tensor> fragments;
      for (const auto& model : models) {
        const at::Tensor* t = model.frozen_param_fragments.find(item.key());
        DS_CHECK(t != nullptr, CheckpointError, model.path,
                 ": no frozen_param_fragments entry for '", item.key(), "'");
        fragments.push_back(t->reshape(-1));
      }
      put(out, item.key(), at::cat(fragments).narrow(0, 0, numel_of(item.value())).view(item.value()));
    }
  }
  int64_t offset = 0;
  for (const auto& group : models[0].param_shapes) {
    for (const auto& item : group) {
      const int64_t n = numel_of(item.value());
      const int64_t part = (n + world_size - 1) / world_size;
      DS_CHECK(offset + part <= per_rank, CheckpointError, models[0].path, ": parameter '",
               item.key(), "' needs elements [", offset, ", ", offset + part,
               ") of each rank's partition, which holds ", per_rank);
      std::vector<at::Tensor> pieces;
      for (const auto& f : flat) pieces.push_back(f.narrow(0, offset, part));
      put(out, item.key(), at::cat(pieces).narrow(0, 0, n).view(item.value()));
      offset += part;
    }
  }
  DS_CHECK(offset == per_rank, CheckpointError, models[0].path, ": consumed ", offset,
           " of the ", per_rank, " elements of each rank's partition");
}

// Whether a ZeRO-3 tag folder holds AutoEP experts (cut for their expert-data-parallel groups,
// which ds_to_universal's reader joins).
bool zero3_autoep(const std::string& tag_dir) {
  const std::string path = tag_dir + "/" + zero3_model_states_file_name(0, 0);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  const ModelStates states = ModelStates::from_ivalue(load(path), path);
  for (const auto& [key, value] : states.client_state) {
    if (key != runtime::kAutoEPLayersKey) continue;
    return runtime::has_zero3_partitioned_experts(value, path);
  }
  return false;
}

// Model-parallel rank files or ZeRO-0's (its optimizer is in the model states; MoE ZeRO-0 has
// only expp_rank_<e> optimizer files), or ZeRO-3 with AutoEP: none of ZeRO 1-3's plain per-rank
// optimizer files.
bool read_through_model_parallel_sources(const std::string& tag_dir,
                                         const std::vector<std::string>& optim_files) {
  if (count_model_parallel_files(tag_dir) > 1) return true;
  struct stat st {};
  const std::string zero3_second = tag_dir + "/" + zero3_model_states_file_name(0, 1);
  if (::stat(zero3_second.c_str(), &st) == 0) return true;
  if (zero3_autoep(tag_dir)) return true;
  return std::none_of(optim_files.begin(), optim_files.end(), [](const std::string& f) {
    const std::string name = f.substr(f.rfind('/') + 1);
    return name.rfind("zero_pp_rank_", 0) == 0 || name.rfind("bf16_zero_pp_rank_", 0) == 0;
  });
}

// Beyond DeepSpeed's script, which reads the data-parallel partitions of model-parallel rank 0
// and ZeRO 1-3 only: the weights of several model-parallel ranks (tensor-parallel ranks,
// pipeline stages or both) or of ZeRO-0, as ds_to_universal reads them: each parameter whole
// from the first stage that has it, its tensor-parallel pieces joined along their split.
// Buffers come from the first rank that has them; tied aliases name their source's tensor.
TensorDict consolidate_model_parallel(const std::string& tag_dir,
                                      const ConsolidateOptions& options) {
  const detail::ModelParallelCheckpoint ckpt = detail::read_model_parallel_checkpoint(tag_dir);
  TensorDict out;
  std::vector<std::pair<std::string, std::string>> aliases;
  for (size_t m = 0; m < ckpt.ranks.size(); ++m) {
    const ModelStates states = ModelStates::from_ivalue(
        ckpt.ranks[m].model_states, tag_dir + ": model states of model-parallel rank " +
                                        std::to_string(m));
    for (const auto& name : states.buffer_names) {
      const at::Tensor* t = states.module.find(name);
      if (t != nullptr && !out.contains(name)) out.insert(name, t->to(at::kFloat));
    }
    if (states.shared_params) {
      aliases.insert(aliases.end(), states.shared_params->begin(), states.shared_params->end());
    }
  }
  auto saved_frozen = [&](const std::string& name) {
    return ckpt.ranks[static_cast<size_t>(ckpt.stage_of(name) * ckpt.tp)].frozen;
  };
  for (bool frozen : {true, false}) {  // DeepSpeed's order: frozen, then trainable
    if (frozen && options.exclude_frozen_parameters) continue;
    for (const auto& name : ckpt.names) {
      const auto& frozen_dtypes = saved_frozen(name);
      const auto dtype = frozen_dtypes.find(name);
      if ((dtype != frozen_dtypes.end()) != frozen) continue;
      // A frozen parameter in the dtype it was saved in, as ZeRO 1-3's frozen_param_fragments
      // give it (its fp32 here is that value upcast, so this is exact).
      const at::Tensor weight = *ckpt.full(name, "fp32");
      put(out, name, frozen ? weight.to(dtype->second) : weight);
    }
  }
  for (const auto& [alias, source] : aliases) {
    if (const at::Tensor* t = out.find(source)) put(out, alias, *t);
  }
  return out;
}

}  // namespace

TensorDict consolidate_zero_checkpoint(const std::string& checkpoint_dir,
                                       const std::optional<std::string>& tag,
                                       const ConsolidateOptions& options) {
  std::string resolved_tag;
  if (tag) {
    resolved_tag = *tag;
  } else {
    auto latest = read_latest(checkpoint_dir);
    DS_CHECK(latest.has_value(), CheckpointError, "unable to find 'latest' file at ",
             checkpoint_dir, "/", kLatestFileName, "; pass the tag explicitly");
    resolved_tag = *latest;
  }
  const std::string tag_dir = tag_directory(checkpoint_dir, resolved_tag);
  struct stat st {};
  DS_CHECK(::stat(tag_dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), CheckpointError,
           "checkpoint directory ", tag_dir, " does not exist");

  const auto optim_files = list_files_with_suffix(tag_dir, "_optim_states.pt");
  if (read_through_model_parallel_sources(tag_dir, optim_files)) {
    return consolidate_model_parallel(tag_dir, options);
  }
  std::vector<OptimizerParts> ranks;
  ranks.push_back(read_optimizer_states(optim_files[0]));
  const int64_t world_size = ranks[0].world_size;
  check_rank_files(optim_files, world_size, tag_dir);
  for (size_t i = 1; i < optim_files.size(); ++i) {
    ranks.push_back(read_optimizer_states(optim_files[i]));
    const auto& r = ranks.back();
    DS_CHECK(r.world_size == world_size && r.zero_stage == ranks[0].zero_stage, CheckpointError,
             r.path, ": partition_count ", r.world_size, " and zero_stage ", r.zero_stage,
             " differ from ", optim_files[0], " (", world_size, ", ", ranks[0].zero_stage,
             "): files of two different saves are mixed");
    DS_CHECK(r.fp32_groups.size() == ranks[0].fp32_groups.size(), CheckpointError, r.path,
             ": ", r.fp32_groups.size(), " param groups, ", optim_files[0], " has ",
             ranks[0].fp32_groups.size());
  }
  const int64_t stage = ranks[0].zero_stage;
  DS_CHECK(stage >= 1 && stage <= 3, CheckpointError, optim_files[0], ": unknown zero stage ",
           stage);

  std::vector<ModelStateParts> models;
  if (stage <= 2) {
    models.push_back(read_model_states(tag_dir, tag_dir + "/" + model_states_file_name(0)));
  } else {
    for (int64_t r = 0; r < world_size; ++r) {
      models.push_back(
          read_model_states(tag_dir, tag_dir + "/" + zero3_model_states_file_name(r, 0)));
    }
  }

  TensorDict out;
  for (const auto& b : models[0].buffers) put(out, b.key(), b.value());
  if (stage <= 2) {
    if (!options.exclude_frozen_parameters) {
      for (const auto& item : models[0].frozen_param_shapes) {
        const at::Tensor* t = models[0].frozen_param_fragments.find(item.key());
        DS_CHECK(t != nullptr, CheckpointError, models[0].path,
                 ": no frozen_param_fragments entry for '", item.key(), "'");
        put(out, item.key(), *t);
      }
    }
    merge_stage12(out, models[0], ranks);
  } else {
    merge_stage3(out, models, ranks, options.exclude_frozen_parameters);
  }
  for (const auto& [alias, source] : models[0].shared_params) {
    if (const at::Tensor* t = out.find(source)) put(out, alias, *t);
  }
  return out;
}

void check_output_outside_checkpoint(const std::string& output,
                                     const std::string& checkpoint_dir,
                                     const std::optional<std::string>& tag) {
  namespace fs = std::filesystem;
  // Symlinks resolved, "." and ".." gone, no trailing separator: comparable by components.
  auto resolved = [](const std::string& path) {
    std::error_code ec;
    fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
    if (ec) p = fs::absolute(path).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    return p;
  };
  auto same_file = [](const fs::path& a, const fs::path& b) {  // hard links too
    std::error_code ec;
    return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec) && !ec;
  };
  const fs::path out = resolved(output);
  const std::string hint =
      ": writing there would replace or mix with the checkpoint being read; choose an output "
      "outside the checkpoint's tag folder";
  const fs::path latest = resolved(checkpoint_dir + "/" + kLatestFileName);
  DS_CHECK(out != latest && !same_file(out, latest), UsageError, "output ", output, " is ",
           latest.string(), ", the checkpoint's 'latest' file", hint);
  const std::optional<std::string> name = tag ? tag : read_latest(checkpoint_dir);
  if (!name) return;  // nothing will be read; consolidation reports the missing `latest`
  const fs::path tag_dir = resolved(tag_directory(checkpoint_dir, *name));
  const auto [dir_end, out_it] = std::mismatch(tag_dir.begin(), tag_dir.end(), out.begin(), out.end());
  DS_CHECK(dir_end != tag_dir.end(), UsageError, "output ", output, " (", out.string(),
           ") is inside the checkpoint folder it reads (", tag_dir.string(), ")", hint);
  std::error_code ec;
  for (fs::directory_iterator it(tag_dir, ec), end; !ec && it != end; it.increment(ec)) {
    DS_CHECK(!same_file(out, it->path()), UsageError, "output ", output, " is the same file as ",
             it->path().string(), " (a hard link into the checkpoint it reads)", hint);
  }
}

}  // namespace deepspeed::checkpoint
