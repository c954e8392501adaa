// See module_placement.h.
#include "runtime/accelerator/module_placement.h"

#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "runtime/zero/stage3_init.h"
#include "runtime/zero/stage3_param.h"

namespace deepspeed::runtime {

void move_module_to_device(torch::nn::Module& module, const c10::Device& device) {
  at::NoGradGuard no_grad;
  const auto move = [&](at::Tensor t) {  // a handle: set_data acts on the shared TensorImpl
    if (!t.defined() || t.device() == device) return;
    if (is_pre_partitioned(t)) {
      // A tensor of the parameter's shape whose storage belongs to the device's allocator,
      // released at once (one parameter's bytes at a time, briefly).
      const std::vector<int64_t> sizes = t.sizes().vec();
      t.set_data(at::empty(sizes, t.options().device(device)));
      free_storage(t);
    } else {
      t.set_data(t.detach().to(device));
    }
  };
  for (auto& p : module.parameters(/*recurse=*/true)) move(p);
  for (auto& b : module.buffers(/*recurse=*/true)) move(b);
}

}  // namespace deepspeed::runtime
