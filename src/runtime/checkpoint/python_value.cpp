// Python values that have no c10::IValue of their own: torch.Size as a named tuple of ints;
// class instances, globals and sets as capsules. See Note [Python values in an IValue].
#include <utility>

#include <ATen/core/jit_type.h>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/python_value.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;

// Instances, globals and sets travel as a capsule around this holder: c10's named tuples and
// classes refuse fields of type Any, and these hold arbitrary values.
struct PythonObjectHolder : torch::CustomClassHolder {
  PythonObject object;
};

IValue make_object(PythonObject object) {
  auto holder = c10::make_intrusive<PythonObjectHolder>();
  holder->object = std::move(object);
  return IValue::make_capsule(std::move(holder));
}

}  // namespace

namespace detail {

IValue python_value_of(PythonObject object) { return make_object(std::move(object)); }

NamedTupleView named_tuple_view(const IValue& value) {
  NamedTupleView view;
  if (!value.isTuple()) return view;
  auto type = value.toTupleRef().type();
  if (!type || !type->name() || !type->schema()) return view;
  view.qualified_name = type->name()->qualifiedName();
  for (const auto& arg : type->schema()->arguments()) view.fields.push_back(arg.name());
  return view;
}

bool is_python_set(const IValue& value) {
  auto object = as_python_object(value);
  return object && object->class_path == kSetName && object->args.size() == 1 &&
         object->args[0].isList();
}

}  // namespace detail

IValue torch_size(c10::IntArrayRef shape) {
  std::vector<std::string> fields;
  std::vector<IValue> values;
  for (size_t i = 0; i < shape.size(); ++i) {
    fields.push_back("d" + std::to_string(i));
    values.emplace_back(shape[i]);
  }
  std::vector<c10::TypePtr> types(fields.size(), c10::IntType::get());
  auto type = c10::TupleType::createNamed(c10::QualifiedName(detail::kSizeName), fields, types);
  return c10::ivalue::Tuple::createNamed(std::move(values), std::move(type));
}

bool is_torch_size(const IValue& value) {
  return detail::named_tuple_view(value).qualified_name == detail::kSizeName;
}

Shape shape_from_ivalue(const IValue& value, const std::string& where) {
  DS_CHECK(value.isTuple() || value.isList(), CheckpointError, where,
           ": expected a shape (torch.Size, tuple or list of ints), found a ", value.tagKind());
  Shape shape;
  auto elements = value.isTuple() ? value.toTupleRef().elements().vec() : value.toListRef().vec();
  for (const auto& e : elements) {
    DS_CHECK(e.isInt() && e.toInt() >= 0, CheckpointError, where,
             ": a shape must hold non-negative ints, found ", e.tagKind());
    shape.push_back(e.toInt());
  }
  return shape;
}

IValue python_set(std::vector<IValue> items) {
  c10::impl::GenericList list(c10::AnyType::get());
  for (auto& item : items) list.push_back(std::move(item));
  PythonObject object;
  object.class_path = detail::kSetName;
  object.args = {IValue(std::move(list))};
  return make_object(std::move(object));
}

IValue python_global(const std::string& path) {
  DS_CHECK(path.find('.') != std::string::npos, UsageError, "python_global('", path,
           "'): expected module.name");
  PythonObject object;
  object.class_path = path;
  object.is_global = true;
  return make_object(std::move(object));
}

IValue python_object(const std::string& class_path, std::vector<IValue> args,
                     std::optional<Dict> state) {
  DS_CHECK(class_path.find('.') != std::string::npos, UsageError, "python_object('", class_path,
           "'): expected module.Class");
  PythonObject object;
  object.class_path = class_path;
  object.args = std::move(args);
  if (state) object.state = *state;
  return make_object(std::move(object));
}

std::optional<PythonObject> as_python_object(const IValue& value) {
  if (!value.isCapsule()) return std::nullopt;
  auto capsule = value.toCapsule();
  const auto* holder = dynamic_cast<const PythonObjectHolder*>(capsule.get());
  if (holder == nullptr) return std::nullopt;
  return holder->object;  // the copy shares `state` (c10 dicts are references)
}

Dict new_dict() { return Dict(c10::AnyType::get(), c10::AnyType::get()); }

}  // namespace deepspeed::checkpoint
