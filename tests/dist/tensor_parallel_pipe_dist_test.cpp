// 3D parallelism on 8 Gloo ranks: the example GPT as a pipeline of 2 stages, each stage's
// attention and MLP split over 2 tensor-parallel ranks by AutoTP, 2 data-parallel replicas
// (PipeModelDataParallelTopology(2, 2, 2)). After K steps of ZeRO-1 SGD with active clipping
// every parameter (tensor-parallel shards gathered) equals the single-process model's trained on
// the same global batches, within 1e-5 relative; so do the loss and the gradient norm.
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "deepspeed/pipe.h"
#include "deepspeed/tensor_parallel.h"
#include "gpt_pipe.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"

namespace deepspeed {
namespace {

namespace tp = tensor_parallel;
using examples::GptConfig;
using testing::run_ranks;

constexpr int64_t kSeq = 8;
constexpr int kSteps = 3;
constexpr int64_t kGlobalBatch = 4;  // sequences per step; micro-batches of one sequence

GptConfig tiny_gpt() {
  GptConfig c;
  c.vocab_size = 37;
  c.block_size = kSeq;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  return c;
}

json config(int dp, int autotp) {
  json c = {{"train_batch_size", kGlobalBatch},
            {"train_micro_batch_size_per_gpu", 1},
            {"gradient_accumulation_steps", kGlobalBatch / dp},
            {"gradient_clipping", 0.5},
            // SGD: Adam would amplify the rounding noise of gradients that are zero in exact
            // arithmetic (see tensor_parallel_engine_dist_test.cpp).
            {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}}}}},
            {"zero_allow_untested_optimizer", true},
            {"zero_optimization", {{"stage", 1}}}};
  if (autotp > 1) c["tensor_parallel"] = {{"autotp_size", autotp}};
  return c;
}

std::pair<at::Tensor, at::Tensor> sequence(int64_t i) {
  auto pos = torch::arange(kSeq + 1, torch::kLong);
  auto stream = (pos * (i % 5 + 2) + i * 3 + (pos * pos) % 7) % 37;
  return {stream.narrow(0, 0, kSeq).unsqueeze(0), stream.narrow(0, 1, kSeq).unsqueeze(0)};
}

std::string dir() { return std::getenv("DS_TP3D_OUT"); }

// Trains; data-parallel rank 0 and tensor-parallel rank 0 of each stage saves the stage's full
// parameters (shards gathered over the tensor-parallel group, which every peer joins).
void train(const ProcessTopology& topo, const std::string& out_name) {
  pipe::PipelineModuleOptions o;
  o.topology = topo;
  o.loss_fn = examples::gpt_pipeline_loss;
  o.seed_layers = true;
  o.base_seed = 42;
  auto module = std::make_shared<pipe::PipelineModule>(examples::gpt_pipeline_specs(tiny_gpt()), o);
  const int dp = module->groups().data().size();
  const int dp_rank = module->groups().coord("data");
  auto engine = pipe::initialize(module, config(dp, topo.get_dim("model")));
  const int64_t gas = kGlobalBatch / dp;
  double loss = 0.0;
  for (int s = 0; s < kSteps; ++s) {
    int64_t j = 0;
    loss = engine->train_batch([&]() { return sequence(s * kGlobalBatch + dp_rank * gas + j++); })
               .item<double>();
  }
  std::map<std::string, at::Tensor> full;
  for (const auto& item : module->named_parameters()) {
    at::Tensor p = item.value().detach();
    if (tp::is_tensor_parallel(item.value())) {  // the mark is on the parameter, not a detach
      const tp::ShardInfo si = tp::shard_info(item.value());
      at::Tensor in = p.contiguous();
      at::Tensor flat = at::empty({si.group.size() * in.numel()}, in.options());
      comm::all_gather(flat, in, false, si.group);
      std::vector<at::Tensor> parts;
      for (int r = 0; r < si.group.size(); ++r) {
        parts.push_back(flat.narrow(0, r * in.numel(), in.numel()).view(in.sizes()));
      }
      p = tp::unshard(parts, si.partition_dim, si.partition_stride);
    }
    full[item.key()] = p.clone();
  }
  if (dp_rank != 0 || module->groups().coord("model") != 0) return;
  std::vector<at::Tensor> tensors;
  std::ofstream names(dir() + "/" + out_name + std::to_string(module->stage_id()) + ".names");
  for (const auto& [n, t] : full) {
    names << n << "\n";
    tensors.push_back(t);
  }
  tensors.push_back(torch::tensor({loss, engine->get_global_grad_norm().value_or(-1.0)},
                                  torch::kDouble));
  torch::save(tensors, dir() + "/" + out_name + std::to_string(module->stage_id()) + ".pt");
}

std::map<std::string, at::Tensor> load(const std::string& name, double* loss, double* norm) {
  std::vector<at::Tensor> tensors;
  torch::load(tensors, dir() + "/" + name + ".pt");
  std::ifstream in(dir() + "/" + name + ".names");
  std::map<std::string, at::Tensor> out;
  std::string n;
  size_t i = 0;
  while (std::getline(in, n)) out[n] = tensors.at(i++);
  *loss = tensors.back()[0].item<double>();
  *norm = tensors.back()[1].item<double>();
  return out;
}

TEST(TensorParallelPipeDist, Tp2xPp2xDp2MatchesOneProcessAfterKSteps_Zero1) {
  testing::new_shared_run_dir("DS_TP3D_OUT");
  run_ranks(1, [](int, int) { train(PipeModelDataParallelTopology(1, 1, 1), "reference"); });
  testing::RunOptions o;
  o.timeout_s = 300;
  run_ranks(8, [](int, int) { train(PipeModelDataParallelTopology(2, 2, 2), "stage"); }, o);
  if (testing::in_rank_process()) return;
  double ref_loss = 0, ref_norm = 0;
  auto ref = load("reference0", &ref_loss, &ref_norm);
  EXPECT_GT(ref_norm, 0.5) << "clipping must be active";
  std::map<std::string, int> seen;
  for (int s = 0; s < 2; ++s) {
    double loss = 0, norm = 0;
    auto got = load("stage" + std::to_string(s), &loss, &norm);
    EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss)) << "stage " << s;
    EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm) << "stage " << s;
    for (const auto& [name, t] : got) {
      // The last stage holds the whole tied embedding module, but only wte is tied to it (the
      // head): its wpe is an unused copy (as in DeepSpeed, where a tied module lives whole on
      // every stage that uses it).
      if (s > 0 && name == "tied_modules.embed.wpe.weight") continue;
      ASSERT_TRUE(ref.count(name)) << name;
      const at::Tensor& r = ref.at(name);
      ASSERT_EQ(t.sizes(), r.sizes()) << name;
      const double diff = (t - r).abs().max().item<double>();
      EXPECT_LE(diff, 1e-5 * r.abs().max().item<double>()) << name << " on stage " << s;
      ++seen[name];
    }
  }
  for (const auto& [name, t] : ref) EXPECT_GE(seen[name], 1) << name << " on no stage";
}

}  // namespace
}  // namespace deepspeed
