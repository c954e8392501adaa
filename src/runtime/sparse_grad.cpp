// sparse_gradients (see the header).
#include "runtime/sparse_grad.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>

#include "util/check.h"

namespace deepspeed::runtime {

std::vector<std::string> sparse_gradient_names(torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const torch::nn::Module& m = *item.value();
    at::Tensor weight;
    if (const auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(&m)) weight = e->weight;
    if (const auto* e = dynamic_cast<const torch::nn::EmbeddingBagImpl*>(&m)) weight = e->weight;
    if (weight.defined() && weight.requires_grad()) names.push_back(item.key() + ".weight");
  }
  return names;
}

int64_t all_reduce_rows(at::Tensor& grad, const comm::Group& group, double scale) {
  DS_INTERNAL_ASSERT(grad.dim() >= 1 && grad.is_contiguous(), "all_reduce_rows: gradient of "
                     "shape ", grad.sizes(), " is not a contiguous tensor of rows");
  at::NoGradGuard no_grad;
  const int64_t num_rows = grad.size(0);
  at::Tensor rows = grad.view({num_rows, -1});
  const int64_t width = rows.size(1);
  // DeepSpeed's SparseTensor keeps the rows whose sum is nonzero; a row of nonzeros that sum
  // to exactly 0 would be lost there, so any nonzero element keeps a row here.
  const at::Tensor indices = rows.ne(0).any(1).nonzero().flatten();
  at::Tensor values = rows.index_select(0, indices);
  if (scale != 1.0) values.mul_(scale);

  const int w = group.size();
  const auto long_options = indices.options();
  at::Tensor count = at::full({1}, indices.numel(), long_options);
  at::Tensor counts = at::empty({w}, long_options);
  comm::all_gather(counts, count, /*async_op=*/false, group);
  const at::Tensor host_counts = counts.cpu();
  const int64_t longest = host_counts.max().item<int64_t>();
  rows.zero_();
  if (longest == 0) return 0;

  // Padded to the longest rank's count, as DeepSpeed's sparse_all_gather; the padding is dropped.
  at::Tensor sent_indices = at::zeros({longest}, long_options);
  sent_indices.narrow(0, 0, indices.numel()).copy_(indices);
  at::Tensor sent_values = at::zeros({longest, width}, values.options());
  sent_values.narrow(0, 0, values.size(0)).copy_(values);
  at::Tensor all_indices = at::empty({w * longest}, long_options);
  at::Tensor all_values = at::empty({w * longest * width}, values.options());
  comm::all_gather(all_indices, sent_indices, /*async_op=*/false, group);
  at::Tensor flat_values = sent_values.view({-1});
  comm::all_gather(all_values, flat_values, /*async_op=*/false, group);
  const at::Tensor by_rank = all_values.view({w, longest, width});
  for (int r = 0; r < w; ++r) {
    const int64_t n = host_counts[r].item<int64_t>();
    if (n == 0) continue;
    rows.index_add_(0, all_indices.narrow(0, static_cast<int64_t>(r) * longest, n),
                    by_rank[r].narrow(0, 0, n));
  }
  return indices.numel();
}

}  // namespace deepspeed::runtime
