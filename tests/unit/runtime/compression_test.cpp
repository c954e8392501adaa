// compression_training without DeepSpeed at hand (deepspeed_compression_interop_test holds
// the whole against DeepSpeed's): the config's defaults and errors, the quantizers on values
// worked out by hand, init_compression's refusals, MoQ's precision schedule, redundancy_clean's
// shrinking, and the engine stepping the scheduler.
#include "deepspeed/compression.h"

#include <set>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "compression/quantizers.h"
#include "deepspeed/deepspeed.h"
#include "support/expect_throw.h"

namespace deepspeed::compression {
namespace {

CompressionConfig parse(const std::string& text) {
  return read_compression_config(json::parse(text), "cfg.json");
}

struct MlpNetImpl : torch::nn::Module {
  MlpNetImpl()
      : emb(register_module("emb", torch::nn::Embedding(10, 8))),
        c_fc(register_module("c_fc", torch::nn::Linear(8, 16))),
        c_proj(register_module("c_proj", torch::nn::Linear(16, 8))) {}
  at::Tensor forward(const at::Tensor& idx) {
    const at::Tensor x = embedding(emb, idx);
    return linear(c_proj, torch::relu(linear(c_fc, x)));
  }
  at::Tensor forward(const at::Tensor& idx, const at::Tensor& target) {
    return (forward(idx) - target).pow(2).mean();
  }
  torch::nn::Embedding emb;
  torch::nn::Linear c_fc, c_proj;
};
TORCH_MODULE(MlpNet);

TEST(CompressionConfig, DefaultsAreDeepSpeeds) {
  const auto c = parse(R"({"compression_training": {
      "weight_quantization": {"shared_parameters": {"enabled": true},
        "different_groups": {"g": {"params": {"start_bits": 8, "target_bits": 8}}}},
      "sparse_pruning": {"shared_parameters": {"enabled": true},
        "different_groups": {"s": {"params": {"dense_ratio": 0.5}, "modules": ["c_fc"]}}}}})");
  const TechniqueConfig& wq = c.weight_quantization;
  EXPECT_EQ(wq.schedule_offset, 0);
  EXPECT_EQ(wq.quantize_groups, 1);
  EXPECT_EQ(wq.quantization_type, "symmetric");
  EXPECT_EQ(wq.rounding, "nearest");
  EXPECT_FALSE(wq.quantize_weight_in_forward);
  EXPECT_DOUBLE_EQ(wq.quantize_change_ratio, 0.001);
  ASSERT_EQ(wq.groups.size(), 1u);
  EXPECT_EQ(wq.groups[0].modules, std::vector<std::string>{"*"});
  EXPECT_EQ(wq.groups[0].quantization_period, 1);
  EXPECT_EQ(c.sparse_pruning.method, "l1");
  EXPECT_EQ(c.sparse_pruning.schedule_offset, 1000);
  EXPECT_EQ(c.sparse_pruning.schedule_offset_end, 1000);
  EXPECT_EQ(c.activation_quantization.schedule_offset, 1000);
  EXPECT_EQ(c.head_pruning.method, "topk");
  EXPECT_TRUE(c.any_enabled());
  EXPECT_FALSE(parse(R"({"compression_training": {}})").any_enabled());
  EXPECT_FALSE(parse(R"({})").any_enabled());
}

TEST(CompressionConfig, ErrorsNameTheKey) {
  const std::string wq = R"({"compression_training": {"weight_quantization": )";
  EXPECT_THROW_WITH(parse(wq + R"({"shared_parameters": {"enabled": true}}}})"), ConfigError,
                    "compression_training.weight_quantization.different_groups must be given");
  EXPECT_THROW_WITH(
      parse(wq + R"({"different_groups": {"g1": {"params": {"target_bits": 4}}}}}})"),
      ConfigError,
      "weight_quantization.different_groups.g1.params.start_bits is required for each group");
  EXPECT_THROW_WITH(
      parse(wq + R"({"different_groups": {"g": {"params": {"start_bits": 4,
                                                           "target_bits": 8}}}}}})"),
      ConfigError, "params.start_bits is 4, below target_bits 8");
  EXPECT_THROW_WITH(parse(wq + R"({"shared_parameters": {"rounding": "up"}}}})"), ConfigError,
                    "shared_parameters.rounding is \"up\"; expected one of \"nearest\"");
  EXPECT_THROW_WITH(
      parse(wq + R"({"shared_parameters": {"enabled": true, "quantization_type": "asymmetric"},
        "different_groups": {"g": {"params": {"start_bits": 8, "target_bits": 2}}}}}})"),
      ConfigError, "ternary and binary weight quantization are symmetric only");
  EXPECT_THROW_WITH(
      parse(R"({"compression_training": {"activation_quantization": {"different_groups":
               {"a": {"params": {"bits": 6}}}}}})"),
      ConfigError, "activation_quantization.different_groups.a.params.bits is 6");
  EXPECT_THROW_WITH(
      parse(R"({"compression_training": {"head_pruning": {"shared_parameters":
               {"enabled": true}, "different_groups": {}}}})"),
      ConfigError, "head_pruning.shared_parameters.num_heads is required");
  EXPECT_THROW_WITH(
      parse(R"({"compression_training": {"row_pruning": {"different_groups":
               {"r": {"params": {"dense_ratio": 0.5}, "modules": ["a", "b"],
                      "related_modules": [["c"]]}}}}})"),
      ConfigError, "related_modules has 1 entries for 2 modules");
  EXPECT_THROW_WITH(
      parse(R"({"compression_training": {"row_pruning": {"different_groups":
               {"r": {"params": {"dense_ratio": 1.5}}}}}})"),
      ConfigError, "row_pruning.different_groups.r.params.dense_ratio is 1.5");
  EXPECT_THROW_WITH(parse(R"({"compression_training": {"layer_reduction": {"enabled": true,
                       "keep_number_layer": 2, "module_name_prefix": "h",
                       "teacher_layer": [1]}}})"),
                    ConfigError, "layer_reduction.teacher_layer names 1 layers");
  EXPECT_THROW_WITH(parse(R"({"compression_training": {"sparse_pruning": {"shared_parameters":
                       {"enabled": true, "method": "snip_momentum"}}}})"),
                    NotSupportedError, "snip_momentum");
}

TEST(CompressionQuantizers, WorkedValues) {
  // 4 bits symmetric: scale 2 * 1.5 / 16 = 0.1875; 2 groups of 2.
  const at::Tensor x = torch::tensor({1.5f, -0.4f, 0.3f, -0.05f});
  const at::Tensor sym = quantize_symmetric(x, 4, 2);
  // 1.5 / 0.1875 = 8 is clamped to 7. Group 2: scale 2 * 0.3 / 16 = 0.0375; 0.3 / 0.0375 = 8
  // is clamped to 7 too; -0.05 / 0.0375 = -1.33 rounds to -1.
  EXPECT_TRUE(torch::allclose(sym, torch::tensor({1.3125f, -0.375f, 0.2625f, -0.0375f})))
      << sym;
  // 2 bits asymmetric over [-1, 1]: scale 0.5, zero point -1.
  const at::Tensor asym = quantize_asymmetric(torch::tensor({-1.0f, -0.2f, 0.3f, 1.0f}), 2, 1);
  EXPECT_TRUE(torch::allclose(asym, torch::tensor({-1.0f, -0.0f, 0.5f, 0.5f}))) << asym;
  // Ternary: threshold 0.7 * mean|x| = 0.7; alpha = mean of |x| above it = 1.5.
  const at::Tensor t = quantize_ternary(torch::tensor({2.0f, -1.0f, 0.5f, -0.5f}), 1);
  EXPECT_TRUE(torch::allclose(t, torch::tensor({1.5f, -1.5f, 0.0f, 0.0f}))) << t;
  const at::Tensor b = quantize_binary(torch::tensor({2.0f, -1.0f, 0.5f, -0.5f}), 1);
  EXPECT_TRUE(torch::allclose(b, torch::tensor({1.0f, -1.0f, 1.0f, -1.0f}))) << b;
}

TEST(CompressionQuantizers, TopkKeepsTheCeilingAndPassesGradientsThrough) {
  const at::Tensor scores = torch::tensor({0.3f, -1.0f, 2.0f, 0.1f, 0.5f}, torch::requires_grad());
  const at::Tensor mask = topk_binarize(scores, 0.5);  // ceil(2.5) = 3 kept
  EXPECT_TRUE(torch::equal(mask, torch::tensor({1.0f, 0.0f, 1.0f, 0.0f, 1.0f}))) << mask;
  (mask * torch::tensor({1.0f, 2.0f, 3.0f, 4.0f, 5.0f})).sum().backward();
  EXPECT_TRUE(torch::equal(scores.grad(), torch::tensor({1.0f, 2.0f, 3.0f, 4.0f, 5.0f})));
  const at::Tensor w = torch::tensor({0.26f, -0.7f}, torch::requires_grad());
  const at::Tensor q = straight_through(w, quantize_symmetric(w.detach(), 8, 1));
  q.sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), torch::ones({2})));
}

TEST(InitCompression, RefusesWhatItCannotDo) {
  auto config = [](const std::string& technique, const std::string& params,
                   const std::string& modules) {
    return parse(R"({"compression_training": {")" + technique +
                 R"(": {"shared_parameters": {"enabled": true, "num_heads": 2},
                 "different_groups": {"g": {"params": )" + params +
                 R"(, "modules": )" + modules + "}}}}}");
  };
  EXPECT_THROW_WITH(init_compression(*MlpNet(), config("sparse_pruning", R"({"dense_ratio": 0.5})",
                                                       R"(["c_", "c_fc"])")),
                    ConfigError, "sparse_pruning.different_groups.g: c_fc is already added");
  EXPECT_THROW_WITH(
      init_compression(*MlpNet(), config("row_pruning", R"({"dense_ratio": 0.5})", R"(["emb"])")),
      ConfigError, "emb is an Embedding layer, which has no row_pruning");
  EXPECT_THROW_WITH(
      init_compression(*MlpNet(), config("sparse_pruning", R"({"dense_ratio": 0.5})", R"(["("])")),
      ConfigError, "the module pattern \"(\" is not a valid regular expression");
  MlpNet net;
  const auto rows = config("row_pruning", R"({"dense_ratio": 0.5})", R"(["c_fc"])");
  EXPECT_THROW_WITH(CompressionScheduler(*net, rows), UsageError,
                    "c_fc, which init_compression did not set up");
  init_compression(*net, rows);
  EXPECT_THROW_WITH(init_compression(*net, rows), UsageError, "already has row_pruning");
  torch::nn::Sequential cnn(torch::nn::Conv2d(1, 2, 1), torch::nn::BatchNorm2d(2));
  EXPECT_THROW_WITH(
      init_compression(*cnn, config("row_pruning", R"({"dense_ratio": 0.5})", R"(["0"])")),
      ConfigError, "row_pruning: 0 is a Conv2d layer, which has no row_pruning");
  EXPECT_THROW_WITH(
      init_compression(*cnn, config("channel_pruning", R"({"dense_ratio": 0.5})", R"(["1"])")),
      ConfigError, "1 is a BatchNorm2d layer, which shrinks only as a related module");
  EXPECT_THROW_WITH(
      init_compression(*MlpNet(), config("channel_pruning", R"({"dense_ratio": 0.5})",
                                         R"(["c_fc"])")),
      ConfigError, "c_fc is a Linear layer, which has no channel_pruning");
  EXPECT_THROW_WITH(init_compression(*MlpNet(), parse(R"({"compression_training": {
      "layer_reduction": {"enabled": true, "keep_number_layer": 1, "module_name_prefix": "h",
                          "teacher_layer": [0]}}})")),
                    UsageError, "needs the teacher model");
}

TEST(InitCompression, LayerReductionCopiesTheTeachersLayers) {
  torch::nn::Sequential teacher(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4),
                                torch::nn::Linear(4, 4));
  torch::nn::Sequential student(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4));
  struct Holder : torch::nn::Module {
    explicit Holder(torch::nn::Sequential s) { h = register_module("h", s); }
    torch::nn::Sequential h;
  };
  Holder t(teacher), s(student);
  init_compression(s, parse(R"({"compression_training": {"layer_reduction": {"enabled": true,
      "keep_number_layer": 2, "module_name_prefix": "h", "teacher_layer": [2, 0]}}})"),
                   &t);
  EXPECT_TRUE(torch::equal(student[0]->as<torch::nn::Linear>()->weight,
                           teacher[2]->as<torch::nn::Linear>()->weight));
  EXPECT_TRUE(torch::equal(student[1]->as<torch::nn::Linear>()->bias,
                           teacher[0]->as<torch::nn::Linear>()->bias));
}

TEST(RedundancyClean, ShrinksTheMlpToWhatTheMaskKept) {
  torch::manual_seed(3);
  MlpNet net;
  const auto cfg = parse(R"({"compression_training": {"row_pruning": {
      "shared_parameters": {"enabled": true, "schedule_offset": 0},
      "different_groups": {"r": {"params": {"dense_ratio": 0.25}, "modules": ["c_fc"],
                                 "related_modules": [["c_proj"]]}}}}})");
  init_compression(*net, cfg);
  CompressionScheduler scheduler(*net, cfg);
  scheduler.step(true);
  const at::Tensor idx = torch::randint(0, 10, {3, 5});
  torch::NoGradGuard no_grad;
  const at::Tensor masked = net->forward(idx);
  redundancy_clean(*net, cfg);
  EXPECT_EQ(net->c_fc->weight.sizes(), (std::vector<int64_t>{4, 8}));  // ceil(0.25 * 16)
  EXPECT_EQ(net->c_fc->bias.sizes(), (std::vector<int64_t>{4}));
  EXPECT_EQ(net->c_proj->weight.sizes(), (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(net->c_fc->options.out_features(), 4);
  std::set<std::string> names;
  for (const auto& b : net->named_buffers()) names.insert(b.key());
  EXPECT_EQ(names.count("c_fc.row_pruning_mask"), 0u);
  EXPECT_TRUE(torch::allclose(net->forward(idx), masked, 1e-6, 1e-6));
  EXPECT_THROW_WITH(redundancy_clean(*net, cfg), UsageError, "already fixed");
}

// l1 channel pruning (DeepSpeed's raises in torch.linalg.norm, so the interop test has topk
// only): the kept channels are the largest by kernel L1 norm, and cutting them out of the
// convolution, its BatchNorm2d and the next convolution's input leaves the output unchanged.
TEST(RedundancyClean, ShrinksChannelsOfAConvItsBatchNormAndTheNextConv) {
  torch::manual_seed(6);
  torch::nn::Conv2d conv1(torch::nn::Conv2dOptions(3, 6, 3).padding(1));
  torch::nn::BatchNorm2d bn1(6);
  torch::nn::Conv2d conv2(torch::nn::Conv2dOptions(6, 4, 3).padding(1));
  torch::nn::Sequential net;
  net->push_back("conv1", conv1);
  net->push_back("bn1", bn1);
  net->push_back("conv2", conv2);
  const auto cfg = parse(R"({"compression_training": {"channel_pruning": {
      "shared_parameters": {"enabled": true, "schedule_offset": 0},
      "different_groups": {"c": {"params": {"dense_ratio": 0.5}, "modules": ["conv1"],
                                 "related_modules": [["bn1", "conv2"]]}}}}})");
  init_compression(*net, cfg);
  CompressionScheduler scheduler(*net, cfg);
  scheduler.step(true);
  const at::Tensor original = conv1->weight.detach().clone();
  const at::Tensor kept = std::get<0>(std::get<1>(original.abs().sum({1, 2, 3}).topk(3)).sort());
  net->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor x = torch::randn({2, 3, 5, 5});
  const at::Tensor masked = conv2d(conv2, bn1(conv2d(conv1, x)));
  redundancy_clean(*net, cfg);
  EXPECT_TRUE(torch::equal(conv1->weight, original.index_select(0, kept)));
  EXPECT_EQ(conv1->options.out_channels(), 3);
  EXPECT_EQ(bn1->running_mean.sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(bn1->options.num_features(), 3);
  EXPECT_EQ(conv2->weight.sizes(), (std::vector<int64_t>{4, 3, 3, 3}));
  EXPECT_EQ(conv2->options.in_channels(), 3);
  EXPECT_TRUE(torch::allclose(net->forward(x), masked, 1e-5, 1e-6));
}

TEST(MoqQuantizer, LowersThePrecisionEachPeriod) {
  torch::manual_seed(4);
  MlpNet net;
  const auto cfg = parse(R"({"compression_training": {"weight_quantization": {
      "shared_parameters": {"enabled": true, "quantize_groups": 2},
      "different_groups": {"w": {"params": {"start_bits": 6, "target_bits": 4,
                                            "quantization_period": 2},
                                 "modules": ["c_fc"]}}}}})");
  init_compression(*net, cfg);
  MoqQuantizer moq(*net, cfg.weight_quantization);
  const at::Tensor before_proj = net->c_proj->weight.detach().clone();
  // Bits 6 at steps 1, 5 from step 2 (period 4 next), 4 from step 4 on.
  const std::vector<int64_t> expected_bits = {6, 5, 5, 4, 4, 4};
  for (size_t step = 0; step < expected_bits.size(); ++step) {
    moq.quantize(/*overflow=*/false);
    EXPECT_EQ(moq.current_bits(*net->c_fc), expected_bits[step]) << "step " << step + 1;
    const at::Tensor groups = net->c_fc->weight.detach().reshape({2, -1});
    for (int g = 0; g < 2; ++g) {
      EXPECT_LE(std::get<0>(at::_unique(groups[g])).numel(), int64_t{1} << expected_bits[step]);
    }
  }
  moq.quantize(/*overflow=*/true);  // a skipped step: nothing
  EXPECT_EQ(moq.steps(), 6);
  EXPECT_TRUE(torch::equal(net->c_proj->weight, before_proj));  // not named by the group
  MoqQuantizer resumed(*net, cfg.weight_quantization);
  resumed.set_steps(6);
  EXPECT_EQ(resumed.current_bits(*net->c_fc), 4);
}

TEST(CompressionEngine, SchedulerStepsWithAppliedStepsAndMoqNeedsFp16) {
  torch::manual_seed(5);
  const json cfg = {
      {"train_batch_size", 2},
      {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
      {"compression_training",
       {{"weight_quantization",
         {{"shared_parameters",
           {{"enabled", true}, {"quantize_weight_in_forward", true}, {"schedule_offset", 2}}},
          {"different_groups",
           {{"w", {{"params", {{"start_bits", 8}, {"target_bits", 4}}},
                   {"modules", {"c_fc", "emb"}}}}}}}}}}};
  MlpNet net;
  init_compression(*net, compression_config(DeepSpeedConfig::from_json(cfg, 1)));
  auto engine = initialize(net.ptr(), cfg).engine;
  ASSERT_NE(engine->compression_scheduler(), nullptr);
  EXPECT_EQ(engine->moq_quantizer(), nullptr);
  const at::Tensor idx = torch::randint(0, 10, {2, 3});
  const at::Tensor target = torch::randn({2, 3, 8});
  for (int step = 0; step < 3; ++step) {
    EXPECT_EQ(engine->compression_scheduler()->weight_quantization_enabled(), step >= 2);
    engine->backward(engine->forward(idx, target));
    engine->step();
    EXPECT_EQ(engine->compression_scheduler()->training_steps(), step + 1);
  }
  // quantize_weight_in_forward false is MoQ, fp16 only (as DeepSpeed's engine asserts).
  json moq = cfg;
  moq["compression_training"]["weight_quantization"]["shared_parameters"]
     ["quantize_weight_in_forward"] = false;
  MlpNet net2;
  init_compression(*net2, compression_config(DeepSpeedConfig::from_json(moq, 1)));
  EXPECT_THROW_WITH(initialize(net2.ptr(), moq), ConfigError, "needs fp16.enabled");
}

}  // namespace
}  // namespace deepspeed::compression
