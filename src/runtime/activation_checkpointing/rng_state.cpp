// Generator state capture and restore (see rng_state.h).
#include "runtime/activation_checkpointing/rng_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <mutex>

#include "util/torch_compat.h"

namespace deepspeed::checkpointing::detail {
namespace {

// get_state/set_state are not synchronized by the generator itself: LibTorch's own callers hold
// its mutex (see ATen/core/Generator.h).
at::Tensor state_of(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_state_of(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

int cuda_devices() { return at::hasCUDA() ? at::detail::getCUDAHooks().getNumGPUs() : 0; }

}  // namespace

RngState RngState::capture() {
  RngState s;
  s.cpu = state_of(at::detail::getDefaultCPUGenerator());
  for (int d = 0; d < cuda_devices(); ++d) {
    s.cuda.push_back(state_of(compat::default_cuda_generator(d)));
  }
  return s;
}

void RngState::restore() const {
  set_state_of(at::detail::getDefaultCPUGenerator(), cpu);
  for (size_t d = 0; d < cuda.size(); ++d) {
    set_state_of(compat::default_cuda_generator(static_cast<int>(d)), cuda[d]);
  }
}

}  // namespace deepspeed::checkpointing::detail
