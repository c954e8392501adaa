// init_compression (DeepSpeed's compression/compress.py and helper.py): layer reduction from a
// teacher, then each enabled technique set up on the layers its groups name, in DeepSpeed's
// order of techniques; the layers themselves are switched on later by the scheduler.
#include <cmath>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include "compression/layer_state.h"
#include "compression/quantizers.h"
#include "deepspeed/compression.h"
#include "deepspeed/errors.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::compression {
namespace {

// DeepSpeed's QuantAct: the running activation range of static range calibration.
class QuantActImpl : public torch::nn::Module {
 public:
  QuantActImpl() { register_buffer("x_min_max", torch::zeros({2})); }
};

at::Tensor kaiming_scores(at::IntArrayRef sizes, const at::Tensor& like) {
  at::Tensor scores = at::empty(sizes, like.options().requires_grad(false));
  torch::nn::init::kaiming_uniform_(scores, std::sqrt(5.0));
  return scores;
}

std::vector<int64_t> conv_weight_shape(const torch::nn::Conv2dImpl& c) {
  const auto& o = c.options;
  return {o.out_channels(), o.in_channels() / o.groups(), o.kernel_size()->at(0),
          o.kernel_size()->at(1)};
}

void check_whole(const LayerState& s) {
  const at::Tensor& w = s.weight();
  int64_t expected = 1;
  if (s.linear) {
    expected = s.linear->options.in_features() * s.linear->options.out_features();
  } else if (s.embedding) {
    expected = s.embedding->options.num_embeddings() * s.embedding->options.embedding_dim();
  } else {
    for (int64_t d : conv_weight_shape(*s.conv)) expected *= d;
  }
  DS_CHECK(w.numel() == expected, UsageError, "init_compression: ", s.name,
           "'s weight holds ", w.numel(), " of its ", expected, " elements (partitioned by "
           "ZeRO-3?); run init_compression on the whole model before deepspeed::initialize "
           "and outside zero::Init");
}

// DeepSpeed's layers have only some techniques: an Embedding_Compress weight quantization, a
// Conv2dLayer_Compress no row or head pruning, a LinearLayer_Compress no channel pruning.
void require(bool has_it, const LayerState& s, const std::string& technique) {
  const char* kind = s.linear ? "a Linear" : s.embedding ? "an Embedding" : "a Conv2d";
  DS_CHECK(has_it, ConfigError, "compression_training.", technique, ": ", s.name, " is ", kind,
           " layer, which has no ", technique);
}

void enable(LayerState& s, const std::string& technique, const TechniqueConfig& t,
            const GroupConfig& g) {
  auto module = s.module.lock();
  at::NoGradGuard no_grad;
  const at::Tensor w = s.weight().detach();
  auto already = [&](bool configured) {
    DS_CHECK(!configured, UsageError, "init_compression: ", s.name, " already has ", technique,
             " (init_compression was run twice on this model)");
  };
  if (technique == "weight_quantization") {
    already(s.weight_quantization);
    s.weight_quantization = true;
    s.start_bits = g.start_bits;
    s.target_bits = g.target_bits;
    s.q_period = g.quantization_period;
    s.quantize_in_forward = t.quantize_weight_in_forward;
    s.quantization_type = t.quantization_type;
    // DeepSpeed quantizes an embedding token by token.
    s.quantize_groups = s.embedding ? w.size(0) : t.quantize_groups;
    // Matches DeepSpeed's Conv2dLayer_Compress assertion.
    DS_CHECK(!(s.conv && s.quantize_in_forward && g.target_bits < 4), ConfigError,
             "compression_training.weight_quantization.different_groups.", g.name, ": ", s.name,
             " is a Conv2d layer, quantized in the forward to 4 bits or more only (target_bits ",
             g.target_bits, ")");
    DS_CHECK(w.numel() % s.quantize_groups == 0, ConfigError,
             "compression_training.weight_quantization.shared_parameters.quantize_groups: ",
             s.quantize_groups, " does not divide ", s.name, "'s ", w.numel(), " weights");
  } else if (technique == "activation_quantization") {
    require(!s.embedding, s, technique);
    already(!s.activation_method.empty());
    s.activation_bits = g.bits;
    s.activation_method = t.quantization_type + "_" + t.range_calibration;
    if (t.range_calibration == "static") {
      module->register_module("activation_quantizer", std::make_shared<QuantActImpl>());
    }
  } else if (technique == "sparse_pruning") {
    require(!s.embedding, s, technique);
    already(!s.sparse_method.empty());
    s.sparse_method = t.method;
    s.sparse_ratio = g.dense_ratio;
    if (t.method == "l1") {
      const at::Tensor mask = topk_binarize(w.abs(), g.dense_ratio).view(w.sizes());
      module->register_buffer("sparse_pruning_mask", mask);
    } else {
      module->register_parameter("sparse_mask_scores", kaiming_scores(w.sizes(), w));
    }
  } else if (technique == "row_pruning") {
    require(s.linear != nullptr, s, technique);
    already(!s.row_method.empty());
    s.row_method = t.method;
    s.row_ratio = g.dense_ratio;
    if (t.method == "l1") {
      const at::Tensor norms = at::linalg_norm(w, 1, at::IntArrayRef{1});
      module->register_buffer("row_pruning_mask",
                              topk_binarize(norms, g.dense_ratio).view({-1, 1}));
    } else {
      module->register_parameter("row_mask_scores", kaiming_scores({w.size(0), 1}, w));
    }
  } else if (technique == "head_pruning") {
    require(s.linear != nullptr, s, technique);
    already(!s.head_method.empty());
    DS_CHECK(w.size(1) % t.num_heads == 0, ConfigError,
             "compression_training.head_pruning.shared_parameters.num_heads: ", t.num_heads,
             " does not divide ", s.name, "'s ", w.size(1), " input features");
    s.head_method = t.method;
    s.head_ratio = g.dense_ratio;
    s.num_heads = t.num_heads;
    module->register_parameter("head_pruning_scores", kaiming_scores({1, t.num_heads}, w));
  } else if (technique == "channel_pruning") {
    require(s.conv != nullptr, s, technique);
    already(!s.channel_method.empty());
    s.channel_method = t.method;
    s.channel_ratio = g.dense_ratio;
    if (t.method == "l1") {
      // The L1 norm of each output channel's kernels. (DeepSpeed's torch.linalg.norm over three
      // dimensions raises; this is the norm it means.)
      const at::Tensor norms = w.abs().sum({1, 2, 3});
      module->register_buffer("channel_pruning_mask",
                              topk_binarize(norms, g.dense_ratio).view({-1, 1, 1, 1}));
    } else {
      module->register_parameter("channel_mask_scores", kaiming_scores({w.size(0), 1, 1, 1}, w));
    }
  } else {
    throw NotSupportedError("compression_training." + technique + " is not supported yet");
  }
}

// DeepSpeed's student_initialization: the student's layer i takes teacher layer
// teacher_layer[i]'s parameters, and the other named modules the teacher's, in order.
void student_initialization(torch::nn::Module& student, torch::nn::Module& teacher,
                            const LayerReductionConfig& lr) {
  const std::string why = "compression_training.layer_reduction";
  auto copy = [&](const std::string& s_name, const std::string& t_name) {
    const auto s_params = module_named(student, s_name, why + " (student)")->parameters();
    const auto t_params = module_named(teacher, t_name, why + " (teacher)")->parameters();
    DS_CHECK(s_params.size() == t_params.size(), ConfigError, why, ": student ", s_name, " has ",
             s_params.size(), " parameters, teacher ", t_name, " ", t_params.size());
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < s_params.size(); ++i) {
      DS_CHECK(s_params[i].sizes() == t_params[i].sizes(), ConfigError, why, ": student ",
               s_name, "'s parameter ", i, " has shape ", s_params[i].sizes(), ", teacher ",
               t_name, "'s ", t_params[i].sizes());
      s_params[i].copy_(t_params[i]);
    }
  };
  for (size_t i = 0; i < lr.teacher_layer.size(); ++i) {
    copy(lr.module_name_prefix + "." + std::to_string(i),
         lr.module_name_prefix + "." + std::to_string(lr.teacher_layer[i]));
  }
  for (const std::string& name : lr.other_module_name) copy(name, name);
}

// Matches DeepSpeed: its compression_preparation rebuilds every Linear and Embedding as a
// LinearLayer_Compress / Embedding_Compress, whose constructors draw fresh initial weights
// (kaiming-uniform weights and uniform biases; normal tables; BatchNorm2d draws nothing)
// before the old ones are copied in.
// The same draws here leave the generator where DeepSpeed leaves it, so that a seeded run
// draws the same topk scores, and the same data after init_compression, as DeepSpeed's.
void draw_as_deepspeed_rebuilds(const torch::nn::Module& model) {
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (const auto* l = dynamic_cast<const torch::nn::LinearImpl*>(item.value().get())) {
      const int64_t in = l->options.in_features(), out = l->options.out_features();
      at::empty({out, in}).uniform_(-1.0, 1.0);
      if (l->options.bias()) at::empty({out}).uniform_(-1.0, 1.0);
    } else if (const auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(
                   item.value().get())) {
      at::empty({e->options.num_embeddings(), e->options.embedding_dim()}).normal_();
    } else if (const auto* c = dynamic_cast<const torch::nn::Conv2dImpl*>(item.value().get())) {
      at::empty(conv_weight_shape(*c)).uniform_(-1.0, 1.0);
      if (c->options.bias()) at::empty({c->options.out_channels()}).uniform_(-1.0, 1.0);
    }
  }
}

}  // namespace

std::string CompressionPlan::describe() const {
  std::ostringstream os;
  for (const auto& [technique, groups] : layers) {
    for (const auto& [group, names] : groups) {
      os << technique << "." << group << ": " << names.size() << " layers";
      if (!names.empty()) os << " (" << names.front() << (names.size() > 1 ? ", ...)" : ")");
      os << "\n";
    }
  }
  return os.str();
}

CompressionPlan init_compression(torch::nn::Module& model, const CompressionConfig& config,
                                 torch::nn::Module* teacher) {
  if (config.layer_reduction.enabled) {
    DS_CHECK(teacher != nullptr, UsageError,
             "init_compression: compression_training.layer_reduction is enabled, which needs "
             "the teacher model (init_compression's third argument)");
    student_initialization(model, *teacher, config.layer_reduction);
  }
  draw_as_deepspeed_rebuilds(model);
  CompressionPlan plan;
  for (const auto& [technique, t] : config.techniques()) {
    std::set<std::string> seen;
    for (const GroupConfig& g : t->groups) {
      std::vector<std::string>& listed = plan.layers[technique][g.name];
      // DeepSpeed checks the related modules' patterns too; they are used by redundancy_clean.
      for (const auto& related : g.related_modules) {
        for (const std::string& pattern : related) {
          matching_layers(model, pattern, std::string(technique) + ".different_groups." + g.name,
                          /*related=*/true);
        }
      }
      for (const auto& names : group_layers(model, technique, g, seen, /*strict=*/true)) {
        for (const std::string& name : names) {
          listed.push_back(name);
          if (!t->enabled) continue;
          auto state = layer_state(module_named(model, name, "init_compression"), name);
          check_whole(*state);
          enable(*state, technique, *t, g);
        }
      }
    }
  }
  log::info_rank0("init_compression:\n" + plan.describe());
  return plan;
}

}  // namespace deepspeed::compression
