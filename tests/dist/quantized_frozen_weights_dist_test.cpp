// ZeRO++'s zero_quantized_nontrainable_weights (Note [Quantized frozen shards]) on Gloo ranks:
// kept shards gather back per parameter in two collectives next to exact ones; a fine-tuning
// model (frozen layers, a trainable head) keeps its frozen shards in int8 (the memory report
// says so), computes with them as quantized rank by rank (on one rank too, and persistent),
// trains its head close to the exact run, reads them back through GatheredParameters, and
// saves and resumes them bit for bit.
#include "deepspeed/deepspeed.h"
#include "deepspeed/zero3.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/zero/block_quantizer.h"
#include "runtime/zero/stage3_param.h"
#include "support/multi_rank.h"
#include "support/released_params.h"
#include "support/tiny_model.h"  // tiny_batch

namespace deepspeed {
namespace {

using runtime::dequantize_blocks;
using runtime::PartitionedParam;
using runtime::quantize_blocks;
using testing::run_ranks;
using testing::tiny_batch;

// A flat shard as kept: quantized on its own, read back.
at::Tensor kept(const at::Tensor& shard) {
  const runtime::QuantizedBlocks q = quantize_blocks(shard.reshape({-1}));
  return dequantize_blocks(q.values.view({1, -1}), q.scales.view({1, -1}), shard.scalar_type())[0]
      .narrow(0, 0, shard.numel());
}

// `w` as every rank reads it when each of `world` ranks keeps its shard quantized.
at::Tensor as_kept(const at::Tensor& w, int world) {
  const int64_t n = w.numel(), s = runtime::shard_numel_for(n, world);
  const at::Tensor padded = torch::zeros({s * world}, w.options());
  padded.narrow(0, 0, n).copy_(w.reshape({-1}));
  std::vector<at::Tensor> rows;
  for (int r = 0; r < world; ++r) rows.push_back(kept(padded.narrow(0, r * s, s)));
  return torch::cat(rows).narrow(0, 0, n).view(w.sizes());
}

TEST(QuantizedFrozenWeightsDist, KeptShardsGatherBackPerParameter) {
  run_ranks(3, [](int rank, int world) {
    // Sizes with different group layouts, and one exact parameter in the same call.
    const std::vector<int64_t> sizes{7, 1000, 1000003, 50};
    auto shard_of = [&](size_t i, int r) { return testing::random_shard(sizes, i, r, world); };
    std::vector<PartitionedParam> params = testing::released_params(sizes, rank, world);
    for (size_t i = 0; i < 3; ++i) runtime::quantize_shard(params[i]);
    std::vector<PartitionedParam*> batch = testing::pointers_to(params);
    EXPECT_FALSE(params[1].shard.defined());
    // 334 elements in 8-bit groups: 336 bytes and one 4-byte step.
    EXPECT_EQ(runtime::shard_bytes(params[1]), 336 + 4);
    EXPECT_EQ(runtime::shard_bytes(params[3]), 17 * 4);
    EXPECT_TRUE(torch::equal(runtime::shard_values(params[1]), kept(shard_of(1, rank))));
    // The kept ones in two collectives (values, steps), the exact one in a third.
    runtime::ShardGroup group(comm::world());
    EXPECT_EQ(runtime::start_gathers(batch, group, /*async=*/true, false), 3);
    for (auto& p : params) runtime::finish_gather(p);
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<at::Tensor> rows;
      for (int r = 0; r < world; ++r) rows.push_back(i < 3 ? kept(shard_of(i, r)) : shard_of(i, r));
      EXPECT_TRUE(torch::equal(params[i].param, torch::cat(rows).narrow(0, 0, sizes[i]))) << i;
    }
    // Writing back what the shard reads keeps its blocks; other values are quantized anew.
    PartitionedParam& p = params[1];
    const at::Tensor values_before = p.quantized.values;
    runtime::set_shard_values(p, runtime::shard_values(p));
    EXPECT_TRUE(p.quantized.values.is_same(values_before));
    const at::Tensor other = shard_of(1, rank) * 3;
    runtime::set_shard_values(p, other);
    EXPECT_TRUE(torch::equal(runtime::shard_values(p), kept(other)));
  });
}

// Fine-tuning: two frozen layers and a trainable head (DeepSpeed quantizes what does not require
// grad). Persistent parameters: none below `persistence` elements.
std::shared_ptr<torch::nn::SequentialImpl> model() {
  torch::manual_seed(2025);
  auto m = torch::nn::Sequential(torch::nn::Linear(4, 32), torch::nn::Functional(torch::tanh),
                                 torch::nn::Linear(32, 32), torch::nn::Functional(torch::tanh),
                                 torch::nn::Linear(32, 2))
               .ptr();
  for (size_t i : {0, 2}) {
    for (auto& p : m->ptr(i)->parameters()) p.requires_grad_(false);
  }
  return m;
}

json config(bool quantized, int world, int64_t persistence = 0) {
  return {{"train_batch_size", 2 * world},
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
          {"zero_allow_untested_optimizer", true},
          {"zero_optimization",
           {{"stage", 3},
            {"stage3_param_persistence_threshold", persistence},
            {"zero_quantized_nontrainable_weights", quantized}}}};
}

// The model with its frozen layers as `world` ranks keep them.
std::shared_ptr<torch::nn::SequentialImpl> kept_model(int world) {
  auto m = model();
  torch::NoGradGuard no_grad;
  for (size_t i : {0, 2}) {
    for (auto& p : m->ptr(i)->parameters()) p.copy_(as_kept(p, world));
  }
  return m;
}

void expect_forward_sees_kept_weights(int world, int64_t persistence) {
  run_ranks(world, [persistence](int rank, int world) {
    auto engine = initialize(model(), config(true, world, persistence)).engine;
    auto [x, y] = tiny_batch(2 * rank, 2);
    const at::Tensor got = engine->forward(x).detach();
    const at::Tensor want = kept_model(world)->forward(x);
    EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-7)) << got << want;
    EXPECT_FALSE(torch::allclose(got, model()->forward(x), 1e-6, 1e-7));
  });
}

TEST(QuantizedFrozenWeightsDist, TheForwardSeesTheFrozenWeightsAsKept) {
  expect_forward_sees_kept_weights(2, 0);
}

TEST(QuantizedFrozenWeightsDist, PersistentFrozenWeightsAreKeptToo) {
  expect_forward_sees_kept_weights(2, 100000);
}

TEST(QuantizedFrozenWeightsDist, OneRankKeepsThemToo) {
  expect_forward_sees_kept_weights(1, 0);
}

// The frozen shards in int8: on 2 ranks 80 + 16 and 528 + 16 elements (weight + bias) of the two
// frozen layers take 4 bytes each exact; kept, each shard its bytes padded to a multiple of 8
// and a 4-byte step.
TEST(QuantizedFrozenWeightsDist, TheMemoryReportCountsTheInt8Shards) {
  run_ranks(2, [](int, int world) {
    auto exact = initialize(model(), config(false, world)).engine;
    auto quantized = initialize(model(), config(true, world)).engine;
    const int64_t exact_bytes = 4 * (64 + 16 + 512 + 16);
    const int64_t kept_bytes = (64 + 4) + (16 + 4) + (512 + 4) + (16 + 4);
    EXPECT_EQ(exact->memory_stats().param_bytes - quantized->memory_stats().param_bytes,
              exact_bytes - kept_bytes);
  });
}

// Trains 4 steps; returns the losses and the parameters as GatheredParameters reads them.
std::vector<at::Tensor> train(int rank, int world, bool quantized,
                              const std::string& save_dir = "") {
  auto m = model();
  auto engine = initialize(m, config(quantized, world)).engine;
  std::vector<double> losses;
  for (int s = 0; s < 4; ++s) {
    auto [x, y] = tiny_batch(s * 2 * world + 2 * rank, 2);
    at::Tensor loss = (engine->forward(x) - y).pow(2).mean();
    engine->backward(loss);
    engine->step();
    losses.push_back(loss.item<double>());
  }
  if (!save_dir.empty()) engine->save_checkpoint(save_dir, "t");
  zero::GatheredParameters gathered(*m);
  std::vector<at::Tensor> flat;
  for (const auto& p : m->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
  return {torch::tensor(losses, torch::kDouble), torch::cat(flat)};
}

at::Tensor flat_parameters(torch::nn::Module& m) {
  std::vector<at::Tensor> flat;
  for (const auto& p : m.parameters()) flat.push_back(p.detach().reshape({-1}).clone());
  return torch::cat(flat);
}

TEST(QuantizedFrozenWeightsDist, TrainsTheHeadCloseToExactAndKeepsTheFrozenWeights) {
  run_ranks(2, [](int rank, int world) {
    const std::vector<at::Tensor> exact = train(rank, world, false);
    const std::vector<at::Tensor> quantized = train(rank, world, true);
    EXPECT_FALSE(torch::equal(quantized[0], exact[0]));
    EXPECT_TRUE(torch::allclose(quantized[0], exact[0], 1e-2, 0)) << quantized[0] << exact[0];
    // GatheredParameters reads the frozen layers as kept (unchanged by the steps), the head
    // trained close to the exact run's.
    auto kept_now = kept_model(world);
    const int64_t frozen = 4 * 32 + 32 + 32 * 32 + 32;
    EXPECT_TRUE(torch::equal(quantized[1].narrow(0, 0, frozen),
                             flat_parameters(*kept_now).narrow(0, 0, frozen)));
    const at::Tensor head = quantized[1].narrow(0, frozen, 32 * 2 + 2);
    const at::Tensor exact_head = exact[1].narrow(0, frozen, 32 * 2 + 2);
    EXPECT_FALSE(torch::equal(head, flat_parameters(*model()).narrow(0, frozen, 66)));
    EXPECT_TRUE(torch::allclose(head, exact_head, 0, 1e-2)) << (head - exact_head).abs().max();
  });
}

// A checkpoint holds the frozen weights as read back: a resumed engine keeps the same blocks
// (its forward equals the saving engine's), and an engine without quantization loads them as
// they are.
TEST(QuantizedFrozenWeightsDist, CheckpointsResumeTheKeptWeightsBitForBit) {
  run_ranks(2, [](int rank, int world) {
    const std::string dir = testing::rank_output_dir() + "/ckpt";
    const std::vector<at::Tensor> saved = train(rank, world, true, dir);
    for (bool quantized : {true, false}) {
      auto m = model();
      auto engine = initialize(m, config(quantized, world)).engine;
      engine->load_checkpoint(dir, "t");
      zero::GatheredParameters gathered(*m);
      EXPECT_TRUE(torch::equal(flat_parameters(*m), saved[1])) << "quantized " << quantized;
    }
  });
}

}  // namespace
}  // namespace deepspeed
