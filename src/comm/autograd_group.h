// A comm::Group carried from an autograd Function's forward to its backward: the context's
// saved_data holds IValues only, so the group travels in a capsule. For the collectives that are
// autograd functions (tensor-parallel regions, sequence-parallel exchanges).
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include "deepspeed/comm.h"

namespace deepspeed::comm {

namespace detail {
struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(Group g) : group(std::move(g)) {}
  Group group;
};
}  // namespace detail

inline void save_group(torch::autograd::AutogradContext* ctx, const Group& group) {
  ctx->saved_data["group"] =
      c10::IValue::make_capsule(c10::make_intrusive<detail::GroupHolder>(group));
}

inline const Group& saved_group(torch::autograd::AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<detail::GroupHolder>(
             ctx->saved_data.at("group").toCapsule())
      ->group;
}

}  // namespace deepspeed::comm
