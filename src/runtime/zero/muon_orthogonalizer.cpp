#include "runtime/zero/muon_orthogonalizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "util/check.h"

namespace deepspeed::runtime {

void orthogonalize_muon_partition(const FlatGroup& group, at::Tensor& grad_partition,
                                  at::Tensor& momentum, double beta, optim::NsMethod method,
                                  double loss_scale, const comm::Group& comm_group) {
  at::NoGradGuard no_grad;
  const int64_t slice = group.partition_numel();
  DS_INTERNAL_ASSERT(grad_partition.numel() == slice && momentum.numel() == slice,
                     "Muon under ZeRO: the gradient slice has ", grad_partition.numel(),
                     " elements and the momentum ", momentum.numel(), ", the partition ", slice);
  // 1. The momentum and the Nesterov blend, elementwise in the momentum's dtype.
  const at::Tensor grad = grad_partition.to(momentum.scalar_type());
  const at::Tensor finite = at::isfinite(grad).all();
  momentum.copy_(at::where(finite, at::lerp(momentum, grad, 1.0 - beta), momentum));
  at::Tensor blend = at::lerp(grad, momentum, beta).contiguous();
  // 2. The whole flat update.
  at::Tensor whole = blend;
  if (group.world_size() > 1) {
    whole = at::empty({slice * group.world_size()}, blend.options());
    comm::all_gather(whole, blend, /*async_op=*/false, comm_group);
  }
  // 3. The matrices this slice overlaps, orthogonalized; this slice of them kept.
  at::Tensor out = at::zeros_like(blend);  // the padding stays zero
  for (const OwnedPiece& piece : group.owned_pieces()) {
    const FlatSlot& slot = group.slots()[piece.slot];
    const at::Tensor matrix = whole.narrow(0, slot.offset, slot.numel).view(slot.param.sizes());
    const at::Tensor update = optim::orthogonalize(matrix, method);
    out.narrow(0, piece.partition_offset, piece.numel)
        .copy_(update.reshape({-1}).narrow(0, piece.param_offset, piece.numel));
  }
  if (loss_scale != 1.0) out.mul_(loss_scale);
  grad_partition.copy_(at::where(finite, out, grad));
}

}  // namespace deepspeed::runtime
