// Internals of Note [Python values in an IValue] shared by the pickle reader and writer.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/ivalue.h>

#include "deepspeed/checkpoint.h"

namespace deepspeed::checkpoint::detail {

inline constexpr const char* kSizeName = "torch.Size";
inline constexpr const char* kSetName = "builtins.set";

/// The deepest value the unpickler builds and the pickler writes; see Note [Nesting depth of
/// loaded values] in pickle_reader.cpp.
inline constexpr int kMaxNestingDepth = 1000;

/// A named tuple's qualified name and field names (both empty for a plain tuple or non-tuple).
struct NamedTupleView {
  std::string qualified_name;
  std::vector<std::string> fields;
};
NamedTupleView named_tuple_view(const c10::IValue& value);

/// The value as_python_object() read `object` from (a python_object / python_global /
/// python_set capsule).
c10::IValue python_value_of(PythonObject object);

/// A python_set() value (an object "builtins.set" whose one arg is the List of items).
bool is_python_set(const c10::IValue& value);

}  // namespace deepspeed::checkpoint::detail
