// The parameters of a bf16 model, and their comparison bit for bit, for the tests that hold an
// engine to a one-process reference (master weights, gradient accumulation).
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::testing {

/// Detached copies of `model`'s parameters, in order.
inline std::vector<at::Tensor> params_of(torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  for (auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

/// Each of `got` is bf16 and equal to its twin in `want`; a difference is reported with its
/// largest element.
inline void expect_bf16_params_equal(const std::vector<at::Tensor>& got,
                                     const std::vector<at::Tensor>& want,
                                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].scalar_type(), torch::kBFloat16) << what;
    EXPECT_TRUE(torch::equal(got[i], want[i]))
        << what << ", tensor " << i << ": max difference "
        << (got[i].to(torch::kFloat) - want[i].to(torch::kFloat)).abs().max().item<double>();
  }
}

}  // namespace deepspeed::testing
