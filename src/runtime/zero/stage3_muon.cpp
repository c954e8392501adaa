#include "runtime/zero/stage3_muon.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "util/check.h"

namespace deepspeed::runtime {
namespace {

// Step 3 for the entries [first, last) of `sg`, whose blends `gathered` holds as `world` copies
// of the segment of the flat that starts at entries[first].offset: rank r's copy is r's shards.
// Writes this rank's shard of each orthogonalized update into `out` (the flat's layout).
void orthogonalize_bucket(const Stage3SubGroup& sg, size_t first, size_t last,
                          const std::vector<PartitionedParam>& params, const at::Tensor& gathered,
                          int64_t segment, at::Tensor& out, optim::NsMethod method,
                          const comm::Group& group) {
  const int world = group.size(), rank = group.rank();
  const int64_t base = sg.entries[first].offset;
  // Each rank's share: entry k goes to rank k % world. Its updates travel packed in entry
  // order, padded to the largest share so that one all-gather carries them.
  std::vector<int64_t> share(static_cast<size_t>(world), 0);
  for (size_t k = first; k < last; ++k) share[k % world] += params[sg.entries[k].param].numel;
  const int64_t width = *std::max_element(share.begin(), share.end());
  at::Tensor packed = at::zeros({width}, gathered.options());
  int64_t at = 0;
  for (size_t k = first; k < last; ++k) {
    if (static_cast<int>(k % world) != rank) continue;
    const SubGroupEntry& e = sg.entries[k];
    const PartitionedParam& p = params[e.param];
    // The whole matrix: shard r of it is rank r's copy of the segment at the entry's place.
    const at::Tensor whole = gathered.view({world, segment})
                                 .narrow(1, e.offset - base, e.numel)
                                 .reshape({-1})
                                 .narrow(0, 0, p.numel)
                                 .view(p.param.sizes());
    packed.narrow(0, at, p.numel).copy_(optim::orthogonalize(whole, method).reshape({-1}));
    at += p.numel;
  }
  at::Tensor all = packed;
  if (world > 1) {
    all = at::empty({width * world}, packed.options());
    comm::all_gather(all, packed, /*async_op=*/false, group);
  }
  std::vector<int64_t> cursor(static_cast<size_t>(world), 0);
  for (size_t k = first; k < last; ++k) {
    const SubGroupEntry& e = sg.entries[k];
    const int64_t numel = params[e.param].numel;
    const int owner = static_cast<int>(k % world);
    const int64_t start = static_cast<int64_t>(rank) * e.numel;  // this rank's shard of it
    const int64_t kept = std::max<int64_t>(0, std::min(e.numel, numel - start));
    if (kept > 0) {
      out.narrow(0, e.offset, kept)
          .copy_(all.narrow(0, owner * width + cursor[owner] + start, kept));
    }
    cursor[owner] += numel;
  }
}

}  // namespace

Stage3Muon::Stage3Muon(optim::Muon& muon, const std::vector<Stage3SubGroup>& sub_groups,
                       int64_t bucket_numel)
    : muon_(muon), bucket_numel_(bucket_numel) {
  for (size_t k = 0; k < sub_groups.size(); ++k) {
    if (!optim::Muon::is_muon_group(muon.group_options(sub_groups[k].param_group))) continue;
    muon.mark_orthogonalized(sub_groups[k].master);
    sub_groups_.push_back(k);
  }
}

void Stage3Muon::orthogonalize(std::vector<Stage3SubGroup>& sub_groups,
                               const std::vector<PartitionedParam>& params,
                               const comm::Group& group, double loss_scale) {
  at::NoGradGuard no_grad;
  for (size_t index : sub_groups_) {
    Stage3SubGroup& sg = sub_groups[index];
    if (sg.entries.empty()) continue;
    // Looked up each time: loading a checkpoint replaces the groups' options.
    const optim::GroupOptions& options = muon_.group_options(sg.param_group);
    const double beta = options.number("momentum");
    const auto method = optim::parse_ns_method(options.text("ns_method"), "ns_method");
    at::Tensor& momentum = muon_.get_or_create_state(sg.master, options).tensor("momentum_buffer");
    DS_INTERNAL_ASSERT(sg.grad.numel() == sg.numel && momentum.numel() == sg.numel,
                       "Muon under ZeRO-3: sub-group ", index, " has ", sg.numel,
                       " elements, its gradient ", sg.grad.numel(), " and its momentum ",
                       momentum.numel());
    // 1. The momentum and the Nesterov blend, elementwise in the momentum's dtype.
    const at::Tensor grad = sg.grad.to(momentum.scalar_type());
    const at::Tensor finite = at::isfinite(grad).all();
    momentum.copy_(at::where(finite, at::lerp(momentum, grad, 1.0 - beta), momentum));
    const at::Tensor blend = at::lerp(grad, momentum, beta);
    // 2 and 3, a bucket of whole parameters at a time (at least one).
    at::Tensor out = at::zeros_like(blend);  // the padding stays zero
    for (size_t first = 0; first < sg.entries.size();) {
      size_t last = first;
      int64_t whole = 0;
      while (last < sg.entries.size() &&
             (last == first || whole + params[sg.entries[last].param].numel <= bucket_numel_)) {
        whole += params[sg.entries[last].param].numel;
        ++last;
      }
      const int64_t base = sg.entries[first].offset;
      const int64_t segment = sg.entries[last - 1].offset + sg.entries[last - 1].numel - base;
      at::Tensor gathered = blend.narrow(0, base, segment).contiguous();
      if (group.size() > 1) {
        at::Tensor mine = gathered;
        gathered = at::empty({segment * group.size()}, blend.options());
        comm::all_gather(gathered, mine, /*async_op=*/false, group);
      }
      orthogonalize_bucket(sg, first, last, params, gathered, segment, out, method, group);
      first = last;
    }
    if (loss_scale != 1.0) out.mul_(loss_scale);
    sg.grad.copy_(at::where(finite, out, grad));
  }
}

}  // namespace deepspeed::runtime
