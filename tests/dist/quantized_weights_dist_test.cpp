// ZeRO++'s qwZ (zero_optimization.zero_quantized_weights, Note [Quantized gather]) on Gloo
// ranks: a gather carries int8 and its steps and every rank reads each rank's shard back from
// them; the unit fetches (and, with hpZ, the backward's secondary gathers) carry a quarter of
// fp32's bytes while the refresh of the persistent parameters stays exact; the forward computes
// with the weights as quantized rank by rank; training follows exact ZeRO-3 closely (fp32 and
// bf16, and with MiCS) while zero::GatheredParameters still reads the exact weights.
#include "deepspeed/comms_logging.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/zero3.h"

#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/zero/stage3_param.h"
#include "runtime/zero/block_quantizer.h"
#include "support/logged_collectives.h"
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

// What every rank reads for rank r's shards, gathered together as `shards` (concatenated):
// their quantized values read back, in float.
at::Tensor read_back(const std::vector<at::Tensor>& shards) {
  const runtime::QuantizedBlocks q = quantize_blocks(torch::cat(shards));
  return dequantize_blocks(q.values.view({1, -1}), q.scales.view({1, -1}), at::kFloat)[0];
}

TEST(QuantizedWeightsDist, EachRankReadsEveryShardBackFromInt8) {
  run_ranks(3, [](int rank, int world) {
    // Small shards and one over the coalescing limit: quantized, all travel together.
    const std::vector<int64_t> sizes{7, 1000, 1000003};
    auto shard_of = [&](size_t i, int r) { return testing::random_shard(sizes, i, r, world); };
    std::vector<PartitionedParam> params = testing::released_params(sizes, rank, world);
    std::vector<PartitionedParam*> batch = testing::pointers_to(params);
    runtime::ShardGroup group(comm::world());
    group.quantize_weights = true;
    EXPECT_EQ(runtime::start_gathers(batch, group, /*async=*/true, false), 2);  // values, steps
    for (auto& p : params) runtime::finish_gather(p);

    std::vector<at::Tensor> rows;  // rank r's shards, as read back
    for (int r = 0; r < world; ++r) {
      std::vector<at::Tensor> shards;
      for (size_t i = 0; i < sizes.size(); ++i) shards.push_back(shard_of(i, r));
      rows.push_back(read_back(shards));
    }
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<at::Tensor> want, exact;
      for (int r = 0; r < world; ++r) {
        want.push_back(rows[r].narrow(0, offset, params[i].shard_numel));
        exact.push_back(shard_of(i, r));
      }
      offset += params[i].shard_numel;
      const at::Tensor w = torch::cat(want).narrow(0, 0, sizes[i]);
      const at::Tensor e = torch::cat(exact).narrow(0, 0, sizes[i]);
      EXPECT_TRUE(torch::equal(params[i].param, w)) << "parameter " << i;
      EXPECT_FALSE(torch::equal(params[i].param, e)) << "parameter " << i;
      EXPECT_TRUE(torch::allclose(params[i].param, e, 0, 0.02 * (i + 1) * 5)) << i;
      runtime::release(params[i]);
    }
    // The same gathers unquantized are exact.
    group.quantize_weights = false;
    runtime::start_gathers(batch, group, /*async=*/false, false);
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<at::Tensor> exact;
      for (int r = 0; r < world; ++r) exact.push_back(shard_of(i, r));
      EXPECT_TRUE(torch::equal(params[i].param, torch::cat(exact).narrow(0, 0, sizes[i]))) << i;
    }
  });
}

// Three units (the Linear layers; Tanh has no parameters).
std::shared_ptr<torch::nn::SequentialImpl> model() {
  torch::manual_seed(2024);
  return torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::Functional(torch::tanh),
                               torch::nn::Linear(16, 16), torch::nn::Functional(torch::tanh),
                               torch::nn::Linear(16, 2))
      .ptr();
}

json config(json zero, int world) {
  return {{"train_batch_size", 2 * world},
          // SGD: the update follows the gradient's small change (Adam's normalised one would
          // turn a tiny gradient's change of sign into a whole step).
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
          {"zero_allow_untested_optimizer", true},
          {"comms_logger", {{"enabled", true}}},
          {"zero_optimization", std::move(zero)}};
}

json no_prefetch(int64_t persistence) {
  return {{"stage", 3},
          {"stage3_param_persistence_threshold", persistence},
          {"stage3_max_reuse_distance", 0},
          {"stage3_prefetch_bucket_size", 0}};
}

// This rank's all-gathers in one training iteration and the refresh after its step, as the
// comms logger records them under `record`: message size (bytes) -> count.
std::map<int64_t, int64_t> all_gathers_of_one_iteration(const json& zero,
                                                        const std::string& record = "all_gather") {
  const int world = comm::get_world_size();
  auto engine = initialize(model(), config(zero, world)).engine;
  comm::reset_comms_log();
  auto [x, y] = tiny_batch(2 * comm::get_rank(), 2);
  engine->backward((engine->forward(x) - y).pow(2).mean());
  engine->step();
  std::map<int64_t, int64_t> out = testing::logged_message_sizes(record);
  comm::configure_comms_logger({});
  return out;
}

// On 2 ranks the layers' shards are 32 + 8, 128 + 8 and 16 + 1 floats (weight + bias); each
// fetch, forward and backward, gathers a layer's in one collective. Quantized, those carry one
// byte per element, padded to groups of 8, plus one 4-byte step.
TEST(QuantizedWeightsDist, FetchesCarryInt8AndThePersistentRefreshStaysExact) {
  run_ranks(2, [](int, int) {
    json z = no_prefetch(0);
    const std::map<int64_t, int64_t> exact{{4 * 40, 2}, {4 * 136, 2}, {4 * 17, 2}};
    EXPECT_EQ(all_gathers_of_one_iteration(z), exact);
    z["zero_quantized_weights"] = true;
    const std::map<int64_t, int64_t> quantized{{40, 2}, {136, 2}, {24, 2}, {4, 6}};
    EXPECT_EQ(all_gathers_of_one_iteration(z), quantized);
    // Biases persistent: the fetches gather the weights quantized, the refresh after the step
    // the biases (8 + 8 + 1 floats) exactly, in one collective.
    z["stage3_param_persistence_threshold"] = 16;
    const std::map<int64_t, int64_t> split{{32, 2}, {128, 2}, {16, 2}, {4, 6}, {4 * 17, 1}};
    EXPECT_EQ(all_gathers_of_one_iteration(z), split);
  });
}

// With hpZ (H = 2 of 4 ranks) the backward gathers the secondary partitions over the 2 ranks,
// quantized too: 32 + 8, 128 + 8 and 16 + 2 elements per layer.
TEST(QuantizedWeightsDist, HpzSecondaryGathersAreQuantizedToo) {
  run_ranks(4, [](int, int) {
    json z = no_prefetch(0);
    z["zero_quantized_weights"] = true;
    z["zero_hpz_partition_size"] = 2;
    const std::map<int64_t, int64_t> forward{{24, 1}, {72, 1}, {16, 1}, {4, 3}};
    EXPECT_EQ(all_gathers_of_one_iteration(z), forward);
    const std::map<int64_t, int64_t> backward{{40, 1}, {136, 1}, {24, 1}, {4, 3}};
    EXPECT_EQ(all_gathers_of_one_iteration(z, "all_gather (group zero_hpz)"), backward);
  });
}

// The forward computes with each layer's weight and bias as quantized rank by rank (a layer's
// shards are gathered together), which differs from the exact model's output.
TEST(QuantizedWeightsDist, TheForwardSeesTheWeightsAsQuantizedPerRank) {
  run_ranks(2, [](int rank, int world) {
    json z = no_prefetch(0);
    z["zero_quantized_weights"] = true;
    auto engine = initialize(model(), config(z, world)).engine;
    auto [x, y] = tiny_batch(2 * rank, 2);
    const at::Tensor got = engine->forward(x).detach();

    auto exact = model();
    const at::Tensor want_exact = exact->forward(x).detach();
    auto quantized = model();
    torch::NoGradGuard no_grad;
    for (const auto& child : quantized->children()) {
      auto* linear = child->as<torch::nn::LinearImpl>();
      if (linear == nullptr) continue;
      at::Tensor w = linear->weight.view({-1});
      at::Tensor b = linear->bias;
      const int64_t ws = w.numel() / world, bs = b.numel() / world;
      std::vector<at::Tensor> ws_back, bs_back;
      for (int r = 0; r < world; ++r) {
        const at::Tensor row = read_back({w.narrow(0, r * ws, ws), b.narrow(0, r * bs, bs)});
        ws_back.push_back(row.narrow(0, 0, ws));
        bs_back.push_back(row.narrow(0, ws, bs));
      }
      w.copy_(torch::cat(ws_back));
      b.copy_(torch::cat(bs_back));
    }
    const at::Tensor want = quantized->forward(x);
    EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-7)) << got << want;
    EXPECT_FALSE(torch::allclose(got, want_exact, 1e-6, 1e-7));
  });
}

// Trains 4 steps; returns the losses and, last, the parameters as GatheredParameters reads them.
std::vector<at::Tensor> train(int rank, int world, const json& zero, bool bf16) {
  auto m = model();
  json cfg = config(zero, world);
  cfg["bf16"] = {{"enabled", bf16}};
  auto engine = initialize(m, cfg).engine;
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  std::vector<double> losses;
  for (int s = 0; s < 4; ++s) {
    auto [x, y] = tiny_batch(s * 2 * world + 2 * rank, 2);
    at::Tensor loss = (engine->forward(x.to(dtype)) - y.to(dtype)).pow(2).mean();
    engine->backward(loss);
    engine->step();
    losses.push_back(loss.item<double>());
  }
  zero::GatheredParameters gathered(*m);
  std::vector<at::Tensor> flat;
  for (const auto& p : m->parameters()) flat.push_back(p.detach().reshape({-1}).to(at::kFloat));
  return {torch::tensor(losses, torch::kDouble), torch::cat(flat)};
}

// bf16: the weights, activations and loss are rounded to 8 bits of mantissa, about as coarse
// as the quantization (0.4 %), hence the looser bounds.
void expect_close_to_exact_zero3(int world, json zero, bool bf16 = false) {
  run_ranks(world, [zero, bf16](int rank, int world) mutable {
    const std::vector<at::Tensor> exact = train(rank, world, zero, bf16);
    zero["zero_quantized_weights"] = true;
    const std::vector<at::Tensor> quantized = train(rank, world, zero, bf16);
    EXPECT_FALSE(torch::equal(quantized[0], exact[0]));
    EXPECT_TRUE(torch::allclose(quantized[0], exact[0], bf16 ? 3e-2 : 1e-2, 0))
        << quantized[0] << exact[0];
    EXPECT_TRUE(torch::allclose(quantized[1], exact[1], 0, bf16 ? 1e-2 : 2e-3))
        << (quantized[1] - exact[1]).abs().max() << exact[1].abs().max();
  });
}

TEST(QuantizedWeightsDist, TrainsCloseToExactZero3) {
  expect_close_to_exact_zero3(2, {{"stage", 3}, {"stage3_param_persistence_threshold", 0}});
}

TEST(QuantizedWeightsDist, TrainsCloseToExactZero3InBf16) {
  expect_close_to_exact_zero3(2, {{"stage", 3}, {"stage3_param_persistence_threshold", 0}},
                              /*bf16=*/true);
}

TEST(QuantizedWeightsDist, TrainsCloseToExactMics) {
  expect_close_to_exact_zero3(4, {{"stage", 3},
                                  {"stage3_param_persistence_threshold", 0},
                                  {"mics_shard_size", 2}});
}

// Quantized fetches leave the shards alone: after a forward and backward, GatheredParameters
// reads the initial weights bit for bit.
TEST(QuantizedWeightsDist, GatheredParametersReadTheExactWeights) {
  run_ranks(2, [](int rank, int world) {
    json z = no_prefetch(0);
    z["zero_quantized_weights"] = true;
    auto m = model();
    auto engine = initialize(m, config(z, world)).engine;
    auto [x, y] = tiny_batch(2 * rank, 2);
    engine->backward((engine->forward(x) - y).pow(2).mean());
    zero::GatheredParameters gathered(*m);
    const auto initial = model()->parameters();
    const auto now = m->parameters();
    for (size_t i = 0; i < now.size(); ++i) EXPECT_TRUE(torch::equal(now[i], initial[i])) << i;
  });
}

}  // namespace
}  // namespace deepspeed
