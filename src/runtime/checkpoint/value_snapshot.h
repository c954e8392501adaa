// A checkpoint value frozen in host memory, for writers that finish after save_checkpoint
// returns (checkpoint.writer.decoupled).
#pragma once

#include <ATen/core/ivalue.h>

namespace deepspeed::checkpoint {

/// A copy of `value` that training can no longer change: containers rebuilt, every tensor's data
/// copied to host memory. save() writes the same bytes from the copy as from `value`: the same
/// tensor met twice is one copy met twice, tensors that cover one storage share one copy of it,
/// and a view is copied out compactly (as save() itself does). Throws NotSupportedError naming
/// `where` for a sparse or quantized tensor.
c10::IValue snapshot_for_save(const c10::IValue& value, const std::string& where);

}  // namespace deepspeed::checkpoint
