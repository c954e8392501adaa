// ZeRO++'s qgZ (zero_optimization.zero_quantized_gradients, Note [Quantized reduction]) on 4
// Gloo ranks as 2 nodes of 2 (NDEV_PER_NODE): the node groups; the two all-to-alls give each
// rank the sum of its rows exactly as a rendering of the two stages with the quantizer does;
// the inter-node all-to-alls carry 4-bit blocks; training follows exact ZeRO-3 closely (fp32
// and bf16); on one node the reduction is exact; bad layouts are refused by key. LoCo
// (zeropp_loco_param, Note [LoCo error feedback]): each stage compensates as a rendering does,
// repeated reductions stop accumulating the rounding, training with it, its errors' bytes, and
// their drop on a skipped step. The first stage overlapped (overlap_comm) trains as the
// synchronous one.
#include "deepspeed/comms_logging.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/zero3.h"

#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/zero/block_quantizer.h"
#include "runtime/zero/loco_error_feedback.h"
#include "runtime/zero/quantized_reduction.h"
#include "runtime/zero/stage3_groups.h"
#include "runtime/zero/zero_optimizer.h"
#include "support/multi_rank.h"
#include "support/tiny_model.h"  // tiny_batch

namespace deepspeed {
namespace {

using runtime::dequantize_blocks;
using runtime::kGradientBits;
using runtime::kGradientGroupNumel;
using runtime::quantize_blocks;
using testing::run_ranks;
using testing::tiny_batch;

constexpr int kNodes = 2;
constexpr int kPerNode = 2;
constexpr int kWorld = kNodes * kPerNode;

testing::RunOptions two_nodes() {
  testing::RunOptions o;
  o.env.push_back({"NDEV_PER_NODE", std::to_string(kPerNode)});
  return o;
}

json zero3(bool qgz) {
  return {{"stage", 3},
          {"stage3_param_persistence_threshold", 0},
          {"zero_quantized_gradients", qgz}};
}

DeepSpeedConfig config_of(const json& zero) {
  return load_config(json{{"train_batch_size", kWorld}, {"zero_optimization", zero}});
}

// A row as the quantizer hands it to the receiver: 4-bit blocks read back.
at::Tensor through_4_bits(const at::Tensor& row) {
  const runtime::QuantizedBlocks q = quantize_blocks(row, kGradientBits, kGradientGroupNumel);
  return dequantize_blocks(q.values.view({1, -1}), q.scales.view({1, -1}), at::kFloat,
                           kGradientBits)[0].narrow(0, 0, row.numel());
}

TEST(QuantizedGradientsDist, NodeGroupsSplitTheWorldByNodeAndLocalRank) {
  run_ranks(kWorld, [](int rank, int) {
    auto g = runtime::make_qgz_groups(config_of(zero3(true)), comm::world(), false);
    ASSERT_TRUE(g.has_value());
    const int node = rank / kPerNode, local = rank % kPerNode;
    EXPECT_EQ(g->intra_node.ranks(), (std::vector<int>{node * kPerNode, node * kPerNode + 1}));
    EXPECT_EQ(g->inter_node.ranks(), (std::vector<int>{local, local + kPerNode}));
    EXPECT_FALSE(runtime::make_qgz_groups(config_of(zero3(false)), comm::world(), false));
  }, two_nodes());
}

// Rank `from`'s bucket: W rows of R, row r for rank r, over a few decades of magnitude.
at::Tensor rows_of(int from, int64_t r) {
  torch::manual_seed(17 + from);
  return torch::randn({kWorld, r}) * torch::pow(10.0, torch::randint(-2, 2, {kWorld, r}));
}

TEST(QuantizedGradientsDist, EachRankGetsItsRowsSumAsTheTwoStagesMakeIt) {
  run_ranks(kWorld, [](int rank, int) {
    const int64_t r = 5000;  // three 4-bit groups per row
    auto groups = runtime::make_qgz_groups(config_of(zero3(true)), comm::world(), false);
    ASSERT_TRUE(groups.has_value());
    at::Tensor out = torch::empty({r});
    runtime::quantized_reduce_scatter(out, rows_of(rank, r), *groups);

    // The two stages, rendered: node n's ranks (n, s) send local rank l the rows of ranks
    // (m, l) for every node m; what arrives is summed over s; then node m sends rank (n, l)
    // its sum's row n, and those are summed over m.
    const int node = rank / kPerNode, local = rank % kPerNode;
    std::vector<at::Tensor> from_nodes;
    for (int m = 0; m < kNodes; ++m) {
      std::vector<at::Tensor> from_peers;
      for (int s = 0; s < kPerNode; ++s) {
        const at::Tensor rows = rows_of(m * kPerNode + s, r).view({kNodes, kPerNode, r});
        from_peers.push_back(through_4_bits(rows.select(1, local).reshape({-1})));
      }
      const at::Tensor node_sum = torch::stack(from_peers).sum(0).view({kNodes, r});
      from_nodes.push_back(through_4_bits(node_sum[node]));
    }
    const at::Tensor want = torch::stack(from_nodes).sum(0);
    EXPECT_TRUE(torch::equal(out, want));
    // Close to the exact sum, but not equal to it.
    at::Tensor exact = torch::zeros({r});
    for (int from = 0; from < kWorld; ++from) exact += rows_of(from, r)[rank];
    EXPECT_FALSE(torch::equal(out, exact));
    EXPECT_LT((out - exact).abs().max().item<double>(), 0.2 * exact.abs().max().item<double>());
  }, two_nodes());
}

// Every rank's LoCo errors, rendered in one process with the errors' own arithmetic (tested in
// loco_error_feedback_test): rank (m, s) compensates the rows it sends its node peers, and the
// node sums it sends the other nodes.
struct RenderedLoco {
  explicit RenderedLoco(double beta) : beta(beta), intra(kWorld), inter(kWorld) {}
  // Rank `rank`'s output of one reduction of every rank's `rows` [W, R].
  at::Tensor reduce(const std::vector<at::Tensor>& rows, int rank) {
    const int64_t r = rows[0].size(1);
    std::vector<at::Tensor> read(kWorld);  // what rank w's intra stage sends, read back
    for (int w = 0; w < kWorld; ++w) {
      const at::Tensor by_local =
          rows[w].view({kNodes, kPerNode, r}).transpose(0, 1).reshape({kPerNode, -1});
      const at::Tensor sent = intra[w].compensate(by_local);
      std::vector<at::Tensor> back;
      for (int l = 0; l < kPerNode; ++l) back.push_back(through_4_bits(sent[l]));
      read[w] = torch::stack(back);
      intra[w].update(sent, read[w], beta);
    }
    std::vector<at::Tensor> inter_read(kWorld);  // what rank w's inter stage sends, read back
    for (int w = 0; w < kWorld; ++w) {
      const int m = w / kPerNode, l = w % kPerNode;
      std::vector<at::Tensor> from_peers;
      for (int s = 0; s < kPerNode; ++s) from_peers.push_back(read[m * kPerNode + s][l]);
      const at::Tensor node_sum = torch::stack(from_peers).sum(0).view({kNodes, r});
      const at::Tensor sent = inter[w].compensate(node_sum);
      std::vector<at::Tensor> back;
      for (int n = 0; n < kNodes; ++n) back.push_back(through_4_bits(sent[n]));
      inter_read[w] = torch::stack(back);
      inter[w].update(sent, inter_read[w], beta);
    }
    const int node = rank / kPerNode, local = rank % kPerNode;
    std::vector<at::Tensor> from_nodes;
    for (int m = 0; m < kNodes; ++m) from_nodes.push_back(inter_read[m * kPerNode + local][node]);
    return torch::stack(from_nodes).sum(0);
  }
  void reset() {
    for (auto& e : intra) e.reset();
    for (auto& e : inter) e.reset();
  }
  double beta;
  std::vector<runtime::StageError> intra, inter;
};

// Every rank's bucket at reduction `k`.
std::vector<at::Tensor> buckets_at(int k, int64_t r) {
  std::vector<at::Tensor> rows;
  for (int w = 0; w < kWorld; ++w) rows.push_back(rows_of(w + 10 * k, r));
  return rows;
}

TEST(QuantizedGradientsDist, LocoCompensatesEachStageAsTheRenderingDoes) {
  run_ranks(kWorld, [](int rank, int) {
    const int64_t r = 5000;
    auto groups = runtime::make_qgz_groups(config_of(zero3(true)), comm::world(), false);
    ASSERT_TRUE(groups.has_value());
    LocoConfig config;
    config.err_beta = 0.5;
    config.reset_T = 1;  // reductions 1 and 3 start from zero
    runtime::LocoErrorFeedback loco(config, 1);
    RenderedLoco rendered(config.err_beta);
    for (int k = 0; k < 3; ++k) {
      const std::vector<at::Tensor> rows = buckets_at(k, r);
      at::Tensor out = torch::empty({r});
      runtime::quantized_reduce_scatter(out, rows[rank], *groups, &loco.begin_reduction(0));
      if (k == 2) rendered.reset();
      EXPECT_TRUE(torch::equal(out, rendered.reduce(rows, rank))) << "reduction " << k + 1;
      // Without the errors, the second reduction would differ; the first and third carry none.
      at::Tensor plain = torch::empty({r});
      runtime::quantized_reduce_scatter(plain, rows[rank], *groups);
      EXPECT_EQ(torch::equal(out, plain), k != 1) << "reduction " << k + 1;
    }
  }, two_nodes());
}

// The point of error feedback: the same bucket reduced again and again. Plain qgZ rounds it the
// same way every time, so the mean of the sums keeps that error; with err_beta 0 the roundings
// carried on cancel, and the mean comes within a fraction of it.
TEST(QuantizedGradientsDist, LocoStopsTheRoundingFromAccumulating) {
  run_ranks(kWorld, [](int rank, int) {
    const int64_t r = 5000;
    auto groups = runtime::make_qgz_groups(config_of(zero3(true)), comm::world(), false);
    ASSERT_TRUE(groups.has_value());
    LocoConfig config;
    config.err_beta = 0.0;
    runtime::LocoErrorFeedback loco(config, 1);
    const std::vector<at::Tensor> rows = buckets_at(0, r);
    at::Tensor exact = torch::zeros({r});
    for (int from = 0; from < kWorld; ++from) exact += rows[from][rank];
    const int k = 32;
    at::Tensor plain_sum = torch::zeros({r}), loco_sum = torch::zeros({r});
    for (int i = 0; i < k; ++i) {
      at::Tensor out = torch::empty({r});
      runtime::quantized_reduce_scatter(out, rows[rank], *groups);
      plain_sum += out;
      runtime::quantized_reduce_scatter(out, rows[rank], *groups, &loco.begin_reduction(0));
      loco_sum += out;
    }
    const double plain_error = (plain_sum / k - exact).abs().max().item<double>();
    const double loco_error = (loco_sum / k - exact).abs().max().item<double>();
    EXPECT_GT(plain_error, 0.01 * exact.abs().max().item<double>());
    EXPECT_LT(loco_error, 0.2 * plain_error) << loco_error << " vs " << plain_error;
  }, two_nodes());
}

std::shared_ptr<torch::nn::SequentialImpl> model() {
  torch::manual_seed(99);
  return torch::nn::Sequential(torch::nn::Linear(4, 32), torch::nn::Functional(torch::tanh),
                               torch::nn::Linear(32, 32), torch::nn::Functional(torch::tanh),
                               torch::nn::Linear(32, 2))
      .ptr();
}

json train_config(json zero) {
  return {{"train_batch_size", 2 * kWorld},
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
          {"zero_allow_untested_optimizer", true},
          {"comms_logger", {{"enabled", true}}},
          {"zero_optimization", std::move(zero)}};
}

// Trains 4 steps; returns the losses and, last, the parameters. `record`, if given, receives
// this rank's collectives of the last step: record name -> bytes.
std::vector<at::Tensor> train(int rank, const json& zero_section,
                              std::map<std::string, int64_t>* record = nullptr,
                              bool bf16 = false, int64_t* comm_buffer_bytes = nullptr) {
  auto m = model();
  json cfg = train_config(zero_section);
  cfg["bf16"] = {{"enabled", bf16}};
  auto engine = initialize(m, cfg).engine;
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  std::vector<double> losses;
  for (int s = 0; s < 4; ++s) {
    comm::reset_comms_log();
    auto [x, y] = tiny_batch(s * 2 * kWorld + 2 * rank, 2);
    at::Tensor loss = (engine->forward(x.to(dtype)) - y.to(dtype)).pow(2).mean();
    engine->backward(loss);
    engine->step();
    losses.push_back(loss.item<double>());
  }
  if (record != nullptr) {
    for (const auto& e : comm::comms_log_entries()) {
      (*record)[e.record_name] += e.msg_size_bytes * e.count;
    }
  }
  comm::configure_comms_logger({});
  if (comm_buffer_bytes != nullptr) *comm_buffer_bytes = engine->memory_stats().comm_buffer_bytes;
  zero::GatheredParameters gathered(*m);
  std::vector<at::Tensor> flat;
  for (const auto& p : m->parameters()) flat.push_back(p.detach().reshape({-1}).to(at::kFloat));
  return {torch::tensor(losses, torch::kDouble), torch::cat(flat)};
}

TEST(QuantizedGradientsDist, TrainsCloseToExactZero3) {
  run_ranks(kWorld, [](int rank, int) {
    std::map<std::string, int64_t> exact_comms, quantized_comms;
    const std::vector<at::Tensor> exact = train(rank, zero3(false), &exact_comms);
    const std::vector<at::Tensor> quantized = train(rank, zero3(true), &quantized_comms);
    // 4-bit gradients: a bucket's row is one group here, so its small elements (the biases')
    // are off by up to 6 % of its largest; the losses stay within 3 %.
    EXPECT_FALSE(torch::equal(quantized[1], exact[1]));
    EXPECT_TRUE(torch::allclose(quantized[0], exact[0], 3e-2, 0)) << quantized[0] << exact[0];
    EXPECT_TRUE(torch::allclose(quantized[1], exact[1], 0, 3e-2))
        << (quantized[1] - exact[1]).abs().max();
    // The gradients cross the nodes as 4-bit blocks: the model's 1,282 elements, one bucket of
    // 4 rows of 321 (each parameter padded to 4 shards), leave each rank as 2 rows of 321 (its
    // node's sums for the 2 ranks with its local rank), 328 values (groups are multiples of 8)
    // in 164 bytes each, and one 4-byte step per row. Inside the node, 2 rows of 642 (for each
    // node peer, the rows of the 2 ranks with its local rank), 648 values in 324 bytes. The
    // exact reduction all-reduces the bucket's 1,284 floats.
    EXPECT_EQ(quantized_comms["all_to_all_single (group zero_qgz_inter_node)"], 2 * (164 + 4));
    EXPECT_EQ(quantized_comms["all_to_all_single (group zero_qgz_intra_node)"], 2 * (324 + 4));
    EXPECT_EQ(exact_comms.count("all_to_all_single (group zero_qgz_inter_node)"), 0u);
    EXPECT_EQ(exact_comms["all_reduce"], 4 * 1284 + 8);  // and the gradient norm's
  }, two_nodes());
}

// bf16 buckets: quantized from and read back into bf16.
TEST(QuantizedGradientsDist, TrainsCloseToExactZero3InBf16) {
  run_ranks(kWorld, [](int rank, int) {
    const std::vector<at::Tensor> exact = train(rank, zero3(false), nullptr, /*bf16=*/true);
    const std::vector<at::Tensor> quantized = train(rank, zero3(true), nullptr, /*bf16=*/true);
    EXPECT_FALSE(torch::equal(quantized[1], exact[1]));
    // bf16 losses carry 3 significant digits on top of the 4-bit gradients' difference.
    EXPECT_TRUE(torch::allclose(quantized[0], exact[0], 5e-2, 0)) << quantized[0] << exact[0];
    EXPECT_TRUE(torch::allclose(quantized[1], exact[1], 0, 3e-2))
        << (quantized[1] - exact[1]).abs().max();
  }, two_nodes());
}

json with_loco(json zero, double beta = 0.8, int reset_t = 1024) {
  zero["zeropp_loco_param"] = {{"err_beta", beta}, {"reset_T", reset_t}};
  return zero;
}

TEST(QuantizedGradientsDist, TrainsCloseToExactZero3WithLoco) {
  run_ranks(kWorld, [](int rank, int) {
    int64_t plain_bytes = 0, loco_bytes = 0;
    const std::vector<at::Tensor> exact = train(rank, zero3(false));
    const std::vector<at::Tensor> plain = train(rank, zero3(true), nullptr, false, &plain_bytes);
    const std::vector<at::Tensor> loco =
        train(rank, with_loco(zero3(true)), nullptr, false, &loco_bytes);
    EXPECT_FALSE(torch::equal(loco[1], plain[1]));  // the errors were used
    EXPECT_TRUE(torch::allclose(loco[0], exact[0], 3e-2, 0)) << loco[0] << exact[0];
    EXPECT_TRUE(torch::allclose(loco[1], exact[1], 0, 3e-2)) << (loco[1] - exact[1]).abs().max();
    // The bucket's errors in 8 bits: inside the node its 2 rows of 642 (1,288 values and a
    // step), across the nodes its 2 rows of 321 node sums (648 values and a step).
    EXPECT_EQ(loco_bytes - plain_bytes, (1288 + 4) + (648 + 4));
  }, two_nodes());
}

// A skipped step drops the errors (the skipped gradients are not finite): bf16 with
// check_grad_overflow and an infinite input at the second step.
TEST(QuantizedGradientsDist, LocoErrorsAreDroppedOnASkippedStep) {
  run_ranks(kWorld, [](int rank, int) {
    json cfg = train_config(with_loco(zero3(true)));
    cfg["bf16"] = {{"enabled", true}, {"check_grad_overflow", true}};
    auto engine = initialize(model(), cfg).engine;
    std::vector<int64_t> bytes;
    for (int s = 0; s < 3; ++s) {
      auto [x, y] = tiny_batch(s * 2 * kWorld + 2 * rank, 2);
      if (s == 1) x[0][0] = std::numeric_limits<float>::infinity();
      at::Tensor loss = (engine->forward(x.to(at::kBFloat16)) - y.to(at::kBFloat16)).pow(2).mean();
      engine->backward(loss);
      engine->step();
      bytes.push_back(engine->memory_stats().comm_buffer_bytes);
    }
    EXPECT_EQ(engine->skipped_steps(), 1);
    EXPECT_EQ(bytes[0] - bytes[1], (1288 + 4) + (648 + 4));
    EXPECT_EQ(bytes[2], bytes[0]);  // kept again from the next reduction on
  }, two_nodes());
}

// The first stage is handed to the bucketing as two collectives in flight (values and steps);
// with overlap_comm it runs while the next bucket fills, and the second stage when the bucket
// completes. Several buckets: the result is the synchronous one's, bit for bit.
TEST(QuantizedGradientsDist, OverlappedFirstStagesTrainAsTheSynchronousOnes) {
  run_ranks(kWorld, [](int rank, int) {
    std::vector<std::vector<at::Tensor>> runs;
    for (bool overlap : {false, true}) {
      json z = with_loco(zero3(true));
      // 3 buckets: the last layer and the middle bias, the middle weight, the first layer.
      z["reduce_bucket_size"] = 400;
      z["overlap_comm"] = overlap;
      auto m = model();
      auto engine = initialize(m, train_config(z)).engine;
      std::vector<double> losses;
      for (int s = 0; s < 3; ++s) {
        auto [x, y] = tiny_batch(s * 2 * kWorld + 2 * rank, 2);
        at::Tensor loss = (engine->forward(x) - y).pow(2).mean();
        engine->backward(loss);
        engine->step();
        losses.push_back(loss.item<double>());
      }
      const runtime::ReductionStats stats = engine->reduction_stats();
      EXPECT_EQ(stats.buckets_launched, 3) << "overlap " << overlap;
      EXPECT_EQ(stats.reductions_issued, 2 * stats.buckets_launched) << "overlap " << overlap;
      comm::configure_comms_logger({});
      zero::GatheredParameters gathered(*m);
      std::vector<at::Tensor> flat;
      for (const auto& p : m->parameters()) flat.push_back(p.detach().reshape({-1}).clone());
      runs.push_back({torch::tensor(losses, torch::kDouble), torch::cat(flat)});
    }
    EXPECT_TRUE(torch::equal(runs[0][0], runs[1][0]));
    EXPECT_TRUE(torch::equal(runs[0][1], runs[1][1]));
  }, two_nodes());
}

TEST(QuantizedGradientsDist, OneNodeReducesExactly) {
  testing::RunOptions o;
  o.env.push_back({"NDEV_PER_NODE", std::to_string(kWorld)});
  run_ranks(kWorld, [](int rank, int) {
    const std::vector<at::Tensor> exact = train(rank, zero3(false));
    const std::vector<at::Tensor> quantized = train(rank, zero3(true));
    EXPECT_TRUE(torch::equal(quantized[0], exact[0]));
    EXPECT_TRUE(torch::equal(quantized[1], exact[1]));
  }, o);
}

void expect_refused(json zero, const std::string& ndev, const std::string& what) {
  testing::RunOptions o;
  o.env.push_back({"NDEV_PER_NODE", ndev});
  o.env.push_back({"DS_TEST_ZERO", zero.dump()});
  o.env.push_back({"DS_TEST_WHAT", what});
  run_ranks(kWorld, [](int, int) {
    const json z = json::parse(std::getenv("DS_TEST_ZERO"));
    try {
      initialize(model(), train_config(z));
      ADD_FAILURE() << "accepted " << z.dump();
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(std::getenv("DS_TEST_WHAT")), std::string::npos)
          << e.what();
    }
  }, o);
}

TEST(QuantizedGradientsDist, NodesThatDoNotDivideTheWorldAreAConfigError) {
  expect_refused(zero3(true), "3", "zero_optimization.zero_quantized_gradients needs whole nodes");
}

TEST(QuantizedGradientsDist, WithoutReduceScatterIsAConfigError) {
  json z = zero3(true);
  z["reduce_scatter"] = false;
  expect_refused(z, "2", "zero_optimization.zero_quantized_gradients needs "
                         "zero_optimization.reduce_scatter");
}

TEST(QuantizedGradientsDist, WithMicsIsRefused) {
  json z = zero3(true);
  z["mics_shard_size"] = 2;
  expect_refused(z, "2", "zero_quantized_gradients together with mics_shard_size");
}

}  // namespace
}  // namespace deepspeed
