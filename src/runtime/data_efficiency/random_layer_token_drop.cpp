// Random-LTD's token selection and its gather/scatter, on plain ATen ops: autograd gives the
// gradients DeepSpeed's token_gather/token_scatter_ kernels compute by hand (the kept tokens'
// gradient from the layer, the others' from the pass-through).
#include <ATen/ATen.h>

#include "deepspeed/random_ltd.h"
#include "util/check.h"

namespace deepspeed {
namespace random_ltd {

at::Tensor sample_tokens(int64_t reserved, int64_t seq_length, int64_t batch, int64_t layers,
                         const at::Device& device) {
  DS_CHECK(reserved > 0 && reserved <= seq_length, UsageError, "random-LTD: cannot keep ",
           reserved, " of ", seq_length, " tokens");
  // As DeepSpeed: uniform draws without replacement, then ascending, so that the kept tokens
  // keep their order (a decoder's causal mask stays right).
  const at::Tensor weights =
      at::ones({layers * batch, seq_length}, at::TensorOptions().device(device));
  const at::Tensor drawn = at::multinomial(weights, reserved, /*replacement=*/false);
  return std::get<0>(drawn.sort(-1)).reshape({layers, batch, reserved});
}

namespace {

// The index `indices` [batch, reserved] expanded over `hidden`'s last dimension, along the
// sequence dimension of `hidden`.
at::Tensor token_index(const at::Tensor& hidden, const at::Tensor& indices, bool batch_first) {
  DS_CHECK(hidden.dim() == 3, UsageError,
           "random-LTD: hidden states must be 3-D ([batch, seq, hidden] or [seq, batch, "
           "hidden]), got ", hidden.dim(), "-D");
  const int64_t width = hidden.size(2);
  const at::Tensor idx = indices.to(hidden.device(), at::kLong);
  if (batch_first) return idx.unsqueeze(-1).expand({idx.size(0), idx.size(1), width});
  return idx.t().unsqueeze(-1).expand({idx.size(1), idx.size(0), width});
}

}  // namespace

at::Tensor gather_tokens(const at::Tensor& hidden, const at::Tensor& indices, bool batch_first) {
  return hidden.gather(batch_first ? 1 : 0, token_index(hidden, indices, batch_first));
}

at::Tensor scatter_tokens(const at::Tensor& hidden, const at::Tensor& part,
                          const at::Tensor& indices, bool batch_first) {
  return hidden.scatter(batch_first ? 1 : 0, token_index(hidden, indices, batch_first), part);
}

at::Tensor gather_mask(const at::Tensor& mask, const at::Tensor& indices) {
  DS_CHECK(mask.dim() == 4, UsageError,
           "random-LTD: an attention mask must be [batch, heads, seq, seq], got ", mask.dim(),
           "-D");
  const int64_t b = mask.size(0), h = mask.size(1), s = mask.size(3), r = indices.size(1);
  const at::Tensor idx = indices.to(mask.device(), at::kLong);
  const at::Tensor rows = mask.gather(2, idx.reshape({b, 1, r, 1}).expand({b, h, r, s}));
  return rows.gather(3, idx.reshape({b, 1, 1, r}).expand({b, h, r, r}));
}

}  // namespace random_ltd

RandomLayerTokenDrop::RandomLayerTokenDrop(const RandomLtdScheduler* scheduler,
                                           const at::Tensor& hidden, bool training)
    : scheduler_(scheduler) {
  if (scheduler == nullptr) return;
  const RandomLtdConfig& cfg = scheduler->config();
  batch_first_ = cfg.hidden_state_order == "batch_seq_dim";
  DS_CHECK(hidden.dim() >= 2, UsageError, "random-LTD: hidden states must be at least 2-D");
  const int64_t seq = hidden.size(batch_first_ ? 1 : 0);
  const int64_t batch = hidden.size(batch_first_ ? 0 : 1);
  reserved_ = scheduler->get_current_seq();
  if (!training || reserved_ >= seq) return;
  const int64_t layers = cfg.random_ltd_layer_num;
  const at::Tensor all = random_ltd::sample_tokens(reserved_, seq, batch, layers, hidden.device());
  for (int64_t i = 0; i < layers; ++i) indices_.push_back(all[i]);
}

int64_t RandomLayerTokenDrop::slot(int64_t layer) const {
  if (indices_.empty()) return -1;
  const auto& ids = scheduler_->config().random_ltd_layer_id;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == layer) return static_cast<int64_t>(i);
  }
  return -1;
}

const at::Tensor& RandomLayerTokenDrop::indices(int64_t layer) const {
  const int64_t i = slot(layer);
  DS_CHECK(i >= 0, UsageError, "random-LTD: layer ", layer, " drops no tokens in this forward");
  return indices_[static_cast<size_t>(i)];
}

at::Tensor RandomLayerTokenDrop::forward(int64_t layer, const at::Tensor& hidden,
                                         const Layer& fn) const {
  const int64_t i = slot(layer);
  if (i < 0) return fn(hidden);
  const at::Tensor& idx = indices_[static_cast<size_t>(i)];
  const at::Tensor out = fn(random_ltd::gather_tokens(hidden, idx, batch_first_));
  return random_ltd::scatter_tokens(hidden, out, idx, batch_first_);
}

at::Tensor RandomLayerTokenDrop::forward(int64_t layer, const at::Tensor& hidden,
                                         const at::Tensor& mask, const MaskedLayer& fn) const {
  const int64_t i = slot(layer);
  if (i < 0) return fn(hidden, mask);
  const at::Tensor& idx = indices_[static_cast<size_t>(i)];
  const at::Tensor kept_mask =
      scheduler_->config().model_type == "encoder"
          ? random_ltd::gather_mask(mask, idx)
          : mask.slice(2, 0, reserved_).slice(3, 0, reserved_);
  const at::Tensor out = fn(random_ltd::gather_tokens(hidden, idx, batch_first_), kept_mask);
  return random_ltd::scatter_tokens(hidden, out, idx, batch_first_);
}

}  // namespace deepspeed
