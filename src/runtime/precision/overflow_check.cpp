// inf/nan detection over gradient lists, one reduction per tensor and one host sync per call;
// the cross-rank vote is a single 1-element all-reduce. The method is explained in the header.
#include "runtime/precision/overflow_check.h"

#include <ATen/ATen.h>

#include "deepspeed/comm.h"

namespace deepspeed::runtime {
namespace {

// Half-precision inf/nan: the exponent field (bits 10-14) is all ones.
constexpr int64_t kHalfExponentMask = 0x7C00;

// A 0-d bool tensor on x's device: true when x holds an inf or nan. Undefined when x cannot.
at::Tensor nonfinite_flag(const at::Tensor& x) {
  if (!x.defined() || x.numel() == 0) return {};
  const at::ScalarType st = x.scalar_type();
  if (st == at::kHalf) {
    return x.view(at::kShort).bitwise_and(kHalfExponentMask).max().eq(kHalfExponentMask);
  }
  if (at::isFloatingType(st) || at::isComplexType(st)) return at::isfinite(x.sum()).logical_not();
  return {};  // integer and bool tensors cannot hold inf or nan
}

}  // namespace

bool has_inf_or_nan(const at::Tensor& x) {
  at::Tensor flag = nonfinite_flag(x);
  return flag.defined() && flag.item<bool>();
}

bool has_inf_or_nan(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flags;
  flags.reserve(tensors.size());
  for (const auto& t : tensors) {
    at::Tensor f = nonfinite_flag(t);
    if (!f.defined()) continue;
    // Gather the verdicts where the first one lives so that .item() syncs once.
    if (!flags.empty() && f.device() != flags.front().device()) {
      f = f.to(flags.front().device(), /*non_blocking=*/true);
    }
    flags.push_back(std::move(f));
  }
  if (flags.empty()) return false;
  if (flags.size() == 1) return flags.front().item<bool>();
  return at::stack(flags).any().item<bool>();
}

bool any_rank_overflow(bool local_overflow, const comm::Group& group) {
  if (!comm::is_initialized()) return local_overflow;
  at::Tensor flag = at::full({1}, local_overflow ? 1.0f : 0.0f, at::kFloat);
  comm::all_reduce(flag, comm::ReduceOp::kMax, false, group);
  return flag.item<float>() > 0.0f;
}

}  // namespace deepspeed::runtime
