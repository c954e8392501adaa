// Top-1 and top-2 gating (DeepSpeed's sharded_moe.py top1gating / top2gating): which expert(s)
// each token goes to, in which capacity slot, with which weight, and the load-balancing loss.
// Everything is fp32 and dense ([S, E, C] weights), as in DeepSpeed.
#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>

#include "deepspeed/moe.h"
#include "util/check.h"

namespace deepspeed::moe {
namespace {

// torch.distributions.Gumbel(0, 1).rsample: -log(-log(u)), u uniform in (0, 1) kept off 0 and 1
// by the dtype's tiny/eps (PyTorch clamps the same way).
at::Tensor gumbel_sample(const at::Tensor& like) {
  const double tiny = std::numeric_limits<float>::min();
  const double eps = std::numeric_limits<float>::epsilon();
  auto u = at::rand(like.sizes(), like.options()).clamp_(tiny, 1.0 - eps);
  return -at::log(-at::log(u));
}

// drop_tokens off: the busiest expert's count over the expert-parallel group, so that every rank
// of the group lays out [E, C, M] with the same C for the all-to-all.
int64_t max_count_over_group(const at::Tensor& exp_counts, const comm::Group* ep_group) {
  at::Tensor m = exp_counts.max().to(at::kLong).reshape({1}).clone();
  if (ep_group != nullptr && ep_group->valid() && ep_group->size() > 1) {
    comm::all_reduce(m, comm::ReduceOp::kMax, false, *ep_group);
  }
  return m.item<int64_t>();
}

void check_logits(const at::Tensor& logits) {
  DS_CHECK(logits.dim() == 2, UsageError, "MoE gating: logits must be [tokens, experts], got ",
           logits.sizes());
  DS_CHECK(logits.size(1) >= 1, UsageError, "MoE gating: no experts (logits ", logits.sizes(),
           ")");
}

// [S, E] weights and [S] slot of each token -> [S, E, C] combine weights.
at::Tensor spread_over_slots(const at::Tensor& weights_se, const at::Tensor& locations_s,
                             int64_t capacity) {
  auto slots = at::one_hot(locations_s, capacity).to(at::kFloat);  // [S, C]
  return weights_se.unsqueeze(2) * slots.unsqueeze(1);
}

}  // namespace

int64_t capacity(int64_t num_tokens, int64_t num_experts, double capacity_factor,
                 int64_t min_capacity) {
  // DeepSpeed computes (num_tokens / num_experts) * capacity_factor in fp32 and takes the ceil.
  const float per_expert = static_cast<float>(num_tokens) / static_cast<float>(num_experts);
  const auto c = static_cast<int64_t>(std::ceil(per_expert * static_cast<float>(capacity_factor)));
  return std::max(c, min_capacity);
}

GateOutput top1gating(const at::Tensor& logits, double capacity_factor, int64_t min_capacity,
                      const at::Tensor& used_token, const std::string& noisy_gate_policy,
                      bool drop_tokens, bool use_rts, const comm::Group* ep_group) {
  check_logits(logits);
  const int64_t S = logits.size(0);
  const int64_t E = logits.size(1);
  at::Tensor gates = at::softmax(logits, 1);
  int64_t cap = capacity(S, E, capacity_factor, min_capacity);

  const at::Tensor chooser =
      noisy_gate_policy == "RSample" ? logits.detach() + gumbel_sample(logits) : gates.detach();
  const at::Tensor indices1 = chooser.argmax(1);
  at::Tensor mask1 = at::one_hot(indices1, E);  // int64 [S, E]
  if (used_token.defined()) mask1 = mask1 * used_token.reshape({S, 1}).to(at::kLong);

  const at::Tensor exp_counts = mask1.sum(0).detach();
  if (!drop_tokens) cap = std::min(max_count_over_group(exp_counts, ep_group), S);

  // l_aux = E * sum_e mean_s(gates[:, e]) * mean_s(mask1[:, e])
  const at::Tensor me = gates.mean(0);
  const at::Tensor ce = mask1.to(at::kFloat).mean(0);
  const at::Tensor l_aux = (me * ce).sum() * static_cast<double>(E);

  DS_CHECK(S >= min_capacity, UsageError, "MoE top-1 gating: the number of tokens (", S,
           ") is smaller than min_capacity (", min_capacity,
           "); set min_capacity to 0 or increase the batch size");
  // Each expert keeps its top-`cap` tokens by priority: a uniform random number per token with
  // use_rts (Random Token Selection), otherwise the token order (earliest first).
  at::Tensor priority;
  if (use_rts) {
    priority = mask1.to(at::kFloat) * at::rand({S, E}, logits.options());
  } else {
    auto order = (at::arange(S, 0, -1, logits.options()) / static_cast<double>(S)).unsqueeze(1);
    priority = mask1.to(at::kFloat) * order;
  }
  const int64_t keep = std::min(cap, S);
  const at::Tensor top_idx = std::get<1>(priority.topk(keep, 0));  // [keep, E]
  mask1 = mask1 * at::zeros_like(mask1).scatter_(0, top_idx, 1);

  const at::Tensor locations1 = mask1.cumsum(0) - 1;
  const at::Tensor locations1_s = (locations1 * mask1).sum(1);
  const at::Tensor gated = gates * mask1.to(at::kFloat);

  GateOutput out;
  out.l_aux = l_aux;
  out.combine_weights = spread_over_slots(gated, locations1_s, cap);
  out.dispatch_mask = out.combine_weights.to(at::kBool);
  out.exp_counts = exp_counts;
  out.capacity = cap;
  return out;
}

GateOutput top2gating(const at::Tensor& logits_in, double capacity_factor, int64_t min_capacity,
                      bool drop_tokens, const comm::Group* ep_group,
                      bool top2_2nd_expert_sampling) {
  check_logits(logits_in);
  const int64_t E = logits_in.size(1);
  DS_CHECK(E >= 2, UsageError, "MoE top-2 gating needs at least 2 experts (got ", E, ")");
  const at::Tensor gates = at::softmax(logits_in, 1);

  const at::Tensor indices1 = gates.detach().argmax(1);
  at::Tensor mask1 = at::one_hot(indices1, E);

  // The second expert: argmax of the logits (plus Gumbel noise: the Gumbel-max trick samples
  // from the softmax) with the first expert excluded.
  at::Tensor logits = logits_in.detach();
  if (top2_2nd_expert_sampling) logits = logits + gumbel_sample(logits);
  const at::Tensor logits_except1 =
      logits.masked_fill(mask1.to(at::kBool), -std::numeric_limits<float>::infinity());
  const at::Tensor indices2 = logits_except1.argmax(1);
  at::Tensor mask2 = at::one_hot(indices2, E);

  const at::Tensor locations1 = mask1.cumsum(0) - 1;
  // Second choices take the slots after every first choice of their expert.
  const at::Tensor locations2 = mask2.cumsum(0) - 1 + mask1.sum(0, /*keepdim=*/true);

  // l_aux = E^2 * mean_e(me * ce), ce from the first choices.
  const at::Tensor me = gates.mean(0);
  const at::Tensor ce = mask1.to(at::kFloat).mean(0);
  const at::Tensor l_aux = (me * ce).mean() * static_cast<double>(E * E);

  const at::Tensor exp_counts = (mask1 + mask2).sum(0).detach();
  int64_t cap = 0;
  if (drop_tokens) {
    cap = capacity(logits_in.size(0), E, capacity_factor * 2, min_capacity);
    mask1 = mask1 * locations1.lt(cap);
    mask2 = mask2 * locations2.lt(cap);
  } else {
    cap = max_count_over_group(exp_counts, ep_group);
  }

  const at::Tensor locations1_s = (locations1 * mask1).sum(1);
  const at::Tensor locations2_s = (locations2 * mask2).sum(1);
  const at::Tensor mask1_f = mask1.to(at::kFloat);
  const at::Tensor mask2_f = mask2.to(at::kFloat);
  at::Tensor gates1_s = (gates * mask1_f).sum(1);
  at::Tensor gates2_s = (gates * mask2_f).sum(1);
  const at::Tensor denom_s =
      (gates1_s + gates2_s).clamp_min(std::numeric_limits<float>::epsilon());
  gates1_s = gates1_s / denom_s;
  gates2_s = gates2_s / denom_s;

  const at::Tensor gates1 = gates1_s.unsqueeze(1) * mask1_f;
  const at::Tensor gates2 = gates2_s.unsqueeze(1) * mask2_f;
  GateOutput out;
  out.l_aux = l_aux;
  out.combine_weights =
      spread_over_slots(gates1, locations1_s, cap) + spread_over_slots(gates2, locations2_s, cap);
  out.dispatch_mask = out.combine_weights.to(at::kBool);
  out.exp_counts = exp_counts;
  out.capacity = cap;
  return out;
}

}  // namespace deepspeed::moe
