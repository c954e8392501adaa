// deepspeed.linear's OptimizedLinear (see include/deepspeed/linear.h). Initialisation follows
// DeepSpeed 0.19's LoRAOptimizedLinear: the base weight Xavier-uniform over its (shard size,
// output) view, A Kaiming-uniform(a = sqrt 5) after its Linear's own initialisation, B zeros.
#include <cmath>
#include <mutex>
#include <unordered_map>

#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/torch.h>

#include "deepspeed/comm.h"
#include "deepspeed/linear.h"
#include "util/check.h"

namespace deepspeed::linear {
namespace {

// Sharded base weights, keyed by TensorImpl (set_data keeps it); the weak reference tells a
// live entry from a dead parameter whose address was reused.
std::mutex& marks_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<const c10::TensorImpl*, c10::weak_intrusive_ptr<c10::TensorImpl>>& marks() {
  static std::unordered_map<const c10::TensorImpl*, c10::weak_intrusive_ptr<c10::TensorImpl>> m;
  return m;
}

void set_mark(const at::Tensor& p, bool on) {
  std::lock_guard<std::mutex> lock(marks_mutex());
  if (on) {
    marks().insert_or_assign(p.unsafeGetTensorImpl(),
                             c10::weak_intrusive_ptr<c10::TensorImpl>(p.getIntrusivePtr()));
  } else {
    marks().erase(p.unsafeGetTensorImpl());
  }
}

}  // namespace

bool is_sharded_base_weight(const at::Tensor& param) {
  if (!param.defined()) return false;
  std::lock_guard<std::mutex> lock(marks_mutex());
  auto it = marks().find(param.unsafeGetTensorImpl());
  if (it == marks().end()) return false;
  if (it->second.expired()) {
    marks().erase(it);
    return false;
  }
  return true;
}

OptimizedLinearImpl::OptimizedLinearImpl(int64_t input_dim, int64_t output_dim, bool bias,
                                         std::optional<LoRAConfig> lora_config,
                                         std::optional<QuantizationConfig> quantization_config,
                                         at::ScalarType dtype)
    : input_dim_(input_dim), output_dim_(output_dim), lora_(std::move(lora_config)), dtype_(dtype) {
  DS_CHECK(input_dim > 0 && output_dim > 0, UsageError, "OptimizedLinear: input_dim ", input_dim,
           " and output_dim ", output_dim, " must be positive");
  DS_CHECK(!quantization_config, NotSupportedError,
           "OptimizedLinear: quantization_config is not supported: DeepSpeed quantizes the base "
           "weight with its CUDA FP quantizer (deepspeed.ops.fp_quantizer), which this build has "
           "no kernel for");
  torch::NoGradGuard no_grad;
  if (!lora_) {
    // DeepSpeed returns a plain nn.Linear: its parameters and initialisation.
    torch::nn::Linear plain(torch::nn::LinearOptions(input_dim, output_dim).bias(bias));
    weight = register_parameter("weight", plain->weight.detach().to(dtype));
    if (bias) this->bias = register_parameter("bias", plain->bias.detach().to(dtype));
    return;
  }
  const LoRAConfig& c = *lora_;
  DS_CHECK(c.lora_r >= 1, UsageError, "LoRAConfig.lora_r is ", c.lora_r, "; expected >= 1");
  DS_CHECK(!c.offload && c.offload_ratio == 0.0, NotSupportedError,
           "LoRAConfig.offload / offload_ratio (", c.offload_ratio, ") are not supported: "
           "DeepSpeed offloads only quantized base weights (QuantizedParameter.offload), and "
           "quantization needs its CUDA FP quantizer");
  shards_ = c.base_weight_sharding;
  if (shards_ != 1) {
    DS_CHECK(comm::is_initialized() && shards_ == comm::get_world_size(), UsageError,
             "LoRAConfig.base_weight_sharding is ", shards_, "; base weight sharding is only "
             "supported across the world size (",
             comm::is_initialized() ? comm::get_world_size() : 0,
             comm::is_initialized() ? ")" : ": the process group is not initialized)");
    DS_CHECK(input_dim % shards_ == 0, UsageError, "LoRAConfig.base_weight_sharding ", shards_,
             " does not divide the input dimension ", input_dim);
  }
  // The whole weight is drawn and a sharded rank keeps its slice, so that the random stream
  // (and the adapters drawn next) do not depend on the sharding. (DeepSpeed draws one shard
  // with the shard's fan-in, the same on every rank.)
  at::Tensor w = torch::empty({output_dim, input_dim}, at::TensorOptions(dtype));
  torch::nn::init::xavier_uniform_(w.view({input_dim, output_dim}));
  if (shards_ > 1) {
    const int64_t local = output_dim * input_dim / shards_;
    w = w.reshape({-1}).narrow(0, comm::get_rank() * local, local).clone();
  }
  weight = register_parameter("weight", w, /*requires_grad=*/false);
  if (shards_ > 1) set_mark(weight, true);
  if (bias) {
    // Beyond DeepSpeed (its LoRAOptimizedLinear asserts bias=False): a bias is part of the
    // frozen pretrained base, as PEFT's bias="none" keeps it, whole on every rank. Drawn as
    // nn.Linear draws it, from the fan-in.
    const double bound = 1.0 / std::sqrt(static_cast<double>(input_dim));
    this->bias = register_parameter(
        "bias", torch::empty({output_dim}, at::TensorOptions(dtype)).uniform_(-bound, bound),
        /*requires_grad=*/false);
  }
  if (!c.delay_lora_init) init_lora();
}

void OptimizedLinearImpl::init_lora() {
  if (!lora_ || disabled_) return;
  weight.requires_grad_(false);
  if (initialized_) {
    // Again (init_lora(model) froze every parameter first): the adapters train.
    lora_weight_1->weight.requires_grad_(true);
    lora_weight_2->weight.requires_grad_(true);
    return;
  }
  torch::NoGradGuard no_grad;
  const auto make = [&](const char* name, int64_t in, int64_t out) {
    torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(false));
    l->to(dtype_);
    return register_module(name, l);
  };
  lora_weight_1 = make("lora_weight_1", input_dim_, lora_->lora_r);
  lora_weight_2 = make("lora_weight_2", lora_->lora_r, output_dim_);
  // As peft initialises LoRA: A Kaiming-uniform, B zeros, so the adapters start at zero.
  torch::nn::init::kaiming_uniform_(lora_weight_1->weight, std::sqrt(5.0));
  torch::nn::init::zeros_(lora_weight_2->weight);
  lora_weight_1->weight.requires_grad_(true);
  lora_weight_2->weight.requires_grad_(true);
  initialized_ = true;
}

void OptimizedLinearImpl::disable() {
  if (disabled_) return;
  disabled_ = true;
  torch::NoGradGuard no_grad;
  set_mark(weight, false);
  weight.set_data(torch::empty({output_dim_, input_dim_}, at::TensorOptions(dtype_)));
  weight.requires_grad_(false);
  if (lora_weight_1) {
    unregister_module("lora_weight_1");
    unregister_module("lora_weight_2");
    lora_weight_1 = nullptr;
    lora_weight_2 = nullptr;
  }
}

void OptimizedLinearImpl::load_base_weight(const at::Tensor& full, const std::string& name) {
  DS_CHECK(full.dim() == 2 && full.size(0) == output_dim_ && full.size(1) == input_dim_, UsageError,
           "OptimizedLinear ", name.empty() ? std::string("(unnamed)") : name, ": weight of shape ",
           full.sizes(), " does not fit [", output_dim_, ", ", input_dim_, "]");
  if (lora_ && !name.empty()) {
    bool targeted = false;
    for (const auto& t : lora_->target_mods) {
      targeted = targeted || name.find(t) != std::string::npos;
    }
    if (!targeted) disable();
  }
  torch::NoGradGuard no_grad;
  if (!sharded()) {
    weight.copy_(full);
    return;
  }
  const int64_t local = weight.numel();
  weight.copy_(full.reshape({-1}).narrow(0, comm::get_rank() * local, local));
}

at::Tensor OptimizedLinearImpl::full_weight() {
  if (!sharded()) return weight;
  torch::NoGradGuard no_grad;
  at::Tensor out = torch::empty({output_dim_ * input_dim_}, weight.options());
  comm::all_gather(out, weight.contiguous());
  return out.view({output_dim_, input_dim_});
}

at::Tensor OptimizedLinearImpl::merged_weight() {
  torch::NoGradGuard no_grad;
  at::Tensor w = full_weight().to(at::kFloat);
  if (!lora_enabled() || !initialized_) return w;
  return w + scaling() * torch::matmul(lora_weight_2->weight.to(at::kFloat),
                                       lora_weight_1->weight.to(at::kFloat));
}

at::Tensor OptimizedLinearImpl::forward(const at::Tensor& input) {
  namespace F = torch::nn::functional;
  if (!lora_enabled()) return F::linear(input, weight, bias.defined() ? bias : at::Tensor());
  DS_CHECK(initialized_, UsageError, "OptimizedLinear: init_lora was never called (LoRAConfig."
           "delay_lora_init is set); call deepspeed::linear::init_lora(model) before the forward");
  const at::Tensor base = sharded() ? full_weight() : weight;
  return F::linear(input, base, bias.defined() ? bias : at::Tensor()) +
         lora_weight_2(lora_weight_1(input)) * scaling();
}

void init_lora(torch::nn::Module& model) {
  for (auto& p : model.parameters()) p.requires_grad_(false);
  // Not modules(include_self): that needs `model` held by a shared_ptr.
  if (auto* self = dynamic_cast<OptimizedLinearImpl*>(&model)) self->init_lora();
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (auto* ol = dynamic_cast<OptimizedLinearImpl*>(m.get())) ol->init_lora();
  }
}

}  // namespace deepspeed::linear
