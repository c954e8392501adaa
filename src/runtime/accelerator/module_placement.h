// Moving a model to the training device without touching what zero::Init partitioned.
#pragma once

#include <c10/core/Device.h>

namespace torch::nn {
class Module;
}

namespace deepspeed::runtime {

/// Module::to(device), except for parameters zero::Init already partitioned: their storage was
/// released (their shards wait for the ZeRO-3 engine), so there is nothing to copy, and reading
/// it would be out of bounds. Those become empty tensors of the same shape on `device`, still
/// released and still registered, which the engine gathers into there.
void move_module_to_device(torch::nn::Module& module, const c10::Device& device);

}  // namespace deepspeed::runtime
