// MoE, MOELayer, Experts and TopKGate (DeepSpeed's moe/layer.py, sharded_moe.py, experts.py).
// Dispatch and combine are DeepSpeed's dense einsums: [S, E, C] x [S, M] -> [E, C, M] and back.
// With ep_size > 1 the [E, C, M] block travels by all-to-all over the expert-parallel group
// (slice j, experts [j * local, (j + 1) * local), to expert-parallel rank j), and its gradient by
// the same all-to-all in backward. Every rank of the group sends and receives its full
// [E, C, M] block whatever the routing, so a rank whose experts get no token still takes part
// in every collective with zeros (Note [No tokens, no hang]).
#include <torch/autograd.h>
#include <torch/nn/functional/activation.h>

#include <optional>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "deepspeed/moe.h"
#include "util/check.h"

namespace deepspeed::moe {
namespace {

// Note [No tokens, no hang]
// The all-to-all's size is E * C * M on every rank of the group: C is the capacity (the same
// formula everywhere with drop_tokens, the MAX-reduced busiest count without), never the number
// of tokens a rank's experts got. A rank whose experts received nothing runs them on zero rows,
// sends zeros back and gets zero gradients, and issues the same collectives as its peers.
class AllToAll : public torch::autograd::Function<AllToAll> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const std::string& group_name) {
    ctx->saved_data["group"] = group_name;
    return exchange(input, group_name);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_output) {
    const std::string name = ctx->saved_data["group"].toStringRef();
    return {exchange(grad_output[0], name), at::Tensor()};
  }

 private:
  static at::Tensor exchange(const at::Tensor& input, const std::string& group_name) {
    const ExpertGroups* groups = find_expert_groups(group_name);
    DS_INTERNAL_ASSERT(groups != nullptr, "MoE all-to-all: no groups named ", group_name);
    at::Tensor in = input.contiguous();
    at::Tensor out = at::empty_like(in);
    comm::all_to_all_single(out, in, false, groups->expert_parallel);
    return out;
  }
};

// Restores the CPU generator's state when it goes out of scope.
class GeneratorStateGuard {
 public:
  GeneratorStateGuard() : gen_(at::detail::getDefaultCPUGenerator()), state_(gen_.get_state()) {}
  ~GeneratorStateGuard() { gen_.set_state(state_); }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;

 private:
  at::Generator gen_;
  at::Tensor state_;
};

void check_options(int64_t hidden_size, const MoEOptions& o) {
  DS_CHECK(hidden_size > 0, UsageError, "MoE: hidden_size must be positive (got ", hidden_size,
           ")");
  DS_CHECK(o.num_experts >= 1, UsageError, "MoE: num_experts must be >= 1 (got ", o.num_experts,
           ")");
  DS_CHECK(o.ep_size >= 1 && o.num_experts % o.ep_size == 0, UsageError,
           "MoE: Number of experts (", o.num_experts,
           ") should be divisible by expert parallel size (", o.ep_size, ")");
  DS_CHECK(o.k == 1 || o.k == 2, NotSupportedError, "MoE: k = ", o.k,
           " is not supported; only top-1 and top-2 gating (k = 1 or 2)");
  DS_CHECK(o.noisy_gate_policy == "None" || o.noisy_gate_policy == "Jitter" ||
               o.noisy_gate_policy == "RSample",
           UsageError, "MoE: Unsupported noisy_gate_policy: '", o.noisy_gate_policy,
           "'; expected 'None', 'Jitter' or 'RSample'");
  DS_CHECK(o.capacity_factor > 0 && o.eval_capacity_factor > 0, UsageError,
           "MoE: capacity_factor (", o.capacity_factor, ") and eval_capacity_factor (",
           o.eval_capacity_factor, ") must be positive");
  DS_CHECK(o.min_capacity >= 0, UsageError, "MoE: min_capacity must be >= 0 (got ",
           o.min_capacity, ")");
}

}  // namespace

TopKGateImpl::TopKGateImpl(int64_t model_dim, const MoEOptions& options)
    : model_dim_(model_dim), options_(options) {
  wg = register_module(
      "wg", torch::nn::Linear(torch::nn::LinearOptions(model_dim, options.num_experts).bias(false)));
}

GateOutput TopKGateImpl::forward(const at::Tensor& input, const at::Tensor& used_token) {
  at::Tensor x = input.to(at::kFloat);
  // Jitter: multiply the gate's input by U(1 - 1e-2, 1 + 1e-2) while training.
  if (options_.noisy_gate_policy == "Jitter" && is_training()) {
    x = x * (at::rand(x.sizes(), x.options()) * 2e-2 + (1.0 - 1e-2));
  }
  const at::Tensor logits = at::linear(x, wg->weight.to(at::kFloat));
  const double factor = is_training() ? options_.capacity_factor : options_.eval_capacity_factor;
  const comm::Group* ep = groups_ ? &groups_->expert_parallel : nullptr;
  if (options_.k == 1) {
    return top1gating(logits, factor, options_.min_capacity, used_token,
                      is_training() ? options_.noisy_gate_policy : "None", options_.drop_tokens,
                      options_.use_rts, ep);
  }
  return top2gating(logits, factor, options_.min_capacity, options_.drop_tokens, ep,
                    options_.top2_2nd_expert_sampling);
}

ExpertsImpl::ExpertsImpl(const torch::nn::AnyModule& expert, int64_t num_local_experts) {
  deepspeed_experts = register_module("deepspeed_experts", torch::nn::ModuleList());
  // A C++ clone() re-runs reset(), drawing fresh weights before it copies the original's; the
  // generator is put back so that, as with Python's deepcopy, what is built after the experts
  // (the gate, the rest of the model) does not depend on how many there are (ep_size).
  GeneratorStateGuard keep_generator;
  for (int64_t i = 0; i < num_local_experts; ++i) {
    torch::nn::AnyModule copy = expert.clone();
    deepspeed_experts->push_back(copy.ptr());
    experts_.push_back(std::move(copy));
  }
}

ExpertsImpl::ExpertsImpl(const std::function<torch::nn::AnyModule()>& make_expert,
                         int64_t num_local_experts) {
  deepspeed_experts = register_module("deepspeed_experts", torch::nn::ModuleList());
  torch::NoGradGuard no_grad;
  std::optional<GeneratorStateGuard> keep_generator;  // from the second expert on (see above)
  for (int64_t i = 0; i < num_local_experts; ++i) {
    if (i == 1) keep_generator.emplace();
    torch::nn::AnyModule expert = make_expert();
    DS_CHECK(!expert.is_empty(), UsageError, "MoE: make_expert() returned an empty module");
    if (i > 0) {
      const auto first = experts_[0].ptr()->parameters();
      const auto mine = expert.ptr()->parameters();
      DS_CHECK(first.size() == mine.size(), UsageError,
               "MoE: make_expert() built experts with different parameter lists");
      for (size_t k = 0; k < mine.size(); ++k) mine[k].copy_(first[k]);
    }
    deepspeed_experts->push_back(expert.ptr());
    experts_.push_back(std::move(expert));
  }
}

at::Tensor ExpertsImpl::forward(const at::Tensor& input) {
  const auto chunks = input.chunk(static_cast<int64_t>(experts_.size()), 1);
  std::vector<at::Tensor> outs;
  outs.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) outs.push_back(experts_[i].forward<at::Tensor>(chunks[i]));
  return at::cat(outs, 1);
}

MOELayerImpl::MOELayerImpl(TopKGate gate_in, Experts experts_in, int64_t ep_size,
                           int64_t num_local_experts)
    : ep_size_(ep_size), num_local_experts_(num_local_experts) {
  gate = register_module("gate", std::move(gate_in));
  experts = register_module("experts", std::move(experts_in));
}

void MOELayerImpl::set_ep_group(const ExpertGroups* groups) {
  DS_CHECK(groups != nullptr && groups->ep_size == ep_size_, UsageError,
           "MoE layer of ep_size ", ep_size_, " given the groups of another ep_size");
  groups_ = groups;
  gate->set_ep_group(groups);
}

at::Tensor MOELayerImpl::forward(const at::Tensor& input, const at::Tensor& used_token) {
  DS_CHECK(ep_size_ == 1 || groups_ != nullptr, UsageError, "MoE layer with ep_size ", ep_size_,
           " has no expert-parallel group: pass the model to deepspeed::initialize (or call "
           "set_deepspeed_parallelism()) before the first forward");
  const int64_t d_model = input.size(-1);
  const at::Tensor x = input.reshape({-1, d_model});
  GateOutput g = gate->forward(x, used_token);
  l_aux = g.l_aux;
  exp_counts = g.exp_counts;
  const int64_t E = g.combine_weights.size(1);
  const int64_t C = g.capacity;
  // "sec,sm->ecm": each slot gathers its token.
  at::Tensor dispatched =
      at::matmul(g.dispatch_mask.to(x.scalar_type()).reshape({x.size(0), E * C}).t(), x)
          .reshape({E, C, d_model});
  if (ep_size_ > 1) dispatched = AllToAll::apply(dispatched, groups_->name);
  dispatched = dispatched.reshape({ep_size_, num_local_experts_, -1, d_model});
  at::Tensor expert_output = experts->forward(dispatched);
  expert_output = expert_output.reshape({ep_size_ * num_local_experts_, -1, d_model});
  if (ep_size_ > 1) expert_output = AllToAll::apply(expert_output, groups_->name);
  // "sec,ecm->sm": each token sums its slots' outputs by their combine weights.
  const at::Tensor combined =
      at::matmul(g.combine_weights.to(x.scalar_type()).reshape({x.size(0), E * C}),
                 expert_output.reshape({E * C, d_model}));
  return combined.reshape(input.sizes());
}

MoEImpl::MoEImpl(int64_t hidden_size, torch::nn::AnyModule expert, MoEOptions options)
    : hidden_size_(hidden_size), options_(std::move(options)) {
  check_options(hidden_size, options_);
  DS_CHECK(!expert.is_empty(), UsageError, "MoE: the expert module is empty");
  num_local_experts_ = options_.num_experts / options_.ep_size;
  build(Experts(expert, num_local_experts_), expert);
}

MoEImpl::MoEImpl(int64_t hidden_size, const std::function<torch::nn::AnyModule()>& make_expert,
                 MoEOptions options)
    : hidden_size_(hidden_size), options_(std::move(options)) {
  check_options(hidden_size, options_);
  num_local_experts_ = options_.num_experts / options_.ep_size;
  Experts experts(make_expert, num_local_experts_);
  build(std::move(experts), options_.use_residual ? make_expert() : torch::nn::AnyModule());
}

void MoEImpl::build(Experts experts, torch::nn::AnyModule residual_mlp) {
  deepspeed_moe = register_module(
      "deepspeed_moe", MOELayer(TopKGate(hidden_size_, options_), std::move(experts),
                                options_.ep_size, num_local_experts_));
  if (options_.use_residual) {
    mlp = std::move(residual_mlp);
    register_module("mlp", mlp.ptr());
    coefficient = register_module("coefficient", torch::nn::Linear(hidden_size_, 2));
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> MoEImpl::forward(const at::Tensor& hidden_states,
                                                                const at::Tensor& used_token) {
  DS_CHECK(hidden_states.dim() >= 1 && hidden_states.size(-1) == hidden_size_, UsageError,
           "MoE: input's last dimension is ", hidden_states.sizes(), " but hidden_size is ",
           hidden_size_);
  at::Tensor output = deepspeed_moe->forward(hidden_states, used_token);
  if (options_.use_residual) {
    // PR-MoE: a learned 2-way softmax mixes the experts' output with the dense MLP's.
    const at::Tensor output_mlp = mlp.forward<at::Tensor>(hidden_states);
    const at::Tensor coef = at::softmax(coefficient->forward(hidden_states), -1);
    output = output * coef.narrow(-1, 0, 1) + output_mlp * coef.narrow(-1, 1, 1);
  }
  return {output, deepspeed_moe->l_aux, deepspeed_moe->exp_counts};
}

void MoEImpl::set_deepspeed_parallelism(bool use_data_before_expert_parallelism,
                                        const comm::Group* data_parallel) {
  if (deepspeed_moe->ep_groups() != nullptr) return;
  deepspeed_moe->set_ep_group(&create_expert_and_data_parallel(
      options_.ep_size, use_data_before_expert_parallelism, data_parallel));
}

int64_t MoEImpl::global_expert_id(int64_t local_id) const {
  const ExpertGroups* g = ep_groups();
  const int64_t ep_rank = g ? g->expert_parallel.rank() : 0;
  return ep_rank * num_local_experts_ + local_id;
}

std::vector<at::Tensor> MoEImpl::expert_parameters() const {
  return deepspeed_moe->experts->parameters();
}

}  // namespace deepspeed::moe
