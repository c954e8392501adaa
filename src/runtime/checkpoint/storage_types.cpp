// The storage class table of torch/storage.py (_LegacyStorage subclasses), both directions.
#include "runtime/checkpoint/storage_types.h"

#include <utility>

#include "deepspeed/errors.h"
#include "util/check.h"

namespace deepspeed::checkpoint::detail {
namespace {

const std::pair<at::ScalarType, const char*> kStorageClasses[] = {
    {at::kDouble, "DoubleStorage"},   {at::kFloat, "FloatStorage"},
    {at::kHalf, "HalfStorage"},       {at::kBFloat16, "BFloat16Storage"},
    {at::kLong, "LongStorage"},       {at::kInt, "IntStorage"},
    {at::kShort, "ShortStorage"},     {at::kChar, "CharStorage"},
    {at::kByte, "ByteStorage"},       {at::kBool, "BoolStorage"},
    {at::kComplexFloat, "ComplexFloatStorage"}, {at::kComplexDouble, "ComplexDoubleStorage"},
};

}  // namespace

std::string storage_class_name(at::ScalarType dtype, const std::string& where) {
  for (const auto& [type, name] : kStorageClasses) {
    if (type == dtype) return name;
  }
  DS_CHECK(false, NotSupportedError, "checkpoint value ", where, ": tensors of dtype ", dtype,
           " cannot be saved (torch.save has no storage class for it)");
  return {};
}

std::optional<at::ScalarType> dtype_of_storage_class(const std::string& name) {
  for (const auto& [type, class_name] : kStorageClasses) {
    if (name == class_name) return type;
  }
  if (name == "UntypedStorage") return at::kByte;
  return std::nullopt;
}

}  // namespace deepspeed::checkpoint::detail
