// Reading loaded checkpoint dicts with errors that name the file and the key path
// ("ckpt/global_step10/mp_rank_00_model_states.pt: 'global_steps' is a str, expected an int").
#pragma once

#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "deepspeed/checkpoint.h"

namespace deepspeed::checkpoint::detail {

/// An int; also accepts a bool (Python's bool is an int) and an IntEnum value (DeepSpeed
/// pickles zero_stage as ZeroStageEnum).
int64_t as_int(const c10::IValue& value, const std::string& where);
/// DeepSpeed's zero_stage: an int, ZeroStageEnum(n) (Python <= 3.10) or
/// getattr(ZeroStageEnum, 'gradients') (Python 3.11+ pickles enum members by name).
int64_t as_zero_stage(const c10::IValue& value, const std::string& where);
/// A float; also accepts an int.
double as_double(const c10::IValue& value, const std::string& where);
bool as_bool(const c10::IValue& value, const std::string& where);
std::string as_string(const c10::IValue& value, const std::string& where);
at::Tensor as_tensor(const c10::IValue& value, const std::string& where);
/// The items of a list or tuple.
std::vector<c10::IValue> as_sequence(const c10::IValue& value, const std::string& where);
/// A list of ints, or one int as a list of one (ZeRO's partition_count: one per param group, a
/// single int in older files).
std::vector<int64_t> as_ints(const c10::IValue& value, const std::string& where);
/// A list of tensors, each flattened (ZeRO's fp32 partitions, one per param group or sub-group);
/// the errors name the item ("<where>[2]").
std::vector<at::Tensor> as_flat_tensors(const c10::IValue& value, const std::string& where);

/// A dict read from `where` ("<file>" or "<file>: optimizer_state_dict").
class DictReader {
 public:
  DictReader(const c10::IValue& value, std::string where);

  const c10::IValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  /// Present and not None.
  bool has_value(const std::string& key) const;
  /// Throws CheckpointError "<where>: missing key 'key'" when absent.
  const c10::IValue& at(const std::string& key) const;
  /// "<where>: 'key'", for the as_*() helpers.
  std::string where(const std::string& key) const;
  const std::string& where() const { return where_; }
  const Dict& dict() const { return dict_; }

  int64_t get_int(const std::string& key) const { return as_int(at(key), where(key)); }
  double get_double(const std::string& key) const { return as_double(at(key), where(key)); }
  bool get_bool(const std::string& key) const { return as_bool(at(key), where(key)); }
  std::string get_string(const std::string& key) const { return as_string(at(key), where(key)); }

 private:
  Dict dict_;
  std::string where_;
};

}  // namespace deepspeed::checkpoint::detail
