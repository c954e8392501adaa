// pickle_value(): a c10::IValue as the pickle (protocol 2) that Python's torch.save writes into
// data.pkl, tensors as persistent storage references. The zip container is torch_file.cpp's.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include <ATen/core/ivalue.h>

namespace deepspeed::checkpoint::detail {

/// Receives each storage to be stored as record "data/<key>": `nbytes` bytes of CPU memory,
/// valid only during the call.
using StorageSink = std::function<void(const std::string& key, const void* data, size_t nbytes)>;

/// The pickle bytes of `value`; every storage is handed to `sink` once, as it is met, so that
/// copies made for views and device tensors live only while they are written. Throws
/// NotSupportedError naming the value's path for what Python could not represent.
std::string pickle_value(const c10::IValue& value, const StorageSink& sink);

}  // namespace deepspeed::checkpoint::detail
