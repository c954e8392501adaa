// Muon's orthogonalization: the quintic Newton-Schulz iteration on X or on its Gram matrix, and
// DeepSpeed's muon_update around it (momentum, Nesterov blend, aspect-ratio scale). The
// products are written in DeepSpeed's order ((c * A) @ A, not c * (A @ A)) so that the same
// compute dtype gives the same rounding.
#include <cmath>

#include <ATen/ATen.h>

#include "deepspeed/muon.h"
#include "util/check.h"

namespace deepspeed::optim {
namespace {

constexpr double kA = 3.4445;
constexpr double kB = -4.7750;
constexpr double kC = 2.0315;

at::Tensor mT(const at::Tensor& x) { return x.transpose(-2, -1); }

// One quintic step X <- a X + (b A + (c A) A) X, A = X X^T.
at::Tensor quintic_step(const at::Tensor& x) {
  const at::Tensor a = at::matmul(x, mT(x));
  const at::Tensor b = kB * a + at::matmul(kC * a, a);
  return kA * x + at::matmul(b, x);
}

at::Tensor normalized(const at::Tensor& x) {
  return x / (x.norm(2, {-2, -1}, /*keepdim=*/true) + 1e-7);
}

// DeepSpeed's zeropower_via_newtonschulz5: normalized after the cast.
at::Tensor standard(const at::Tensor& g, int64_t steps, at::ScalarType compute) {
  const bool tall = g.size(-2) > g.size(-1);
  at::Tensor x = g.to(compute);
  if (tall) x = mT(x);
  x = normalized(x);
  for (int64_t i = 0; i < steps; ++i) x = quintic_step(x);
  return tall ? mT(x) : x;
}

// DeepSpeed's zeropower_via_gram_newtonschulz: normalized before the cast (in fp32 for fp16
// input), then the polynomial applied through Q (n x n) accumulated on R = X X^T, with X
// refreshed as Q X and Q restarted at step 2; square matrices take the standard iteration.
at::Tensor gram(const at::Tensor& g, int64_t steps, at::ScalarType compute) {
  const bool tall = g.size(-2) > g.size(-1);
  at::Tensor x = g.to(g.scalar_type() == at::kHalf ? at::kFloat : g.scalar_type());
  if (tall) x = mT(x);
  const int64_t n = x.size(-2);
  const int64_t m = x.size(-1);
  x = normalized(x).to(compute);
  if (m <= n) {
    for (int64_t i = 0; i < steps; ++i) x = quintic_step(x);
    return tall ? mT(x) : x;
  }
  constexpr int64_t kRestartAt = 2;
  at::Tensor r = at::matmul(x, mT(x));
  at::Tensor q;
  for (int64_t i = 0; i < steps; ++i) {
    if (i == kRestartAt) {
      x = at::matmul(q, x);
      r = at::matmul(x, mT(x));
      q = at::Tensor();
    }
    const at::Tensor z = kB * r + at::matmul(kC * r, r);
    if (!q.defined()) {
      q = z.clone();
      q.diagonal(0, -2, -1).add_(kA);
    } else {
      q = kA * q + at::matmul(z, q);
    }
    if (i < steps - 1 && i + 1 != kRestartAt) {
      const at::Tensor rz = kA * r + at::matmul(z, r);
      r = kA * rz + at::matmul(z, rz);
    }
  }
  return tall ? at::matmul(mT(x), mT(q)) : at::matmul(q, x);
}

}  // namespace

NsMethod parse_ns_method(const std::string& name, const std::string& where) {
  if (name == "gram") return NsMethod::kGram;
  if (name == "standard") return NsMethod::kStandard;
  throw ConfigError(where + " is \"" + name + "\"; expected \"gram\" or \"standard\"");
}

const char* ns_method_name(NsMethod method) {
  return method == NsMethod::kGram ? "gram" : "standard";
}

at::ScalarType ns_compute_dtype(NsMethod method, const at::Device& device) {
  if (!device.is_cuda()) return at::kFloat;
  return method == NsMethod::kGram ? at::kHalf : at::kBFloat16;
}

at::Tensor newton_schulz(const at::Tensor& g, int64_t steps, NsMethod method,
                         at::ScalarType compute) {
  DS_CHECK(g.dim() >= 2, UsageError, "Newton-Schulz orthogonalizes matrices; got a tensor of "
           "shape ", g.sizes());
  return method == NsMethod::kGram ? gram(g, steps, compute) : standard(g, steps, compute);
}

at::Tensor orthogonalize(const at::Tensor& update, NsMethod method, int64_t ns_steps) {
  DS_CHECK(update.dim() >= 2, UsageError, "Muon updates matrices; got an update of shape ",
           update.sizes(), " (give 1-D parameters to the Adam half: use_muon false)");
  const at::Tensor matrix =
      update.dim() == 4 ? update.reshape({update.size(0), -1}) : update;  // conv filters
  at::Tensor out =
      newton_schulz(matrix, ns_steps, method, ns_compute_dtype(method, update.device()));
  // DeepSpeed scales by the update's last two sizes (for a 4-D filter: its kernel's).
  const double rows = static_cast<double>(update.size(-2));
  const double cols = static_cast<double>(update.size(-1));
  if (rows > cols) out.mul_(std::sqrt(rows / cols));
  return out.to(update.scalar_type()).reshape(update.sizes());
}

at::Tensor muon_update(const at::Tensor& grad, const at::Tensor& momentum, double beta,
                       NsMethod method, int64_t ns_steps, bool nesterov) {
  DS_CHECK(momentum.sizes() == grad.sizes(), UsageError, "Muon: the momentum has shape ",
           momentum.sizes(), ", the gradient ", grad.sizes());
  // Matches DeepSpeed: a non-finite gradient leaves the momentum as it was and comes back as
  // the update, so that the overflow is still seen and the step skipped.
  const at::Tensor finite = at::isfinite(grad).all();
  momentum.copy_(at::where(finite, at::lerp(momentum, grad, 1.0 - beta), momentum));
  const at::Tensor update = nesterov ? grad.lerp_(momentum, beta) : momentum;
  return at::where(finite, orthogonalize(update, method, ns_steps), grad);
}

}  // namespace deepspeed::optim
