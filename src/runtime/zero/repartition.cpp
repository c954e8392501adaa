// See repartition.h. Padding and partition boundaries carry no meaning across layouts: only the
// parameters' elements in flattening order do (reference §6.4, the zero_to_fp32 walk).
#include "runtime/zero/repartition.h"

#include <algorithm>
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
