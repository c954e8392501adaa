// TokenChoiceMoE (see auto_ep.h). Each token's k (expert, score) pairs become k rows; the rows
// are sorted by expert so that every expert's rows are one block, the experts run, and each row
// goes back to its token, summed (index_add). Sharded (AutoEP), the sorted blocks of experts
// [j * L, (j + 1) * L) travel to expert-parallel rank j (Note [Variable all-to-all]).
#include <torch/autograd.h>

#include <limits>

#include <ATen/ATen.h>

#include "deepspeed/auto_ep.h"
#include "util/check.h"

namespace deepspeed::moe {
namespace {

// Note [Variable all-to-all]
// Unlike DeepSpeed's MoE layer (capacity slots, the same size on every rank), a dropless block
// sends each rank exactly the rows routed to its experts. The ranks first swap their per-expert
// row counts (an all-to-all of E integers) so that each knows what it receives; the rows then
// move by one all-to-all with those split sizes, and their gradients by the same exchange with
// the sizes swapped. A rank whose experts got no row still takes part, sending and receiving
// zero rows, so every rank of the group issues the same collectives.
class AllToAllV : public torch::autograd::Function<AllToAllV> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const std::vector<int64_t>& output_splits,
                            const std::vector<int64_t>& input_splits,
                            const std::string& group_name) {
    ctx->saved_data["out"] = output_splits;
    ctx->saved_data["in"] = input_splits;
    ctx->saved_data["group"] = group_name;
    return exchange(input, output_splits, input_splits, group_name);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_output) {
    const auto out = ctx->saved_data["out"].toIntVector();
    const auto in = ctx->saved_data["in"].toIntVector();
    const std::string name = ctx->saved_data["group"].toStringRef();
    return {exchange(grad_output[0], in, out, name), at::Tensor(), at::Tensor(), at::Tensor()};
  }

 private:
  static at::Tensor exchange(const at::Tensor& input, const std::vector<int64_t>& output_splits,
                             const std::vector<int64_t>& input_splits,
                             const std::string& group_name) {
    const ExpertGroups* groups = find_expert_groups(group_name);
    DS_INTERNAL_ASSERT(groups != nullptr, "TokenChoiceMoE all-to-all: no groups named ",
                       group_name);
    int64_t rows = 0;
    for (int64_t s : output_splits) rows += s;
    std::vector<int64_t> shape = input.sizes().vec();
    shape[0] = rows;
    at::Tensor in = input.contiguous();
    at::Tensor out = at::empty(shape, input.options());
    comm::all_to_all_single(out, in, output_splits, input_splits, false,
                            groups->expert_parallel);
    return out;
  }
};

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous().cpu();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

void check_group_routing(const TokenChoiceOptions& o) {
  const int64_t groups = o.num_expert_groups, limited = o.num_limited_groups;
  DS_CHECK(groups >= 1 && o.num_experts % groups == 0, UsageError, "TokenChoiceMoE: "
           "num_expert_groups (", groups, ") must divide num_experts (", o.num_experts, ")");
  DS_CHECK(limited >= 1 && limited <= groups, UsageError, "TokenChoiceMoE: num_limited_groups (",
           limited, ") must be in 1..num_expert_groups (", groups, ")");
  const int64_t per_group = o.num_experts / groups;
  DS_CHECK(o.group_score_func == "max" || o.group_score_func == "top2_sum", UsageError,
           "TokenChoiceMoE: group_score_func is '", o.group_score_func,
           "'; expected max or top2_sum");
  DS_CHECK(o.group_score_func != "top2_sum" || per_group >= 2, UsageError, "TokenChoiceMoE: "
           "group_score_func top2_sum needs at least 2 experts per group, got ", per_group);
  // Fewer candidates than choices would pick experts of the groups left out.
  DS_CHECK(o.top_k <= limited * per_group, UsageError, "TokenChoiceMoE: top_k (", o.top_k,
           ") exceeds the ", limited * per_group, " experts of num_limited_groups (", limited,
           ") groups of ", per_group);
}

// The scores with every expert outside a token's num_limited_groups best groups at -inf
// (DeepSpeed's _get_node_limited_routing_scores); the k experts are chosen among the others.
// The weights are the unmasked scores of those chosen.
at::Tensor group_limited(const at::Tensor& scores, const TokenChoiceOptions& o) {
  const int64_t groups = o.num_expert_groups, per_group = o.num_experts / groups;
  const at::Tensor grouped = scores.view({-1, groups, per_group});
  const at::Tensor group_scores = o.group_score_func == "max"
                                      ? std::get<0>(grouped.max(-1))
                                      : std::get<0>(grouped.topk(2, -1)).sum(-1);
  const at::Tensor best = std::get<1>(group_scores.topk(o.num_limited_groups, -1));
  const at::Tensor left_out = at::ones_like(group_scores, at::kBool).scatter_(1, best, false);
  return grouped.masked_fill(left_out.unsqueeze(-1), -std::numeric_limits<float>::infinity())
      .view({-1, o.num_experts});
}

}  // namespace

TokenChoiceMoEImpl::TokenChoiceMoEImpl(int64_t hidden, int64_t ffn, TokenChoiceOptions options)
    : options_(std::move(options)) {
  const auto& o = options_;
  DS_CHECK(o.num_experts > 0 && o.top_k > 0 && o.top_k <= o.num_experts, UsageError,
           "TokenChoiceMoE: top_k (", o.top_k, ") must be in 1..num_experts (", o.num_experts,
           ")");
  DS_CHECK(o.score_func == "softmax" || o.score_func == "sigmoid", UsageError,
           "TokenChoiceMoE: score_func is '", o.score_func, "'; expected softmax or sigmoid");
  DS_CHECK(o.score_apply == "post" || o.score_apply == "pre", UsageError,
           "TokenChoiceMoE: score_apply is '", o.score_apply, "'; expected post or pre");
  if (o.num_expert_groups > 0 || o.num_limited_groups > 0) check_group_routing(o);
  gate = register_module(
      "gate", torch::nn::Linear(torch::nn::LinearOptions(hidden, o.num_experts).bias(false)));
  if (o.score_correction_bias) {
    score_correction_bias =
        gate->register_buffer("e_score_correction_bias", torch::zeros({o.num_experts}));
  }
  experts = register_module("experts", GroupedExperts(o.num_experts, hidden, ffn));
}

int64_t TokenChoiceMoEImpl::first_expert() const {
  return groups_ ? groups_->expert_parallel.rank() * num_local_experts() : 0;
}

std::vector<at::Tensor> TokenChoiceMoEImpl::expert_parameters() const {
  return {experts->w1, experts->w2, experts->w3};
}

void TokenChoiceMoEImpl::shard_experts(const ExpertGroups* groups) {
  DS_CHECK(groups != nullptr && groups_ == nullptr, UsageError,
           "TokenChoiceMoE: shard_experts takes the groups once");
  const int64_t ep = groups->ep_size, e = options_.num_experts;
  DS_CHECK(ep <= e && e % ep == 0, UsageError, "expert_parallel.autoep_size ", ep,
           " must divide num_experts (", e, "): each rank owns the same number of experts");
  const int64_t local = e / ep, first = groups->expert_parallel.rank() * local;
  torch::NoGradGuard no_grad;
  for (at::Tensor* w : {&experts->w1, &experts->w2, &experts->w3}) {
    w->set_data(w->narrow(0, first, local).clone());
  }
  groups_ = groups;
}

at::Tensor TokenChoiceMoEImpl::forward(const at::Tensor& x) {
  const auto& o = options_;
  const int64_t hidden = x.size(-1), k = o.top_k, e = o.num_experts;
  const at::Tensor flat = x.reshape({-1, hidden});
  // Routing, in fp32 as DeepSpeed's router and transformers' blocks take it.
  const at::Tensor logits = gate(flat).to(at::kFloat);
  router_logits_ = keep_router_logits_ ? logits : at::Tensor();
  const at::Tensor scores =
      o.score_func == "softmax" ? at::softmax(logits, 1) : at::sigmoid(logits);
  // DeepSeek-V3's correction bias steers the choice only (in fp32, as DeepSpeed adds it).
  const at::Tensor for_choice = score_correction_bias.defined()
                                    ? scores + score_correction_bias.to(at::kFloat)
                                    : scores;
  const at::Tensor candidates =
      o.num_expert_groups > 0 ? group_limited(for_choice, o) : for_choice;
  const at::Tensor chosen = std::get<1>(candidates.topk(k, 1));  // [T, k]
  at::Tensor weight = scores.gather(1, chosen);
  if (o.route_norm) weight = weight / (weight.sum(-1, /*keepdim=*/true) + 1e-20);
  if (o.route_scale != 1.0) weight = weight * o.route_scale;

  // One row per (token, choice), sorted by expert (stable: token order within an expert).
  const at::Tensor expert_of = chosen.reshape({-1});
  const at::Tensor order = std::get<1>(expert_of.sort(/*stable=*/true, 0, false));
  const at::Tensor token_of = order.div(k, "floor");
  const at::Tensor row_weight =
      weight.reshape({-1}).index_select(0, order).unsqueeze(1).to(x.scalar_type());
  tokens_per_expert_ = at::bincount(expert_of, {}, e);
  const std::vector<int64_t> counts = to_vector(tokens_per_expert_);

  at::Tensor rows = flat.index_select(0, token_of);
  if (o.score_apply == "pre") rows = rows * row_weight;
  at::Tensor out;
  if (ep_size() == 1) {
    out = experts->forward(rows, counts);
  } else {
    // Note [Variable all-to-all]
    const int64_t ep = ep_size(), local = num_local_experts();
    const comm::Group& group = groups_->expert_parallel;
    at::Tensor sent_counts = tokens_per_expert_.to(at::kLong).contiguous();
    at::Tensor got_counts = at::empty_like(sent_counts);  // [j * L + e]: from rank j, expert e
    comm::all_to_all_single(got_counts, sent_counts, false, group);
    const std::vector<int64_t> got = to_vector(got_counts);
    std::vector<int64_t> send_splits(ep, 0), recv_splits(ep, 0), local_counts(local, 0);
    for (int64_t j = 0; j < ep; ++j) {
      for (int64_t l = 0; l < local; ++l) {
        send_splits[j] += counts[j * local + l];
        recv_splits[j] += got[j * local + l];
        local_counts[l] += got[j * local + l];
      }
    }
    at::Tensor received = AllToAllV::apply(rows, recv_splits, send_splits, groups_->name);
    // Received rows come by source rank, then expert; the experts want them by expert.
    std::vector<int64_t> by_expert;
    by_expert.reserve(static_cast<size_t>(received.size(0)));
    std::vector<int64_t> block_start(ep * local, 0);
    for (int64_t j = 0, off = 0; j < ep; ++j) {
      for (int64_t l = 0; l < local; ++l) {
        block_start[j * local + l] = off;
        off += got[j * local + l];
      }
    }
    for (int64_t l = 0; l < local; ++l) {
      for (int64_t j = 0; j < ep; ++j) {
        const int64_t b = j * local + l;
        for (int64_t r = 0; r < got[b]; ++r) by_expert.push_back(block_start[b] + r);
      }
    }
    const at::Tensor perm = at::tensor(by_expert, at::kLong);
    const at::Tensor inverse = at::empty_like(perm).index_put_({perm}, at::arange(perm.numel()));
    at::Tensor done = experts->forward(received.index_select(0, perm), local_counts);
    out = AllToAllV::apply(done.index_select(0, inverse), send_splits, recv_splits, groups_->name);
  }
  if (o.score_apply == "post") out = out * row_weight;
  return at::zeros_like(flat).index_add(0, token_of, out).view(x.sizes());
}

std::vector<std::pair<std::string, std::shared_ptr<TokenChoiceMoEImpl>>> token_choice_layers(
    torch::nn::Module& module) {
  std::vector<std::pair<std::string, std::shared_ptr<TokenChoiceMoEImpl>>> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    if (auto m = std::dynamic_pointer_cast<TokenChoiceMoEImpl>(item.value())) {
      out.emplace_back(item.key(), m);
    }
  }
  return out;
}

}  // namespace deepspeed::moe
