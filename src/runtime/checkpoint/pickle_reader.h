// unpickle_value(): the data.pkl of a torch.save file back into a c10::IValue, the tensors'
// storages fetched from the zip container through a callback.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include <ATen/core/ivalue.h>
#include <c10/core/Storage.h>

namespace deepspeed::checkpoint::detail {

/// The bytes of storage record "data/<key>" (at least `nbytes` of them): called once per key.
using StorageSource = std::function<c10::Storage(const std::string& key, size_t nbytes)>;

/// Unpickles `size` bytes. `source` names the data in errors. Throws CheckpointError for
/// truncated or malformed data and for constructs outside torch.save's vocabulary (numpy
/// values other than numeric arrays and scalars, sparse tensors, protocol-0 text opcodes),
/// naming the byte offset.
c10::IValue unpickle_value(const char* data, size_t size, const StorageSource& storages,
                           const std::string& source);

}  // namespace deepspeed::checkpoint::detail
