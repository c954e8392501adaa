// sparse_gradients: DeepSpeed reduces the gradient of each nn.Embedding / nn.EmbeddingBag weight
// as rows (its SparseTensor) instead of in a dense bucket: only the rows a rank's batch touched
// are nonzero, so each rank all-gathers its nonzero rows and their indices (padded to the longest
// rank's count) and every rank sums them into the dense gradient. Stage 0 only, as in DeepSpeed,
// whose ZeRO optimizers reduce every gradient densely.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "deepspeed/comm.h"

namespace deepspeed::runtime {

/// DeepSpeed's sparse_tensor_module_names: "<module>.weight" of every Embedding and
/// EmbeddingBag module of `model` (LibTorch's torch::nn ones) whose weight requires grad.
std::vector<std::string> sparse_gradient_names(torch::nn::Module& model);

/// DeepSpeed's sparse_allreduce of one gradient over `group`: its rows with a nonzero element,
/// multiplied by `scale` (the averaging), are all-gathered with their indices and summed, rank
/// by rank, into `grad` (which must be contiguous, at least 1-D). A collective: every rank of
/// `group` calls it for the same parameters in the same order. Returns the number of rows this
/// rank sent.
int64_t all_reduce_rows(at::Tensor& grad, const comm::Group& group, double scale);

}  // namespace deepspeed::runtime
