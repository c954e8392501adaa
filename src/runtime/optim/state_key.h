// The key torch::optim::Optimizer::state() uses for a parameter: the TensorImpl address as a
// string in LibTorch 1.13, as a void* since 2.x. Deduced from the map's type rather than the
// version, so that our optimizers and torch's (whose state we read and write for checkpoints)
// always agree.
#pragma once

#include <sstream>
#include <string>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace deepspeed::optim::detail {

using StateMap =
    std::remove_reference_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKey = typename StateMap::key_type;

// A template so that only the branch for this LibTorch's key type is compiled.
template <typename Key = StateKey>
Key state_key(const at::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    // Same text as c10::guts::to_string(TensorImpl*), which LibTorch 1.13's optimizers use.
    std::ostringstream os;
    os << static_cast<const void*>(param.unsafeGetTensorImpl());
    return os.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

}  // namespace deepspeed::optim::detail
