// Muon (MomentUm Orthogonalized by Newton-Schulz) as DeepSpeed trains with it: optimizer.type
// "Muon" builds MuonWithAuxAdam, which runs Muon on the hidden matrices and Adam on everything
// else (embeddings, the output head, biases and norms), chosen by parameter name and shape as
// DeepSpeed's set_optimizer_flags chooses. Under ZeRO 1/2 a Muon group's parameter is a flat
// partition; ZeRO orthogonalizes the gradients before the step (src/runtime/zero/
// muon_orthogonalizer.h) and the step only applies them. See docs/optimizers.md "Muon".
#pragma once

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/optimizers.h"

namespace deepspeed::optim {

/// The Newton-Schulz iteration a Muon group uses (its "ns_method").
enum class NsMethod {
  kStandard,  // the quintic iteration on X (Keller Jordan's zeropower_via_newtonschulz5)
  kGram,      // the same polynomial iterated on the Gram matrix X X^T, restarted at step 2
};

/// "standard" or "gram"; ConfigError naming `where` otherwise.
NsMethod parse_ns_method(const std::string& name, const std::string& where);
const char* ns_method_name(NsMethod method);

/// The dtype the iteration runs in, as DeepSpeed picks it per accelerator: on CUDA bf16 for
/// "standard" and fp16 for "gram"; on the CPU fp32 for both (DeepSpeed's CPU accelerator would
/// take bf16 for "standard", which LibTorch 1.13 multiplies slowly and, on AVX2-only CPUs,
/// accumulates in bf16).
at::ScalarType ns_compute_dtype(NsMethod method, const at::Device& device);

/// The approximate orthogonalization U V^T of the 2-D (or batched, [..., m, n]) matrix `g`
/// (U S V^T its SVD) by `steps` quintic Newton-Schulz steps with coefficients (3.4445, -4.7750,
/// 2.0315), computed in `compute` after scaling `g` to a Frobenius norm of at most 1. Returns
/// `compute`-typed values of g's shape.
at::Tensor newton_schulz(const at::Tensor& g, int64_t steps, NsMethod method,
                         at::ScalarType compute);

/// Newton-Schulz on `update` (a 4-D convolution filter as [out, in*kh*kw]) in
/// ns_compute_dtype, scaled by sqrt(max(1, rows / cols)) of its last two sizes as DeepSpeed
/// scales it; returned in update's dtype and shape.
at::Tensor orthogonalize(const at::Tensor& update, NsMethod method, int64_t ns_steps = 5);

/// DeepSpeed's muon_update: the momentum takes the gradient (momentum.lerp_(grad, 1 - beta),
/// left as it was when the gradient has a non-finite element), the update is the Nesterov blend
/// grad.lerp_(momentum, beta) (written into `grad`) or the momentum itself, orthogonalized
/// (4-D convolution filters as [out, in*kh*kw]) and scaled by sqrt(max(1, rows / cols)). A
/// non-finite gradient comes back as it is, so that an overflow check still sees it.
at::Tensor muon_update(const at::Tensor& grad, const at::Tensor& momentum, double beta,
                       NsMethod method, int64_t ns_steps = 5, bool nesterov = true);

/// Muon's own defaults (DeepSpeed's MuonWithAuxAdam): lr 0.02, momentum 0.95, weight_decay 0,
/// ns_method "gram"; its Adam half's: lr 3e-4, betas (0.9, 0.95), eps 1e-10, weight_decay 0.
struct MuonOptions {
  double lr = 0.02;
  double momentum = 0.95;
  double weight_decay = 0.0;
  NsMethod ns_method = NsMethod::kGram;
  /// A Muon group's options: use_muon true, lr, momentum, weight_decay, ns_method.
  GroupOptions group() const;
};

struct MuonAdamOptions {
  double lr = 3e-4;
  std::pair<double, double> betas{0.9, 0.95};
  double eps = 1e-10;
  double weight_decay = 0.0;
  /// An Adam group's options: use_muon false, lr, betas, eps, weight_decay, bias_correction.
  GroupOptions group() const;
};

/// DeepSpeed's MuonWithAuxAdam. Every group's options hold the flag "use_muon":
///  - true: p = p * (1 - lr * weight_decay) - lr * muon_update(grad, momentum_buffer); its
///    parameters are matrices (2-D or more). State: momentum_buffer, no step count;
///  - false: DeepSpeed's Adam (deepspeed::optim::Adam's update and kernels; decoupled weight
///    decay unless adam_w_mode is false). State: step, exp_avg, exp_avg_sq.
/// A Muon group's missing options take MuonOptions' defaults, an Adam group's MuonAdamOptions'.
/// A flat ZeRO partition registered with mark_orthogonalized() gets gradients that already hold
/// the orthogonalized update: its step applies the weight decay and the update only.
class Muon : public DsOptimizer {
 public:
  explicit Muon(std::vector<torch::optim::OptimizerParamGroup> groups, bool adam_w_mode = true,
                MuonOptions muon = {}, MuonAdamOptions adam = {});
  ~Muon() override;

  bool adam_w_mode() const;
  std::string type_name() const override { return "MuonWithAuxAdam"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  std::vector<std::string> state_names(const GroupOptions& group) const override;
  bool counts_steps(const GroupOptions& group) const override;

  /// Whether a group with these options runs Muon (its "use_muon" flag).
  static bool is_muon_group(const GroupOptions& group);
  /// `param` (a Muon group's flat partition) receives orthogonalized gradients from ZeRO.
  void mark_orthogonalized(const at::Tensor& param);
  bool orthogonalized(const at::Tensor& param) const;

 protected:
  void update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
              const GroupOptions& group) override;
  void update_group(std::vector<ParamUpdate>& params, const GroupOptions& group) override;
  bool applies_grad_scale(const ParamUpdate& u) const override;

 private:
  std::unique_ptr<Adam> adam_;  // the Adam half's update (owns no parameters)
  std::unordered_set<const void*> orthogonalized_;  // their data_ptr()s
};

}  // namespace deepspeed::optim
