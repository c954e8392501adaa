// Typed reads of loaded values, and the JSON / TensorDict conversions of the public header.
#include "runtime/checkpoint/value_access.h"

#include <cmath>

#include "util/check.h"

namespace deepspeed::checkpoint {

using c10::IValue;

namespace detail {

int64_t as_int(const IValue& value, const std::string& where) {
  if (value.isInt()) return value.toInt();
  if (value.isBool()) return value.toBool() ? 1 : 0;
  auto object = as_python_object(value);
  if (object && object->args.size() == 1 && object->args[0].isInt()) {
    return object->args[0].toInt();  // IntEnum(value)
  }
  DS_CHECK(false, CheckpointError, where, " is a ",
           object ? object->class_path : std::string(value.tagKind()), ", expected an int");
  return 0;
}

int64_t as_zero_stage(const IValue& value, const std::string& where) {
  auto object = as_python_object(value);
  if (object && object->args.size() == 2 && object->args[1].isString() &&
      object->class_path.size() >= 7 &&
      object->class_path.compare(object->class_path.size() - 7, 7, "getattr") == 0) {
    // ZeroStageEnum's members (deepspeed/runtime/zero/config.py).
    static const std::pair<const char*, int64_t> kMembers[] = {
        {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3},
        {"max_stage", 3}};
    const std::string& name = object->args[1].toStringRef();
    for (const auto& [member, stage] : kMembers) {
      if (name == member) return stage;
    }
    DS_CHECK(false, CheckpointError, where, " is ZeroStageEnum.", name,
             ", which is not a ZeRO stage this reader knows");
  }
  return as_int(value, where);
}

double as_double(const IValue& value, const std::string& where) {
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  DS_CHECK(false, CheckpointError, where, " is a ", value.tagKind(), ", expected a float");
  return 0;
}

bool as_bool(const IValue& value, const std::string& where) {
  DS_CHECK(value.isBool(), CheckpointError, where, " is a ", value.tagKind(), ", expected a bool");
  return value.toBool();
}

std::string as_string(const IValue& value, const std::string& where) {
  DS_CHECK(value.isString(), CheckpointError, where, " is a ", value.tagKind(), ", expected a str");
  return value.toStringRef();
}

at::Tensor as_tensor(const IValue& value, const std::string& where) {
  DS_CHECK(value.isTensor(), CheckpointError, where, " is a ", value.tagKind(),
           ", expected a tensor");
  return value.toTensor();
}

std::vector<IValue> as_sequence(const IValue& value, const std::string& where) {
  if (value.isList()) return value.toListRef().vec();
  if (value.isTuple() && !is_torch_size(value)) return value.toTupleRef().elements().vec();
  DS_CHECK(false, CheckpointError, where, " is a ", value.tagKind(), ", expected a list");
  return {};
}

std::vector<int64_t> as_ints(const IValue& value, const std::string& where) {
  if (value.isInt()) return {value.toInt()};
  std::vector<int64_t> out;
  for (const auto& item : as_sequence(value, where)) out.push_back(as_int(item, where));
  return out;
}

std::vector<at::Tensor> as_flat_tensors(const IValue& value, const std::string& where) {
  std::vector<at::Tensor> out;
  for (const auto& item : as_sequence(value, where)) {
    out.push_back(as_tensor(item, where + "[" + std::to_string(out.size()) + "]").reshape(-1));
  }
  return out;
}

DictReader::DictReader(const IValue& value, std::string where)
    : dict_(new_dict()), where_(std::move(where)) {
  DS_CHECK(value.isGenericDict(), CheckpointError, where_, " is a ", value.tagKind(),
           ", expected a dict");
  dict_ = value.toGenericDict();
}

const IValue* DictReader::find(const std::string& key) const {
  auto it = dict_.find(IValue(key));
  return it == dict_.end() ? nullptr : &it->value();
}

bool DictReader::has_value(const std::string& key) const {
  const IValue* v = find(key);
  return v != nullptr && !v->isNone();
}

const IValue& DictReader::at(const std::string& key) const {
  const IValue* v = find(key);
  DS_CHECK(v != nullptr, CheckpointError, where_, ": missing key '", key, "'");
  return *v;
}

std::string DictReader::where(const std::string& key) const {
  return where_ + ": '" + key + "'";
}

}  // namespace detail

IValue ivalue_from_json(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return IValue();
    case json::value_t::boolean: return IValue(value.get<bool>());
    case json::value_t::number_integer: return IValue(value.get<int64_t>());
    case json::value_t::number_unsigned: return IValue(static_cast<int64_t>(value.get<uint64_t>()));
    case json::value_t::number_float: return IValue(value.get<double>());
    case json::value_t::string: return IValue(value.get<std::string>());
    case json::value_t::array: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (const auto& item : value) list.push_back(ivalue_from_json(item));
      return IValue(list);
    }
    case json::value_t::object: {
      Dict dict = new_dict();
      for (const auto& [key, item] : value.items()) dict.insert(key, ivalue_from_json(item));
      return IValue(dict);
    }
    default:
      DS_CHECK(false, CheckpointError, "JSON value of type ", value.type_name(),
               " has no Python equivalent");
  }
  return IValue();
}

json json_from_ivalue(const IValue& value, const std::string& where) {
  if (value.isNone()) return nullptr;
  if (value.isBool()) return value.toBool();
  if (value.isInt()) return value.toInt();
  if (value.isDouble()) return value.toDouble();
  if (value.isString()) return value.toStringRef();
  if (value.isList() || (value.isTuple() && !as_python_object(value))) {
    json array = json::array();
    size_t i = 0;
    for (const auto& item : detail::as_sequence(value, where)) {
      array.push_back(json_from_ivalue(item, where + "[" + std::to_string(i++) + "]"));
    }
    return array;
  }
  if (value.isGenericDict()) {
    json object = json::object();
    for (const auto& entry : value.toGenericDict()) {
      DS_CHECK(entry.key().isString(), CheckpointError, where,
               ": a dict with non-str keys cannot become JSON");
      const std::string& key = entry.key().toStringRef();
      object[key] = json_from_ivalue(entry.value(), where + "." + key);
    }
    return object;
  }
  DS_CHECK(false, CheckpointError, where, ": a ", value.tagKind(),
           " cannot be represented in JSON");
  return nullptr;
}

IValue ivalue_from_tensors(const TensorDict& tensors) {
  Dict dict = new_dict();
  for (const auto& item : tensors) dict.insert(item.key(), item.value());
  return IValue(dict);
}

TensorDict tensors_from_ivalue(const IValue& value, const std::string& where) {
  detail::DictReader reader(value, where);
  TensorDict out;
  for (const auto& entry : reader.dict()) {
    DS_CHECK(entry.key().isString(), CheckpointError, where, ": a state dict key is a ",
             entry.key().tagKind(), ", expected a str");
    const std::string& key = entry.key().toStringRef();
    out.insert(key, detail::as_tensor(entry.value(), reader.where(key)));
  }
  return out;
}

}  // namespace deepspeed::checkpoint
