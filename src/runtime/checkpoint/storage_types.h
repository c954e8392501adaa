// Python's typed storage classes (torch.FloatStorage, ...) <-> dtypes: the persistent ids of
// torch.save name the storage class, not the dtype.
#pragma once

#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

namespace deepspeed::checkpoint::detail {

/// "FloatStorage" for kFloat, ...; throws NotSupportedError naming `where` for dtypes torch.save
/// cannot store (none in practice: every dense dtype has a class).
std::string storage_class_name(at::ScalarType dtype, const std::string& where);
/// The dtype of "FloatStorage", ..., or nullopt for an unknown name. UntypedStorage (bytes) is
/// kByte.
std::optional<at::ScalarType> dtype_of_storage_class(const std::string& name);

}  // namespace deepspeed::checkpoint::detail
