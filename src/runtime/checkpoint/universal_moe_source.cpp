// ds_to_universal's view of an MoE checkpoint (see universal_source.h). Expert parameters are
// named "<layer>deepspeed_moe.experts.deepspeed_experts.<id>.<rest>": with a local id in the
// module, the optimizer states and param_shapes, with a global id in the expert files. Rank r
// holds global ids [ep_rank * n, (ep_rank + 1) * n), n = num_experts / ep_size, where ep_rank
// follows DeepSpeed's group layout (moe::expert_group_ranks) for the layer's ep_size.
#include "runtime/checkpoint/universal_source.h"

#include <algorithm>
#include <set>

#include <ATen/ATen.h>

#include "deepspeed/errors.h"
#include "deepspeed/moe.h"
#include "runtime/checkpoint/autoep_layers_metadata.h"
#include "runtime/checkpoint/moe_checkpoint.h"
#include "runtime/checkpoint/value_access.h"
#include "util/check.h"

namespace deepspeed::checkpoint::detail {
namespace {

using c10::IValue;

// An expert entry's name split around its expert id.
struct ExpertName {
  std::string layer;  // the MoE layer's key prefix, "" or "<module>."
  int64_t id = 0;
  std::string rest;  // after "<id>."
};

std::optional<ExpertName> parse_expert_name(const std::string& name) {
  const size_t at = name.find(runtime::kExpertKeyPrefix);
  if (at == std::string::npos || (at > 0 && name[at - 1] != '.')) return std::nullopt;
  const size_t digits = at + std::char_traits<char>::length(runtime::kExpertKeyPrefix);
  const size_t dot = name.find('.', digits);
  if (dot == std::string::npos || dot == digits) return std::nullopt;
  const std::string id = name.substr(digits, dot - digits);
  if (!std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return ExpertName{name.substr(0, at), std::stoll(id), name.substr(dot + 1)};
}

std::string expert_name(const ExpertName& e) {
  return e.layer + runtime::kExpertKeyPrefix + std::to_string(e.id) + "." + e.rest;
}

}  // namespace

std::optional<MoeExperts> MoeExperts::read(const std::string& dir, int64_t mp,
                                           const ModelStates& states, const std::string& path) {
  std::vector<int64_t> counts;
  std::map<int64_t, nlohmann::json> autoep;  // AutoEP's layers by moe_layer_id
  for (const auto& [key, value] : states.client_state) {
    if (key == runtime::kAutoEPLayersKey && !value.isNone()) {
      for (const auto& e : runtime::autoep_layers_json(value, path)) {
        DS_CHECK(e.is_object() && e.contains("moe_layer_id") && e.contains("expert_key_prefix") &&
                     e.contains("num_experts") && e.contains("ep_size"),
                 CheckpointError, path, ": an entry of ", runtime::kAutoEPLayersKey,
                 " lacks moe_layer_id, expert_key_prefix, num_experts or ep_size");
        autoep[e["moe_layer_id"].get<int64_t>()] = e;
      }
    }
    if (key != "num_experts") continue;
    for (const IValue& n : as_sequence(value, path + ": num_experts")) counts.push_back(n.toInt());
  }
  if (counts.empty()) return std::nullopt;
  MoeExperts out;
  out.world_ = static_cast<int>(std::max<int64_t>(1, states.dp_world_size));
  out.data_before_expert_ = states.ds_config.is_object() &&
                            states.ds_config.value("use_data_before_expert_parallelism", false);
  // Layer L's files hold its experts by global id, under the layer's own key prefix.
  for (size_t l = 0; l < counts.size(); ++l) {
    if (const auto a = autoep.find(static_cast<int64_t>(l)); a != autoep.end()) {
      out.read_stacked_layer(dir, mp, static_cast<int>(l), a->second, path);
      continue;
    }
    std::string layer;
    for (int64_t e = 0; e < counts[l]; ++e) {
      const std::string file = dir + "/" + runtime::expert_file_name(static_cast<int>(l), e,
                                                                      static_cast<int>(mp));
      for (const auto& item : tensors_from_ivalue(load(file), file)) {
        const auto name = parse_expert_name(item.key());
        // AutoEP's entries ("<layer>.experts.w1.<id>") slice a stacked weight, which only
        // ds_autoep_layers describes (read_stacked_layer).
        DS_CHECK(name || item.key().find(".experts.w") == std::string::npos, CheckpointError,
                 file, ": entry '", item.key(), "' is an AutoEP (expert_parallel) expert, but "
                 "the model states' ", runtime::kAutoEPLayersKey, " has no entry for MoE layer ",
                 l, ", so its stacked weights cannot be joined");
        DS_CHECK(name && name->id == e, CheckpointError, file, ": entry '", item.key(),
                 "' is not one of expert ", e, "'s");
        DS_CHECK(e == 0 || name->layer == layer, CheckpointError, file, ": entry '", item.key(),
                 "' belongs to another MoE layer than expert 0's (", layer, ")");
        layer = name->layer;
        out.weights_.insert(item.key(), item.value());
      }
    }
    DS_CHECK(!out.layers_.count(layer), CheckpointError, dir, ": MoE layers ", l,
             " and another share the key prefix '", layer, "'");
    out.layers_[layer].num_experts = counts[l];
  }
  // A layer's ep_size from its local ids: rank 0 holds ids [0, num_experts / ep_size).
  std::map<std::string, int64_t> local_count;
  for (const auto& group : states.param_shapes.value_or(std::vector<ShapeDict>{})) {
    for (const auto& item : group) {
      if (const auto name = parse_expert_name(item.key())) {
        int64_t& n = local_count[name->layer];
        n = std::max(n, name->id + 1);
      }
    }
  }
  for (auto& [layer, l] : out.layers_) {
    const auto n = local_count.find(layer);
    if (n == local_count.end()) continue;  // every expert frozen: taken whole from its file
    DS_CHECK(l.num_experts % n->second == 0 && out.world_ % (l.num_experts / n->second) == 0,
             CheckpointError, path, ": MoE layer '", layer, "' has ", l.num_experts,
             " experts and ", n->second, " local ones in param_shapes: no ep_size over ",
             out.world_, " ranks fits");
    l.ep_size = l.num_experts / n->second;
  }
  for (const auto& b : states.buffer_names) {
    if (const auto name = parse_expert_name(b)) {
      out.buffers_.push_back(name->layer + "|" + name->rest);
    }
  }
  return out;
}

bool MoeExperts::is_expert(const std::string& name) const {
  return parse_expert_name(name).has_value();
}

std::optional<std::string> MoeExperts::without_expert_id(const std::string& name) {
  const auto e = parse_expert_name(name);
  if (!e) return std::nullopt;
  return e->layer + runtime::kExpertKeyPrefix + "*." + e->rest;
}

int64_t MoeExperts::ep_rank_of(int rank, int64_t ep_size) const {
  const auto lists =
      moe::expert_group_ranks(world_, ep_size, data_before_expert_).expert_data_parallel;
  for (size_t i = 0; i < lists.size(); ++i) {
    if (std::find(lists[i].begin(), lists[i].end(), rank) != lists[i].end()) {
      return static_cast<int64_t>(i);
    }
  }
  DS_INTERNAL_ASSERT(false, "rank ", rank, " is in no expert-data-parallel group of ", world_);
  return 0;
}

std::string MoeExperts::global_name(const std::string& name, int rank) const {
  auto e = parse_expert_name(name);
  if (!e) return name;
  const auto l = layers_.find(e->layer);
  DS_CHECK(l != layers_.end() && l->second.ep_size > 0, CheckpointError, "ds_to_universal: ",
           "expert parameter '", name, "' belongs to no MoE layer of the checkpoint's expert "
           "files (num_experts)");
  const Layer& layer = l->second;
  e->id += ep_rank_of(rank, layer.ep_size) * (layer.num_experts / layer.ep_size);
  return expert_name(*e);
}

TensorDict MoeExperts::local_weights(int rank) const {
  TensorDict out;
  for (const auto& [name, layer] : stacked_) out.insert(name, stacked_local(name, rank));
  for (const auto& item : weights_) {
    auto e = parse_expert_name(item.key());
    const Layer& layer = layers_.at(e->layer);
    if (layer.ep_size == 0) continue;
    const int64_t n = layer.num_experts / layer.ep_size;
    const int64_t first = ep_rank_of(rank, layer.ep_size) * n;
    if (e->id < first || e->id >= first + n) continue;
    e->id -= first;
    out.insert(expert_name(*e), item.value());
  }
  return out;
}

void MoeExperts::read_stacked_layer(const std::string& dir, int64_t mp, int layer_id,
                                    const nlohmann::json& entry, const std::string& path) {
  const std::string prefix = entry["expert_key_prefix"].get<std::string>();
  // ZeRO-3's experts are in the optimizer shards, with no expert files.
  const bool files = entry.value("checkpoint_format", "") != runtime::kZero3PartitionedFormat;
  Layer layer;
  layer.num_experts = entry["num_experts"].get<int64_t>();
  layer.ep_size = entry["ep_size"].get<int64_t>();
  DS_CHECK(layer.num_experts > 0 && layer.ep_size > 0 && layer.num_experts % layer.ep_size == 0 &&
               world_ % layer.ep_size == 0,
           CheckpointError, path, ": AutoEP layer '", prefix, "' has ", layer.num_experts,
           " experts over ep_size ", layer.ep_size, " on ", world_, " ranks");
  const std::set<std::string> weights = {prefix + ".w1", prefix + ".w2", prefix + ".w3"};
  for (const auto& w : weights) stacked_[w] = layer;
  // Each expert's file holds "<prefix>.w1.<id>", ... (DeepSpeed's AutoEP entries).
  for (int64_t e = 0; files && e < layer.num_experts; ++e) {
    const std::string file = dir + "/" + runtime::expert_file_name(layer_id, e,
                                                                    static_cast<int>(mp));
    for (const auto& item : tensors_from_ivalue(load(file), file)) {
      const std::string& key = item.key();
      const size_t dot = key.rfind('.');
      DS_CHECK(dot != std::string::npos && weights.count(key.substr(0, dot)) &&
                   key.substr(dot + 1) == std::to_string(e),
               CheckpointError, file, ": entry '", key, "' is not one of AutoEP layer '", prefix,
               "''s weights of expert ", e);
      stacked_weights_.insert(key, item.value());
    }
  }
}

int64_t MoeExperts::stacked_ep_rank(const std::string& name, int rank) const {
  return ep_rank_of(rank, stacked_.at(name).ep_size);
}

int64_t MoeExperts::stacked_ep_size(const std::string& name) const {
  return stacked_.at(name).ep_size;
}

std::vector<std::string> MoeExperts::stacked_names() const {
  std::vector<std::string> out;
  for (const auto& item : stacked_) out.push_back(item.first);
  return out;
}

at::Tensor MoeExperts::stacked_whole(const std::string& name) const {
  return stacked_rows(name, 0, stacked_.at(name).num_experts);
}

at::Tensor MoeExperts::stacked_local(const std::string& name, int rank) const {
  const Layer& layer = stacked_.at(name);
  const int64_t n = layer.num_experts / layer.ep_size;
  return stacked_rows(name, ep_rank_of(rank, layer.ep_size) * n, n);
}

at::Tensor MoeExperts::stacked_rows(const std::string& name, int64_t first, int64_t count) const {
  std::vector<at::Tensor> rows;
  for (int64_t e = first; e < first + count; ++e) {
    const std::string key = name + "." + std::to_string(e);
    const at::Tensor* t = stacked_weights_.find(key);
    DS_CHECK(t != nullptr, CheckpointError, "ds_to_universal: no expert file holds '", key, "'");
    rows.push_back(*t);
  }
  return at::stack(rows);
}

void MoeExperts::join_stacked(const StackedPieces& pieces, const std::string& where,
                              UniversalSource* out) const {
  for (const auto& [name, by_key] : pieces) {
    const Layer& layer = stacked_.at(name);
    for (const auto& [key, by_rank] : by_key) {
      DS_CHECK(static_cast<int64_t>(by_rank.size()) == layer.ep_size, CheckpointError, where,
               ": AutoEP weight ", name, " has '", key, "' state from ", by_rank.size(),
               " of its ", layer.ep_size, " expert-parallel ranks");
      std::vector<at::Tensor> flats;
      std::vector<int64_t> shape = by_rank.begin()->second.shape;
      for (const auto& [ep_rank, piece] : by_rank) flats.push_back(piece.flat.reshape(-1));
      shape.at(0) = layer.num_experts;
      at::Tensor whole = at::cat(flats);
      DS_CHECK(whole.numel() == c10::multiply_integers(shape), CheckpointError, where,
               ": AutoEP weight ", name, "'s pieces do not make ", layer.num_experts,
               " experts of ", at::IntArrayRef(shape).slice(1));
      out->states[key][name] = runtime::SavedParam{whole, shape};
    }
    out->stacked_experts[name] = layer.num_experts;
  }
}

std::vector<std::vector<int>> MoeExperts::holders(int64_t count) const {
  DS_CHECK(count > 0 && world_ % count == 0, CheckpointError, "ds_to_universal: an expert group "
           "partitioned over ", count, " ranks does not divide the ", world_, " data-parallel "
           "ranks");
  return moe::expert_group_ranks(world_, world_ / count, data_before_expert_).expert_data_parallel;
}

void MoeExperts::add_frozen(UniversalSource* out) const {
  auto& fp32 = out->states["fp32"];
  for (const auto& [name, layer] : stacked_) {  // AutoEP weights no optimizer holds: whole
    if (fp32.count(name)) continue;
    const at::Tensor t = stacked_whole(name);
    fp32[name] = runtime::SavedParam{t.to(at::kFloat).reshape(-1), t.sizes().vec()};
    out->order.push_back(name);
    out->frozen.emplace(name, t.scalar_type());
    out->stacked_experts[name] = layer.num_experts;
  }
  for (const auto& item : weights_) {
    const auto e = parse_expert_name(item.key());
    const std::string buffer = e->layer + "|" + e->rest;
    if (fp32.count(item.key()) ||
        std::find(buffers_.begin(), buffers_.end(), buffer) != buffers_.end()) {
      continue;
    }
    const at::Tensor t = item.value().to(at::kFloat);
    fp32[item.key()] = runtime::SavedParam{t.reshape(-1), t.sizes().vec()};
    out->order.push_back(item.key());
    out->frozen.emplace(item.key(), item.value().scalar_type());
  }
}

std::vector<std::vector<int>> partition_holders(int64_t count, int64_t world, size_t g,
                                                const MoeExperts* moe, const std::string& path) {
  if (count == world) {
    std::vector<int> all(static_cast<size_t>(world));
    for (int r = 0; r < static_cast<int>(world); ++r) all[static_cast<size_t>(r)] = r;
    return {all};
  }
  DS_CHECK(moe != nullptr, CheckpointError, path, ": param group ", g, " is partitioned over ",
           count, " of ", world, " ranks, but the model states name no MoE experts "
           "(num_experts)");
  return moe->holders(count);
}

UniversalSource read_zero0_moe_source(const std::string& dir, int64_t mp_rank,
                                      const IValue& model_states, const std::string& path,
                                      const MoeExperts& moe) {
  // Expert-data-parallel rank 0 of each expert-parallel rank (of the largest ep_size) wrote
  // its whole optimizer: the dense parameters' (the same on every rank) and its experts'.
  const int files = runtime::count_expert_optimizer_files(dir, static_cast<int>(mp_rank));
  DS_CHECK(files > 0, CheckpointError, dir, ": an MoE checkpoint at ZeRO stage 0 without ",
           runtime::expert_optimizer_file_name(0, static_cast<int>(mp_rank)));
  const ModelStates states = ModelStates::from_ivalue(model_states, path);
  const auto writers = moe.holders(std::max<int64_t>(1, states.dp_world_size) / files);
  UniversalSource out;
  Dict model = model_states.toGenericDict().copy();
  model.insert_or_assign("optimizer", IValue());
  out.model_states = model;  // the module without the experts, as the source's
  MoeExperts::StackedPieces stacked;
  for (int i = 0; i < files; ++i) {
    const std::string file =
        dir + "/" + runtime::expert_optimizer_file_name(i, static_cast<int>(mp_rank));
    DictReader top(load(file), file);
    const int writer = writers.at(static_cast<size_t>(i)).front();
    // The stage-0 reader over this rank's whole model: its experts by local id in the module
    // (fp32: the masters are the weights).
    Dict mine = model_states.toGenericDict().copy();
    mine.insert_or_assign("optimizer", top.at("optimizer"));
    TensorDict module = tensors_from_ivalue(mine.at("module"), path + ": module");
    for (const auto& item : moe.local_weights(writer)) module.insert(item.key(), item.value());
    mine.insert_or_assign("module", ivalue_from_tensors(module));
    UniversalSource part = read_zero0_source(mine, file);
    if (i == 0) out.optimizer_state = part.optimizer_state;
    for (const auto& name : part.order) {
      if (moe.is_stacked(name)) {  // AutoEP: this file's rows, joined below
        const int64_t ep_rank = moe.stacked_ep_rank(name, writer);
        if (!stacked.count(name)) out.order.push_back(name);
        for (auto& [key, params] : part.states) {
          const auto p = params.find(name);
          if (p != params.end()) stacked[name][key].emplace(ep_rank, p->second);
        }
        const auto s = part.step.find(name);
        if (s != part.step.end()) out.step[name] = s->second;
        continue;
      }
      if (i > 0 && !moe.is_expert(name)) continue;  // the dense ones come from the first
      const std::string global = moe.global_name(name, writer);
      // A layer of a smaller ep_size has its experts in several files: the first is kept.
      if (out.states["fp32"].count(global)) continue;
      for (auto& [key, params] : part.states) {
        const auto p = params.find(name);
        if (p != params.end()) out.states[key][global] = p->second;
      }
      const auto s = part.step.find(name);
      if (s != part.step.end()) out.step[global] = s->second;
      out.order.push_back(global);
    }
  }
  moe.join_stacked(stacked, dir, &out);
  return out;
}

}  // namespace deepspeed::checkpoint::detail
