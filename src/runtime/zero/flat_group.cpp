// FlatGroup: flattening and partition arithmetic (see flat_group.h).
#include "runtime/zero/flat_group.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include "util/check.h"

namespace deepspeed::runtime {
namespace {

// Matches DeepSpeed: 2 elements of alignment per rank whatever the dtype.
constexpr int64_t kAlignment = 2;

std::vector<size_t> round_robin_order(size_t n, int world) {
  std::vector<size_t> order;
  order.reserve(n);
  for (int list = 0; list < world; ++list) {
    for (size_t i = static_cast<size_t>(list); i < n; i += static_cast<size_t>(world)) {
      order.push_back(i);
    }
  }
  return order;
}

}  // namespace

FlatGroup::FlatGroup(std::vector<at::Tensor> params, std::vector<std::string> names,
                     int world_size, int rank, bool round_robin)
    : world_size_(world_size), rank_(rank) {
  DS_INTERNAL_ASSERT(params.size() == names.size(), "one name per parameter");
  DS_INTERNAL_ASSERT(!params.empty(), "a FlatGroup needs parameters");
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (round_robin) order = round_robin_order(params.size(), world_size);

  const at::TensorOptions options = params[order[0]].options();
  for (size_t k : order) {
    const at::Tensor& p = params[k];
    DS_CHECK(p.scalar_type() == options.dtype().toScalarType() && p.device() == options.device(),
             UsageError, "ZeRO flattens each optimizer param group into one buffer, so its "
             "parameters must share dtype and device: '", names[k], "' is ", p.scalar_type(),
             " on ", p.device(), " while '", names[order[0]], "' is ",
             options.dtype().toScalarType(), " on ", options.device());
    slots_.push_back(FlatSlot{p, names[k], numel_, p.numel()});
    numel_ += p.numel();
  }
  const int64_t unit = kAlignment * world_size;
  padded_numel_ = (numel_ + unit - 1) / unit * unit;
  if (padded_numel_ == 0) padded_numel_ = unit;
  partition_numel_ = padded_numel_ / world_size;

  flat_ = at::zeros({padded_numel_}, options.requires_grad(false));
  {
    at::NoGradGuard no_grad;
    for (auto& s : slots_) {
      at::Tensor view = flat_.narrow(0, s.offset, s.numel);
      view.copy_(s.param.detach().reshape({-1}));
      // The Variable keeps its identity (and its AccumulateGrad hooks); only its storage moves.
      s.param.set_data(view.view(s.param.sizes()));
    }
  }

  const int64_t lo = static_cast<int64_t>(rank) * partition_numel_;
  const int64_t hi = lo + partition_numel_;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const auto& s = slots_[i];
    int64_t a = std::max(lo, s.offset);
    int64_t b = std::min(hi, s.offset + s.numel);
    if (a < b) owned_.push_back(OwnedPiece{i, a - s.offset, a - lo, b - a});
  }
}

at::Tensor FlatGroup::partition(int r) const {
  return flat_.narrow(0, static_cast<int64_t>(r) * partition_numel_, partition_numel_);
}

}  // namespace deepspeed::runtime
