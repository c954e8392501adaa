// compression_training against Python DeepSpeed 0.15.4 (.venv-deepspeed), through
// tests/e2e/deepspeed_compression_interop.py. Three configurations between them use every
// technique this build implements: weight quantization in the forward at 4, 5, 2 (ternary)
// and 1 (binary) bits, symmetric and asymmetric, grouped and token-wise on an embedding;
// activation quantization dynamic and static, symmetric and asymmetric; sparse, row and head
// pruning by l1 and topk, with and without related modules. From the same initial weights:
// - init_compression registers the same tensors under the same names, its l1 masks equal
//   DeepSpeed's and, from the same seed, its random topk scores too;
// - six SGD steps with the compression scheduler stepped as DeepSpeed's engine steps it give
//   the same losses and weights;
// - redundancy_clean leaves the same state dict (shapes after cutting pruned rows and heads
//   out of the layers and their related layers included) and the same outputs.
#include "deepspeed/compression.h"

#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed::compression {
namespace {

constexpr int kSteps = 6;

struct AttentionImpl : torch::nn::Module {
  AttentionImpl()
      : q(register_module("q", torch::nn::Linear(8, 8))),
        k(register_module("k", torch::nn::Linear(8, 8))),
        v(register_module("v", torch::nn::Linear(8, 8))),
        o(register_module("o", torch::nn::Linear(8, 8))) {}
  torch::nn::Linear q, k, v, o;
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : c_fc(register_module("c_fc", torch::nn::Linear(8, 16))),
        c_proj(register_module("c_proj", torch::nn::Linear(16, 8))) {}
  torch::nn::Linear c_fc, c_proj;
};
TORCH_MODULE(Mlp);

// The script's Net, its layers run through the compressed forwards.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : emb(register_module("emb", torch::nn::Embedding(16, 8))),
        attn(register_module("attn", Attention())),
        mlp(register_module("mlp", Mlp())) {}
  at::Tensor forward(const at::Tensor& idx) {
    at::Tensor x = embedding(emb, idx);
    const at::Tensor a = linear(attn->q, x) * torch::sigmoid(linear(attn->k, x)) +
                         linear(attn->v, x);
    x = x + linear(attn->o, a);
    return x + linear(mlp->c_proj, torch::relu(linear(mlp->c_fc, x)));
  }
  torch::nn::Embedding emb;
  Attention attn;
  Mlp mlp;
};
TORCH_MODULE(Net);

// The script's Cnn.
struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv1(register_module("conv1",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(8))),
        conv2(register_module("conv2",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(8, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = torch::relu(bn1(conv2d(conv1, x)));
    return linear(fc, torch::relu(conv2d(conv2, h)).mean({2, 3}));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(Cnn);

// The script's draws between its seed and init_compression: the model's initial weights,
// then the inputs and targets.
void draw_as_the_script(const Net&) {
  Net drawn;
  torch::randint(0, 16, {4, 6});
  torch::randn({4, 6, 8});
}
void draw_as_the_script(const Cnn&) {
  Cnn drawn;
  torch::randn({4, 3, 6, 6});
  torch::randn({4, 4});
}

std::map<std::string, at::Tensor> state_of(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().detach();
  return out;
}

std::map<std::string, at::Tensor> dict_at(const c10::IValue& saved, const std::string& key) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : checkpoint::tensors_from_ivalue(saved.toGenericDict().at(key), key)) {
    out[item.key()] = item.value();
  }
  return out;
}

at::Tensor tensor_at(const c10::IValue& saved, const std::string& key) {
  return saved.toGenericDict().at(key).toTensor();
}

std::set<std::string> keys(const std::map<std::string, at::Tensor>& m) {
  std::set<std::string> out;
  for (const auto& [k, v] : m) out.insert(k);
  return out;
}

void expect_states_equal(const std::map<std::string, at::Tensor>& ours,
                         const std::map<std::string, at::Tensor>& theirs, const char* when,
                         double tol) {
  ASSERT_EQ(keys(ours), keys(theirs)) << when;
  for (const auto& [name, t] : theirs) {
    const at::Tensor& o = ours.at(name);
    ASSERT_EQ(o.sizes(), t.sizes()) << when << ": " << name;
    EXPECT_TRUE(torch::allclose(o.to(torch::kDouble), t.to(torch::kDouble), 0, tol))
        << when << ": " << name << " differs by "
        << (o.to(torch::kDouble) - t.to(torch::kDouble)).abs().max().item<double>();
  }
}

template <typename Model>
void run_case(const std::string& config_text, const std::string& kind = "mlp") {
  testing::TempDir dir("ds_compression_interop");
  const std::string config_path = dir.file("config.json");
  std::ofstream(config_path) << config_text;
  const auto run = testing::run_command(std::string("OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu ") +
                                        DS_DEEPSPEED_PYTHON + " " + DS_INTEROP_SCRIPT + " " +
                                        config_path + " " + dir.file("ds.pt") + " " + kind);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const c10::IValue saved = checkpoint::load(dir.file("ds.pt"));
  const CompressionConfig config = read_compression_config(json::parse(config_text), "config");

  Model net;
  {
    torch::NoGradGuard no_grad;
    const auto initial = dict_at(saved, "initial");
    for (auto& p : net->named_parameters()) p.value().copy_(initial.at(p.key()));
  }
  // The generator where the script's is at init_compression: seeded, then the initial
  // weights and the data drawn.
  torch::manual_seed(7);
  draw_as_the_script(net);
  init_compression(*net, config);
  // The same tensors under the same names: l1 masks computed alike, and topk scores drawn
  // alike (init_compression leaves the generator where DeepSpeed's leaves it).
  const auto after_init = dict_at(saved, "after_init");
  ASSERT_EQ(keys(state_of(*net)), keys(after_init));
  expect_states_equal(state_of(*net), after_init, "after init_compression", 0.0);

  const at::Tensor idx = tensor_at(saved, "idx");
  const at::Tensor target = tensor_at(saved, "target");
  const at::Tensor losses = tensor_at(saved, "losses");
  CompressionScheduler scheduler(*net, config);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
  for (int step = 0; step < kSteps; ++step) {
    if (step == 0) scheduler.step(/*step_zero_check=*/true);
    const at::Tensor loss = (net->forward(idx) - target).pow(2).mean();
    loss.backward();
    sgd.step();
    sgd.zero_grad();
    scheduler.step();
    EXPECT_NEAR(loss.item<double>(), losses[step].item<double>(), 1e-6) << "step " << step;
  }
  expect_states_equal(state_of(*net), dict_at(saved, "trained"), "after training", 1e-6);
  net->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(net->forward(idx), tensor_at(saved, "trained_out"), 0, 1e-5));

  redundancy_clean(*net, config);
  expect_states_equal(state_of(*net), dict_at(saved, "cleaned"), "after redundancy_clean", 1e-6);
  EXPECT_TRUE(torch::allclose(net->forward(idx), tensor_at(saved, "cleaned_out"), 0, 1e-5));
}

// Symmetric grouped weight quantization from step 0, dynamic activation quantization, l1 sparse
// pruning, topk row pruning of the MLP with its projection shrinking, topk head pruning of the
// output projection with q, k and v shrinking.
TEST(DeepSpeedCompressionInterop, PruningThatShrinksLayersEqualsDeepSpeeds) {
  run_case<Net>(R"({"compression_training": {
    "weight_quantization": {
      "shared_parameters": {"enabled": true, "quantize_weight_in_forward": true,
                            "quantization_type": "symmetric", "quantize_groups": 2,
                            "schedule_offset": 0},
      "different_groups": {"wq": {"params": {"start_bits": 8, "target_bits": 4},
                                  "modules": ["attn.q", "attn.k", "attn.v"]}}},
    "activation_quantization": {
      "shared_parameters": {"enabled": true, "quantization_type": "symmetric",
                            "range_calibration": "dynamic", "schedule_offset": 1},
      "different_groups": {"aq": {"params": {"bits": 8}, "modules": ["mlp.c_proj"]}}},
    "sparse_pruning": {
      "shared_parameters": {"enabled": true, "method": "l1", "schedule_offset": 2,
                            "schedule_offset_end": 2},
      "different_groups": {"sp": {"params": {"dense_ratio": 0.5}, "modules": ["attn.k"]}}},
    "row_pruning": {
      "shared_parameters": {"enabled": true, "method": "topk", "schedule_offset": 1},
      "different_groups": {"rp": {"params": {"dense_ratio": 0.5}, "modules": ["mlp.c_fc"],
                                  "related_modules": [["mlp.c_proj"]]}}},
    "head_pruning": {
      "shared_parameters": {"enabled": true, "method": "topk", "num_heads": 2,
                            "schedule_offset": 2},
      "different_groups": {"hp": {"params": {"dense_ratio": 0.5}, "modules": ["attn.o"],
                                  "related_modules": [["attn.q", "attn.k", "attn.v"]]}}}}})");
}

// Ternary and binary weights and a token-wise 4-bit embedding, static asymmetric 4-bit
// activations, topk sparse pruning switched on within its window, l1 row pruning that masks.
TEST(DeepSpeedCompressionInterop, TernaryBinaryStaticRangesAndMasksEqualDeepSpeeds) {
  run_case<Net>(R"({"compression_training": {
    "weight_quantization": {
      "shared_parameters": {"enabled": true, "quantize_weight_in_forward": true,
                            "schedule_offset": 1},
      "different_groups": {"ternary": {"params": {"start_bits": 8, "target_bits": 2},
                                       "modules": ["mlp.c_fc"]},
                           "binary": {"params": {"start_bits": 8, "target_bits": 1},
                                      "modules": ["attn.v"]},
                           "table": {"params": {"start_bits": 4, "target_bits": 4},
                                     "modules": ["emb"]}}},
    "activation_quantization": {
      "shared_parameters": {"enabled": true, "quantization_type": "asymmetric",
                            "range_calibration": "static", "schedule_offset": 0},
      "different_groups": {"aq": {"params": {"bits": 4}, "modules": ["attn.o"]}}},
    "sparse_pruning": {
      "shared_parameters": {"enabled": true, "method": "topk", "schedule_offset": 1,
                            "schedule_offset_end": 4},
      "different_groups": {"sp": {"params": {"dense_ratio": 0.25}, "modules": ["mlp.c_proj"]}}},
    "row_pruning": {
      "shared_parameters": {"enabled": true, "method": "l1", "schedule_offset": 3},
      "different_groups": {"rp": {"params": {"dense_ratio": 0.75}, "modules": ["attn.q"]}}}}})");
}

// Asymmetric 5-bit weights in 4 groups, static symmetric activations.
TEST(DeepSpeedCompressionInterop, AsymmetricWeightsAndStaticRangesEqualDeepSpeeds) {
  run_case<Net>(R"({"compression_training": {
    "weight_quantization": {
      "shared_parameters": {"enabled": true, "quantize_weight_in_forward": true,
                            "quantization_type": "asymmetric", "quantize_groups": 4,
                            "schedule_offset": 2},
      "different_groups": {"w5": {"params": {"start_bits": 8, "target_bits": 5},
                                  "modules": ["attn.o", "mlp.c_proj"]}}},
    "activation_quantization": {
      "shared_parameters": {"enabled": true, "range_calibration": "static",
                            "schedule_offset": 1},
      "different_groups": {"aq": {"params": {"bits": 8}, "modules": ["mlp.c_fc"]}}}}})");
}

// A convolutional network: topk channel pruning of conv1 cutting its channels out of bn1 and
// conv2's input, 4-bit asymmetric weights, l1 sparse pruning and dynamic per-sample 8-bit
// activations on conv2, topk row pruning of the head.
TEST(DeepSpeedCompressionInterop, ChannelPruningOfAConvNetEqualsDeepSpeeds) {
  run_case<Cnn>(R"({"compression_training": {
    "weight_quantization": {
      "shared_parameters": {"enabled": true, "quantize_weight_in_forward": true,
                            "quantization_type": "asymmetric", "quantize_groups": 2,
                            "schedule_offset": 0},
      "different_groups": {"w4": {"params": {"start_bits": 8, "target_bits": 4},
                                  "modules": ["conv2"]}}},
    "activation_quantization": {
      "shared_parameters": {"enabled": true, "quantization_type": "asymmetric",
                            "schedule_offset": 1},
      "different_groups": {"aq": {"params": {"bits": 8}, "modules": ["conv2"]}}},
    "sparse_pruning": {
      "shared_parameters": {"enabled": true, "method": "l1", "schedule_offset": 2,
                            "schedule_offset_end": 2},
      "different_groups": {"sp": {"params": {"dense_ratio": 0.5}, "modules": ["conv2"]}}},
    "row_pruning": {
      "shared_parameters": {"enabled": true, "method": "topk", "schedule_offset": 3},
      "different_groups": {"rp": {"params": {"dense_ratio": 0.5}, "modules": ["fc"]}}},
    "channel_pruning": {
      "shared_parameters": {"enabled": true, "method": "topk", "schedule_offset": 1},
      "different_groups": {"cp": {"params": {"dense_ratio": 0.5}, "modules": ["conv1"],
                                  "related_modules": [["bn1", "conv2"]]}}}}})",
                "cnn");
}

}  // namespace
}  // namespace deepspeed::compression
