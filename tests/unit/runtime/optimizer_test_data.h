// Deterministic data for the optimizer tests: values in [-1, 1) on a 2^-20 grid (exact in fp32,
// so a double-precision reference sees the very inputs the optimizer does), as doubles for the
// reference and as tensors for the optimizer under test.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace deepspeed::optim::testdata {

inline std::vector<double> values(size_t n, uint64_t seed) {
  std::vector<double> out(n);
  uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (auto& v : out) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const int64_t grid = static_cast<int64_t>((x >> 33) % (2u << 20)) - (1 << 20);
    v = std::ldexp(static_cast<double>(grid), -20);
  }
  return out;
}

inline at::Tensor tensor(const std::vector<double>& v, at::ScalarType dtype = at::kFloat) {
  return at::tensor(v, at::kDouble).to(dtype);
}

inline std::vector<double> to_vector(const at::Tensor& t) {
  at::Tensor d = t.detach().to(at::kDouble).contiguous().reshape({-1});
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

inline double max_abs_diff(const at::Tensor& t, const std::vector<double>& ref) {
  auto got = to_vector(t);
  double worst = got.size() == ref.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    worst = std::max(worst, std::abs(got[i] - ref[i]));
  }
  return worst;
}

inline double norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

}  // namespace deepspeed::optim::testdata
