// deepspeed::moe: DeepSpeed's Mixture of Experts (deepspeed/moe/). An MoE layer replaces a dense
// MLP by `num_experts` copies of it ("experts") and a gate that sends each token to its top-1 or
// top-2 experts, up to a capacity per expert. With expert parallelism (ep_size > 1) each rank
// holds num_experts / ep_size experts; tokens travel to their experts' ranks and back by
// all-to-all over the expert-parallel group. The engine reduces expert gradients over the
// expert-data-parallel group (divided by the whole data-parallel size) and everything else over
// the data-parallel group. See docs/moe.md.
//
//   auto moe = deepspeed::moe::MoE(hidden, expert_mlp, options);   // options.num_experts, k, ...
//   auto [out, l_aux, exp_counts] = moe->forward(x);                // x: [..., hidden]
//   loss = task_loss + aux_loss_coef * l_aux;
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "deepspeed/comm.h"

namespace deepspeed::moe {

/// DeepSpeed's MoE(...) keyword arguments and defaults (deepspeed/moe/layer.py).
struct MoEOptions {
  int64_t num_experts = 1;              // experts per layer, over all ranks
  int64_t ep_size = 1;                  // ranks an MoE layer's experts are spread over
  int64_t k = 1;                        // top-1 or top-2 gating
  double capacity_factor = 1.0;         // capacity = ceil(tokens * k / num_experts * factor)
  double eval_capacity_factor = 1.0;    // the same in eval mode
  int64_t min_capacity = 4;             // capacity floor per expert
  bool use_residual = false;            // PR-MoE: mix in the dense expert by a learned coefficient
  std::string noisy_gate_policy = "None";  // "None", "Jitter" or "RSample" (top-1 only)
  bool drop_tokens = true;              // false: capacity = the busiest expert's count
  bool use_rts = true;                  // random token selection when an expert overflows
  bool top2_2nd_expert_sampling = true;  // Gumbel noise on the logits for the second expert
};

/// What a gate decides for S tokens and E experts (sharded_moe.py's top1gating/top2gating).
struct GateOutput {
  at::Tensor l_aux;            // the load-balancing loss, a scalar with grad
  at::Tensor combine_weights;  // [S, E, C]: token s's weight in slot c of expert e
  at::Tensor dispatch_mask;    // [S, E, C] bool: combine_weights != 0
  at::Tensor exp_counts;       // [E] int64: tokens routed to each expert before capacity
  int64_t capacity = 0;        // C
};

/// DeepSpeed's _capacity: max(ceil(num_tokens / num_experts * capacity_factor), min_capacity).
int64_t capacity(int64_t num_tokens, int64_t num_experts, double capacity_factor,
                 int64_t min_capacity);

/// top1gating on fp32 logits [S, E]. `ep_group` is used only with drop_tokens off (the capacity
/// is the busiest expert's count, MAX-reduced over the group). `used_token` ([S], optional)
/// masks tokens out of routing. noisy_gate_policy "RSample" adds Gumbel noise to the logits
/// that pick the expert. Without use_rts the first tokens (in order) win the slots.
GateOutput top1gating(const at::Tensor& logits, double capacity_factor, int64_t min_capacity,
                      const at::Tensor& used_token = {},
                      const std::string& noisy_gate_policy = "None", bool drop_tokens = true,
                      bool use_rts = true, const comm::Group* ep_group = nullptr);

/// top2gating on fp32 logits [S, E]: the second expert is the argmax of the logits (plus Gumbel
/// noise with top2_2nd_expert_sampling) without the first; capacity doubles; second choices take
/// slots after every first choice.
GateOutput top2gating(const at::Tensor& logits, double capacity_factor, int64_t min_capacity,
                      bool drop_tokens = true, const comm::Group* ep_group = nullptr,
                      bool top2_2nd_expert_sampling = true);

/// The expert-parallel and expert-data-parallel groups of one ep_size (DeepSpeed's
/// groups._create_expert_and_data_parallel / _create_expert_data_and_model_parallel, named
/// "ep_size_<e>").
struct ExpertGroups {
  std::string name;                 // "ep_size_<e>"
  int64_t ep_size = 1;
  comm::Group expert_parallel;      // the ranks a layer's experts are spread over
  comm::Group expert_data_parallel; // the ranks holding the same experts
  /// Every data-parallel group the groups were cut from (global ranks), in creation order.
  std::vector<std::vector<int>> data_parallel_groups;
};

/// Creates (once per name, collectively over the world: every rank must call it in the same
/// order) or returns the groups of `ep_size`, cut from every data-parallel group (the world
/// without `data_parallel`; with model parallelism each model-parallel rank's data-parallel
/// group, as DeepSpeed's _create_expert_data_and_model_parallel). Within a data-parallel group
/// of D ranks, E + D layout (DeepSpeed's default): expert-parallel groups are consecutive
/// members [0..e-1], [e..2e-1], ...; expert-data-parallel groups stride by e.
/// use_data_before_expert_parallelism swaps them. UsageError when ep_size does not divide the
/// data-parallel size, or when the groups of that name were made from other data-parallel
/// groups.
const ExpertGroups& create_expert_and_data_parallel(int64_t ep_size,
                                                    bool use_data_before_expert_parallelism,
                                                    const comm::Group* data_parallel = nullptr);
/// The groups of that name, or nullptr before they were created.
const ExpertGroups* find_expert_groups(const std::string& name);

/// The rank lists DeepSpeed makes for `world` ranks (pure arithmetic; the unit test's subject).
struct ExpertGroupRanks {
  std::vector<std::vector<int>> expert_parallel;
  std::vector<std::vector<int>> expert_data_parallel;
};
ExpertGroupRanks expert_group_ranks(int world, int64_t ep_size,
                                    bool use_data_before_expert_parallelism);

/// TopKGate: a bias-free fp32 Linear(hidden, num_experts) "wg" and top-1/top-2 gating.
class TopKGateImpl : public torch::nn::Module {
 public:
  TopKGateImpl(int64_t model_dim, const MoEOptions& options);
  GateOutput forward(const at::Tensor& input, const at::Tensor& used_token = {});
  void set_ep_group(const ExpertGroups* groups) { groups_ = groups; }

  torch::nn::Linear wg{nullptr};

 private:
  int64_t model_dim_;
  MoEOptions options_;
  const ExpertGroups* groups_ = nullptr;
};
TORCH_MODULE(TopKGate);

/// Experts: this rank's num_experts / ep_size copies of the expert ("deepspeed_experts").
class ExpertsImpl : public torch::nn::Module {
 public:
  ExpertsImpl(const torch::nn::AnyModule& expert, int64_t num_local_experts);
  /// For an expert type that is not Cloneable: `make_expert()` builds each local expert, which
  /// then takes the first one's parameters (the same start as DeepSpeed's deep copies).
  ExpertsImpl(const std::function<torch::nn::AnyModule()>& make_expert, int64_t num_local_experts);
  /// input [ep_size, num_local_experts, C, M]: chunk i goes through local expert i.
  at::Tensor forward(const at::Tensor& input);

  torch::nn::ModuleList deepspeed_experts{nullptr};

 private:
  std::vector<torch::nn::AnyModule> experts_;
};
TORCH_MODULE(Experts);

/// MOELayer: gate, dispatch by all-to-all, local experts, all-to-all back, weighted combine.
class MOELayerImpl : public torch::nn::Module {
 public:
  MOELayerImpl(TopKGate gate, Experts experts, int64_t ep_size, int64_t num_local_experts);
  /// Returns the combined output (input's shape); l_aux and exp_counts are kept as members.
  at::Tensor forward(const at::Tensor& input, const at::Tensor& used_token = {});
  void set_ep_group(const ExpertGroups* groups);
  const ExpertGroups* ep_groups() const { return groups_; }

  TopKGate gate{nullptr};
  Experts experts{nullptr};
  at::Tensor l_aux;
  at::Tensor exp_counts;

 private:
  int64_t ep_size_;
  int64_t num_local_experts_;
  const ExpertGroups* groups_ = nullptr;
};
TORCH_MODULE(MOELayer);

/// DeepSpeed's MoE layer. Parameter names follow DeepSpeed's (deepspeed_moe.gate.wg.weight,
/// deepspeed_moe.experts.deepspeed_experts.<local id>.*, mlp.*, coefficient.*), so checkpoints
/// line up. The expert is deep-copied num_experts / ep_size times (it must be Cloneable, as
/// torch::nn's modules are); with use_residual the expert itself becomes the dense "mlp".
class MoEImpl : public torch::nn::Module {
 public:
  MoEImpl(int64_t hidden_size, torch::nn::AnyModule expert, MoEOptions options = {});
  /// The same for an expert type that is not Cloneable: `make_expert()` builds each local expert
  /// (they start from the first one's parameters) and, with use_residual, the dense mlp.
  MoEImpl(int64_t hidden_size, const std::function<torch::nn::AnyModule()>& make_expert,
          MoEOptions options = {});

  /// (output, l_aux, exp_counts). hidden_states: [..., hidden_size].
  std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& hidden_states,
                                                         const at::Tensor& used_token = {});

  /// Creates (or finds) the "ep_size_<e>" groups, cut from the data-parallel groups (the world
  /// without `data_parallel`), and hands them to the layer. The engine calls it at
  /// initialization with its data-parallel group; collective over the world. Needed before
  /// forward when ep_size > 1.
  void set_deepspeed_parallelism(bool use_data_before_expert_parallelism = false,
                                 const comm::Group* data_parallel = nullptr);

  const MoEOptions& options() const { return options_; }
  int64_t num_local_experts() const { return num_local_experts_; }
  std::string expert_group_name() const { return "ep_size_" + std::to_string(options_.ep_size); }
  /// The global id of local expert i: ep_rank * num_local_experts + i.
  int64_t global_expert_id(int64_t local_id) const;
  /// The expert-parallel groups once set (nullptr before).
  const ExpertGroups* ep_groups() const { return deepspeed_moe->ep_groups(); }
  /// This rank's expert parameters (DeepSpeed's allreduce=False / group_name params).
  std::vector<at::Tensor> expert_parameters() const;

  MOELayer deepspeed_moe{nullptr};
  torch::nn::AnyModule mlp;               // use_residual only
  torch::nn::Linear coefficient{nullptr};  // use_residual only

 private:
  void build(Experts experts, torch::nn::AnyModule residual_mlp);

  int64_t hidden_size_;
  MoEOptions options_;
  int64_t num_local_experts_;
};
TORCH_MODULE(MoE);

/// Every MoE layer of `module` (itself included), in module order.
std::vector<std::shared_ptr<MoEImpl>> moe_layers(torch::nn::Module& module);

/// One kind of expert parameters of a model: those of the MoE layers sharing an ep_size.
struct ExpertParamGroup {
  const ExpertGroups* groups = nullptr;
  std::vector<at::Tensor> params;
};
/// The model's expert parameters by group name (empty for a model without MoE layers). Each
/// layer must have its groups set (set_deepspeed_parallelism).
std::vector<ExpertParamGroup> expert_param_groups(torch::nn::Module& module);

/// The engine's MoE setup: gives every MoE layer its groups (set_deepspeed_parallelism with the
/// config's use_data_before_expert_parallelism, cut from the data-parallel groups) and checks
/// that ep_size divides the data-parallel size and that groups a layer already had come from
/// this data-parallel group. Returns the expert parameter groups. Collective over the world.
std::vector<ExpertParamGroup> configure_moe(torch::nn::Module& module,
                                            bool use_data_before_expert_parallelism,
                                            const comm::Group& data_parallel_group);

}  // namespace deepspeed::moe
