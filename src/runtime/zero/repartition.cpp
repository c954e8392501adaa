// See repartition.h. Padding and partition boundaries carry no meaning across layouts: only the
// parameters' elements in flattening order do (reference §6.4, the zero_to_fp32 walk).
#include "runtime/zero/repartition.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include <ATen/ATen.h>

#include "util/check.h"

namespace deepspeed::runtime {
namespace {

int64_t numel_of(const checkpoint::Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_text(const checkpoint::Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace

RepartitionedZeroState repartition_zero_state(const SavedZeroRanks& saved,
                                              const RepartitionLayout& layout) {
  namespace ckpt = checkpoint;
  using c10::IValue;
  using List = c10::impl::GenericList;
  RepartitionedZeroState out;
  const size_t ranks = saved.masters.size();
  const size_t saved_flats = saved.masters.front().size();

  // fp32 masters: every saved flat cut into parameters, every own flat assembled by name.
  SavedParams masters;
  for (size_t k = 0; k < saved_flats; ++k) {
    std::vector<at::Tensor> per_rank;
    for (size_t r = 0; r < ranks; ++r) per_rank.push_back(saved.masters[r][k].reshape({-1}));
    layout.split(k, per_rank, &masters);
  }
  for (size_t g = 0; g < layout.own_flats; ++g) {
    out.masters.push_back(layout.assemble(g, masters, at::kFloat));
  }
  if (saved.optimizer_states.empty()) return out;

  // Optimizer state, per saved param group: the entry of its first saved flat with state gives
  // the keys in their saved order; per-element tensors are gathered by parameter name over all
  // of the group's saved flats and re-laid per own flat.
  struct Key {
    std::string name;
    IValue scalar;  // None: per-element
    at::ScalarType dtype = at::kFloat;
  };
  const auto state_of = [&](size_t r) {
    return saved.optimizer_states[r].toGenericDict().at("state").toGenericDict();
  };
  ckpt::Dict base0 = saved.optimizer_states.front().toGenericDict();
  ckpt::Dict state0 = state_of(0);
  auto saved_groups = base0.at("param_groups").toListRef();
  std::vector<std::optional<std::vector<Key>>> keys_of_group(saved_groups.size());
  std::vector<std::map<std::string, SavedParams>> by_key(saved_groups.size());
  for (size_t pg = 0; pg < saved_groups.size(); ++pg) {
    for (const auto& id_value : saved_groups[pg].toGenericDict().at("params").toListRef()) {
      const int64_t id = id_value.toInt();
      if (!state0.contains(id)) continue;  // no step taken yet
      const size_t k = layout.saved_flat_of(pg, id);
      DS_CHECK(k < saved_flats, CheckpointError, saved.source, ": optimizer state for parameter ",
               id, " but only ", saved_flats, " saved flat groups");
      std::vector<Key> keys;
      for (const auto& item : state0.at(id).toGenericDict()) {
        const std::string name = item.key().toStringRef();
        const IValue& v = item.value();
        if (!(v.isTensor() && v.toTensor().dim() == 1 &&
              v.toTensor().numel() == saved.state_numel.at(k))) {
          keys.push_back(Key{name, v});
          continue;
        }
        keys.push_back(Key{name, IValue(), v.toTensor().scalar_type()});
        std::vector<at::Tensor> per_rank;
        for (size_t r = 0; r < ranks; ++r) {
          per_rank.push_back(state_of(r).at(id).toGenericDict().at(name).toTensor());
        }
        layout.split(k, per_rank, &by_key[pg][name]);
      }
      if (!keys_of_group[pg]) keys_of_group[pg] = std::move(keys);
    }
  }
  ckpt::Dict state = ckpt::new_dict();
  List groups(c10::AnyType::get());
  for (size_t pg = 0; pg < saved_groups.size(); ++pg) {
    ckpt::Dict group = saved_groups[pg].toGenericDict().copy();
    List ids(c10::AnyType::get());
    for (size_t g = 0; g < layout.own_flats; ++g) {
      if (layout.own_param_group[g] == pg) ids.push_back(static_cast<int64_t>(g));
    }
    group.insert_or_assign("params", ids);
    groups.push_back(group);
  }
  for (size_t g = 0; g < layout.own_flats; ++g) {
    const size_t pg = layout.own_param_group[g];
    if (pg >= keys_of_group.size() || !keys_of_group[pg]) continue;
    ckpt::Dict entry = ckpt::new_dict();
    for (const auto& key : *keys_of_group[pg]) {
      if (!key.scalar.isNone()) {
        entry.insert(key.name, key.scalar);
      } else {
        entry.insert(key.name, layout.assemble(g, by_key[pg][key.name], key.dtype));
      }
    }
    state.insert(static_cast<int64_t>(g), entry);
  }
  ckpt::Dict base = ckpt::new_dict();
  base.insert("state", state);
  base.insert("param_groups", groups);
  out.optimizer_state = base;
  return out;
}

void split_saved_group(const at::Tensor& full, const checkpoint::ShapeDict& shapes,
                       const std::string& source, SavedParams* out) {
  int64_t offset = 0;
  for (const auto& item : shapes) {
    const int64_t n = numel_of(item.value());
    DS_CHECK(offset + n <= full.numel(), CheckpointError, source, ": the saved partitions hold ",
             full.numel(), " elements but parameter '", item.key(), "' needs elements up to ",
             offset + n, " (a rank file missing or from another checkpoint?)");
    DS_CHECK(out->count(item.key()) == 0, CheckpointError, source, ": parameter '", item.key(),
             "' appears in two param groups of param_shapes");
    (*out)[item.key()] = SavedParam{full.narrow(0, offset, n), item.value()};
    offset += n;
  }
}

at::Tensor assemble_partition(const FlatGroupLayout& layout, const SavedParams& saved,
                              at::ScalarType dtype, const std::string& source) {
  at::Tensor out = at::zeros({layout.partition_numel}, at::TensorOptions().dtype(dtype));
  const int64_t begin = static_cast<int64_t>(layout.partition) * layout.partition_numel;
  const int64_t end = begin + layout.partition_numel;
  std::vector<std::string> problems;
  int64_t offset = 0;
  for (const auto& [name, shape] : layout.params) {
    const int64_t n = numel_of(shape);
    auto it = saved.find(name);
    if (it == saved.end()) {
      problems.push_back("'" + name + "' is not in the checkpoint");
    } else if (it->second.shape != shape) {
      problems.push_back("'" + name + "': checkpoint shape " + shape_text(it->second.shape) +
                         ", model shape " + shape_text(shape));
    } else {
      // The piece of this parameter that falls in [begin, end).
      const int64_t a = std::max(offset, begin);
      const int64_t b = std::min(offset + n, end);
      if (a < b) out.narrow(0, a - begin, b - a).copy_(it->second.flat.narrow(0, a - offset, b - a));
    }
    offset += n;
    if (problems.size() == 5) break;
  }
  if (!problems.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < problems.size(); ++i) os << (i ? "; " : "") << problems[i];
    DS_CHECK(false, CheckpointError, source,
             ": the checkpoint does not match the model's trainable parameters (first "
             "mismatches): ", os.str());
  }
  return out;
}

bool same_layout(const FlatGroupLayout& layout, const checkpoint::ShapeDict& shapes,
                 int64_t partitions) {
  if (partitions != layout.partitions || shapes.size() != layout.params.size()) return false;
  size_t i = 0;
  for (const auto& item : shapes) {
    if (item.key() != layout.params[i].first || item.value() != layout.params[i].second) {
      return false;
    }
    ++i;
  }
  return true;
}

std::vector<Stage3Slot> stage3_slots(const checkpoint::ShapeDict& shapes, int64_t world) {
  std::vector<Stage3Slot> slots;
  int64_t offset = 0;
  for (const auto& item : shapes) {
    const int64_t shard = (numel_of(item.value()) + world - 1) / world;
    slots.push_back(Stage3Slot{item.key(), item.value(), shard, offset});
    offset += shard;
  }
  return slots;
}

void split_stage3_flats(const std::vector<at::Tensor>& flats,
                        const std::vector<Stage3Slot>& slots, const std::string& source,
                        SavedParams* out) {
  for (const auto& slot : slots) {
    std::vector<at::Tensor> pieces;
    for (size_t r = 0; r < flats.size(); ++r) {
      DS_CHECK(slot.offset + slot.shard_numel <= flats[r].numel(), CheckpointError, source,
               ": rank ", r, "'s flat holds ", flats[r].numel(), " elements but parameter '",
               slot.name, "' needs elements up to ", slot.offset + slot.shard_numel);
      pieces.push_back(flats[r].reshape({-1}).narrow(0, slot.offset, slot.shard_numel));
    }
    DS_CHECK(out->count(slot.name) == 0, CheckpointError, source, ": parameter '", slot.name,
             "' appears in two sub-groups of param_shapes");
    (*out)[slot.name] = SavedParam{at::cat(pieces).narrow(0, 0, numel_of(slot.shape)), slot.shape};
  }
}

at::Tensor assemble_stage3_flat(const std::vector<Stage3Slot>& slots, int64_t numel, int rank,
                                const SavedParams& saved, at::ScalarType dtype,
                                const std::string& source) {
  at::Tensor out = at::zeros({numel}, at::TensorOptions().dtype(dtype));
  std::vector<std::string> problems;
  for (const auto& slot : slots) {
    auto it = saved.find(slot.name);
    if (it == saved.end()) {
      problems.push_back("'" + slot.name + "' is not in the checkpoint");
    } else if (it->second.shape != slot.shape) {
      problems.push_back("'" + slot.name + "': checkpoint shape " + shape_text(it->second.shape) +
                         ", model shape " + shape_text(slot.shape));
    } else {
      const int64_t begin = rank * slot.shard_numel;
      const int64_t n = std::clamp<int64_t>(it->second.flat.numel() - begin, 0, slot.shard_numel);
      if (n > 0) out.narrow(0, slot.offset, n).copy_(it->second.flat.narrow(0, begin, n));
    }
    if (problems.size() == 5) break;
  }
  if (!problems.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < problems.size(); ++i) os << (i ? "; " : "") << problems[i];
    DS_CHECK(false, CheckpointError, source,
             ": the checkpoint does not match the model's trainable parameters (first "
             "mismatches): ", os.str());
  }
  return out;
}

}  // namespace deepspeed::runtime
