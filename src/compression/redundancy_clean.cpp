// redundancy_clean (DeepSpeed's compress.py and LinearLayer_Compress.fix_*): the compression
// made permanent, technique by technique in DeepSpeed's order.
#include <ATen/ATen.h>
#include <torch/nn/modules/batchnorm.h>

#include "compression/layer_masks.h"
#include "compression/layer_state.h"
#include "compression/quantizers.h"
#include "deepspeed/compression.h"
#include "deepspeed/errors.h"
#include "nn/module_surgery.h"
#include "util/check.h"

namespace deepspeed::compression {
namespace {

// The order redundancy_clean applies the techniques in (activation quantization stays in the
// forward).
constexpr const char* kOrder[] = {"weight_quantization", "sparse_pruning", "row_pruning",
                                  "head_pruning", "channel_pruning"};

void replace(at::Tensor& param, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  param.set_data(value.contiguous());
  param.mutable_grad() = at::Tensor();
}

at::Tensor kept(const at::Tensor& mask) { return mask.view({-1}).nonzero().view({-1}); }

torch::nn::LinearImpl& linear_of(const std::shared_ptr<torch::nn::Module>& m,
                                 const std::string& name, const std::string& technique) {
  auto* linear = dynamic_cast<torch::nn::LinearImpl*>(m.get());
  DS_CHECK(linear != nullptr, ConfigError, "redundancy_clean: compression_training.", technique,
           " shrinks ", name, ", which is not a Linear layer");
  return *linear;
}

std::shared_ptr<LayerState> state_of(const std::shared_ptr<torch::nn::Module>& m,
                                     const std::string& name, const std::string& technique) {
  auto s = find_layer_state(m.get());
  DS_CHECK(s != nullptr, UsageError, "redundancy_clean: ", name, " has no ", technique,
           " (was init_compression run on this model?)");
  return s;
}

void check_unfixed(bool configured, const std::string& name, const std::string& technique) {
  DS_CHECK(configured, UsageError, "redundancy_clean: ", name, "'s ", technique,
           " is already fixed (redundancy_clean was run twice?)");
}

// Row pruning. Without `mask`: the layer's own rows (cut out with dim_reduction, else zeroed);
// returns the mask. With it: a related layer's input columns cut out.
at::Tensor fix_rows(const std::shared_ptr<torch::nn::Module>& m, const std::string& name,
                    const at::Tensor& mask, bool dim_reduction) {
  torch::nn::LinearImpl& layer = linear_of(m, name, "row_pruning");
  auto s = find_layer_state(m.get());
  if (mask.defined()) {
    replace(layer.weight, layer.weight.detach().index_select(1, kept(mask)));
    layer.options.in_features(layer.weight.size(1));
    if (s) s->row_pruning_enabled = false;
    return at::Tensor();
  }
  s = state_of(m, name, "row_pruning");
  check_unfixed(!s->row_method.empty(), name, "row_pruning");
  const at::Tensor rows = row_mask(*s).detach().to(at::kBool);
  if (dim_reduction) {
    replace(layer.weight, layer.weight.detach().index_select(0, kept(rows)));
    if (layer.bias.defined()) replace(layer.bias, layer.bias.detach().index_select(0, kept(rows)));
    layer.options.out_features(layer.weight.size(0));
  } else {
    const at::Tensor keep = rows.to(layer.weight.scalar_type());
    replace(layer.weight, layer.weight.detach() * keep.view({-1, 1}));
    if (layer.bias.defined()) replace(layer.bias, layer.bias.detach() * keep.view({-1}));
  }
  nn::erase_buffer(layer, "row_pruning_mask");
  nn::erase_parameter(layer, "row_mask_scores");
  s->row_method.clear();
  s->row_pruning_enabled = false;
  return rows;
}

// Head pruning. Without `mask`: the layer's own heads (the attention output projection's input
// columns, cut out with dim_reduction, else zeroed); returns the mask. With it: a related
// projection's (q, k or v) output rows of the pruned heads cut out.
at::Tensor fix_heads(const std::shared_ptr<torch::nn::Module>& m, const std::string& name,
                     const at::Tensor& mask, int64_t num_heads, bool dim_reduction) {
  torch::nn::LinearImpl& layer = linear_of(m, name, "head_pruning");
  auto s = find_layer_state(m.get());
  const at::Tensor w = layer.weight.detach();
  if (mask.defined()) {
    const auto in = w.size(1);
    replace(layer.weight, w.reshape({num_heads, -1}).index_select(0, kept(mask)).reshape({-1, in}));
    if (layer.bias.defined()) {
      replace(layer.bias,
              layer.bias.detach().reshape({num_heads, -1}).index_select(0, kept(mask)).reshape(
                  {-1}));
    }
    layer.options.out_features(layer.weight.size(0));
    if (s) s->head_pruning_enabled = false;
    return mask;
  }
  s = state_of(m, name, "head_pruning");
  check_unfixed(!s->head_method.empty(), name, "head_pruning");
  const at::Tensor heads = head_mask(*s).detach().to(at::kBool);
  if (dim_reduction) {
    const auto out = w.size(0);
    replace(layer.weight,
            w.t().reshape({s->num_heads, -1}).index_select(0, kept(heads)).reshape({-1, out}).t());
    layer.options.in_features(layer.weight.size(1));
  } else {
    replace(layer.weight, mask_heads(w, heads.to(w.scalar_type()), s->num_heads));
  }
  nn::erase_parameter(layer, "head_pruning_scores");
  s->head_method.clear();
  s->head_pruning_enabled = false;
  return heads;
}

// Channel pruning. Without `mask`: the convolution's own output channels (cut out with
// dim_reduction, else zeroed); returns the mask. With it: a related convolution's input
// channels, or a BatchNorm2d's channels, cut out.
at::Tensor fix_channels(const std::shared_ptr<torch::nn::Module>& m, const std::string& name,
                        const at::Tensor& mask, bool dim_reduction) {
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(m.get())) {
    DS_CHECK(mask.defined(), ConfigError, "redundancy_clean: ", name, " is a BatchNorm2d layer, "
             "which shrinks only as a related module of channel pruning");
    for (at::Tensor* t : {&bn->weight, &bn->bias, &bn->running_mean, &bn->running_var}) {
      if (t->defined()) replace(*t, t->detach().index_select(0, kept(mask)));
    }
    bn->options.num_features(bn->running_mean.defined() ? bn->running_mean.size(0)
                                                        : bn->weight.size(0));
    return at::Tensor();
  }
  auto* conv = dynamic_cast<torch::nn::Conv2dImpl*>(m.get());
  DS_CHECK(conv != nullptr, ConfigError, "redundancy_clean: compression_training.channel_pruning "
           "shrinks ", name, ", which is neither a Conv2d nor a BatchNorm2d layer");
  auto s = find_layer_state(m.get());
  if (mask.defined()) {
    replace(conv->weight, conv->weight.detach().index_select(1, kept(mask)));
    conv->options.in_channels(conv->weight.size(1) * conv->options.groups());
    if (s) s->channel_pruning_enabled = false;
    return at::Tensor();
  }
  s = state_of(m, name, "channel_pruning");
  check_unfixed(!s->channel_method.empty(), name, "channel_pruning");
  const at::Tensor channels = channel_mask(*s).detach().to(at::kBool);
  if (dim_reduction) {
    replace(conv->weight, conv->weight.detach().index_select(0, kept(channels)));
    if (conv->bias.defined()) {
      replace(conv->bias, conv->bias.detach().index_select(0, kept(channels)));
    }
    conv->options.out_channels(conv->weight.size(0));
  } else {
    const at::Tensor keep = channels.to(conv->weight.scalar_type());
    replace(conv->weight, conv->weight.detach() * keep.view({-1, 1, 1, 1}));
    if (conv->bias.defined()) replace(conv->bias, conv->bias.detach() * keep.view({-1}));
  }
  nn::erase_buffer(*conv, "channel_pruning_mask");
  nn::erase_parameter(*conv, "channel_mask_scores");
  s->channel_method.clear();
  s->channel_pruning_enabled = false;
  return channels;
}

void fix_sparse(const std::shared_ptr<torch::nn::Module>& m, const std::string& name) {
  auto s = state_of(m, name, "sparse_pruning");
  check_unfixed(!s->sparse_method.empty(), name, "sparse_pruning");
  const at::Tensor mask = sparse_mask(*s).detach();
  at::Tensor& w = s->weight();
  replace(w, w.detach() * mask.view(w.sizes()));
  nn::erase_buffer(*m, "sparse_pruning_mask");
  nn::erase_parameter(*m, "sparse_mask_scores");
  s->sparse_method.clear();
  s->sparse_pruning_enabled = false;
}

void fix_weight_quantization(const std::shared_ptr<torch::nn::Module>& m,
                             const std::string& name) {
  auto s = state_of(m, name, "weight_quantization");
  if (!s->quantize_in_forward) return;  // MoQ quantized the weights in place already
  at::Tensor& w = s->weight();
  replace(w, quantize_weight(w.detach(), s->target_bits, s->quantization_type,
                             s->quantize_groups));
  s->quantize_in_forward = false;
}

}  // namespace

void redundancy_clean(torch::nn::Module& model, const CompressionConfig& config) {
  for (const char* technique : kOrder) {
    const TechniqueConfig* t = nullptr;
    for (const auto& [name, cfg] : config.techniques()) {
      if (std::string(name) == technique) t = cfg;
    }
    if (!t->enabled) continue;
    std::set<std::string> seen;
    for (const GroupConfig& g : t->groups) {
      const bool shrink = !g.related_modules.empty();
      const auto per_pattern = group_layers(model, technique, g, seen, /*strict=*/true);
      for (size_t i = 0; i < per_pattern.size(); ++i) {
        std::vector<at::Tensor> masks;
        for (const std::string& name : per_pattern[i]) {
          auto m = module_named(model, name, "redundancy_clean");
          const std::string tech = technique;
          if (tech == "weight_quantization") {
            fix_weight_quantization(m, name);
          } else if (tech == "sparse_pruning") {
            fix_sparse(m, name);
          } else if (tech == "row_pruning") {
            masks.push_back(fix_rows(m, name, at::Tensor(), shrink));
          } else if (tech == "head_pruning") {
            masks.push_back(fix_heads(m, name, at::Tensor(), t->num_heads, shrink));
          } else {
            masks.push_back(fix_channels(m, name, at::Tensor(), shrink));
          }
        }
        if (!shrink) continue;
        // The j-th layer a related pattern finds shrinks with the j-th layer of this pattern.
        for (const std::string& pattern : g.related_modules[i]) {
          const std::string what = std::string(technique) + ".different_groups." + g.name;
          const auto related = matching_layers(model, pattern, what, /*related=*/true);
          DS_CHECK(related.size() <= masks.size(), ConfigError, "redundancy_clean: ",
                   "compression_training.", what, ": related pattern \"", pattern, "\" finds ",
                   related.size(), " layers for the ", masks.size(), " layers of \"",
                   g.modules[i], "\"");
          for (size_t j = 0; j < related.size(); ++j) {
            auto m = module_named(model, related[j], "redundancy_clean");
            if (std::string(technique) == "row_pruning") {
              fix_rows(m, related[j], masks[j], true);
            } else if (std::string(technique) == "head_pruning") {
              fix_heads(m, related[j], masks[j], t->num_heads, true);
            } else {
              fix_channels(m, related[j], masks[j], true);
            }
          }
        }
      }
    }
  }
}

}  // namespace deepspeed::compression
