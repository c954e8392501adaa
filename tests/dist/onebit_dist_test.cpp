// The compressed all-reduce on 2, 3 and 4 ranks with sizes not divisible by the rank count:
// constant tensors come out exact, the packed-bit exchange matches a single-process model of
// DeepSpeed's worker/server scheme bit for bit, and error feedback keeps the running average
// of repeated all-reduces close to the true average.
#include "deepspeed/onebit.h"

#include <algorithm>

#include "deepspeed/comms_logging.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

const int64_t kSizes[] = {1, 13, 100, 4097};

// The input of rank `rank` at round `round`: distinct across ranks, signs mixed.
torch::Tensor input_of(int rank, int round, int64_t n) {
  torch::manual_seed(1000 * rank + round);
  return torch::randn({n});
}

// Single-process model of the whole exchange, from every rank's input and error buffers.
std::vector<torch::Tensor> reference_round(const std::vector<torch::Tensor>& inputs,
                                           std::vector<torch::Tensor>& worker_errors,
                                           std::vector<torch::Tensor>& server_errors) {
  const int world = static_cast<int>(inputs.size());
  const int64_t n = inputs[0].numel();
  auto l = onebit::compression_layout(n, world);
  std::vector<torch::Tensor> sent(world);
  std::vector<float> scale(world);
  for (int r = 0; r < world; ++r) {
    auto x = torch::zeros({l.padded_numel});
    x.narrow(0, 0, n).copy_(inputs[r]);
    x += worker_errors[r];
    auto real = x.narrow(0, 0, n);
    scale[r] = (real.norm() / std::sqrt(static_cast<double>(n))).item<float>();
    sent[r] = torch::where(x.ge(0), torch::ones_like(x), -torch::ones_like(x));
    worker_errors[r] = x - sent[r] * scale[r];
    worker_errors[r].narrow(0, n, l.padded_numel - n).zero_();
  }
  auto result = torch::zeros({l.padded_numel});
  for (int s = 0; s < world; ++s) {
    auto m = torch::zeros({l.chunk_numel});
    for (int r = 0; r < world; ++r) {
      m += sent[r].narrow(0, s * l.chunk_numel, l.chunk_numel) * (scale[r] / world);
    }
    m += server_errors[s];
    const int64_t valid = l.valid_in_chunk(s);
    float ss = valid ? (m.narrow(0, 0, valid).norm() / std::sqrt(double(valid))).item<float>() : 0;
    auto signs = torch::where(m.ge(0), torch::ones_like(m), -torch::ones_like(m));
    server_errors[s] = m - signs * ss;
    server_errors[s].narrow(0, valid, l.chunk_numel - valid).zero_();
    result.narrow(0, s * l.chunk_numel, l.chunk_numel).copy_(signs * ss);
  }
  return {result.narrow(0, 0, n)};
}

void check_constant_is_exact(int rank, int world) {
  for (int64_t n : kSizes) {
    for (float c : {0.25f, -4.0f}) {
      auto l = onebit::compression_layout(n, world);
      auto we = torch::zeros({l.padded_numel});
      auto se = torch::zeros({l.chunk_numel});
      auto t = torch::full({n}, c);
      onebit::compressed_allreduce(t, we, se, comm::world());
      EXPECT_TRUE(torch::equal(t, torch::full({n}, c))) << "n " << n << " c " << c << " rank " << rank;
      EXPECT_TRUE(torch::equal(we, torch::zeros_like(we)));
      EXPECT_TRUE(torch::equal(se, torch::zeros_like(se)));
    }
  }
}

TEST(CompressedAllreduceDist, ConstantTensorIsExactOnTwoRanks) { run_ranks(2, check_constant_is_exact); }
TEST(CompressedAllreduceDist, ConstantTensorIsExactOnThreeRanks) { run_ranks(3, check_constant_is_exact); }
TEST(CompressedAllreduceDist, ConstantTensorIsExactOnFourRanks) { run_ranks(4, check_constant_is_exact); }

// Three rounds of compressed all-reduce of random tensors on every rank equal the single-process
// model (same signs and scales, so the same bits), errors included.
void check_matches_model(int rank, int world) {
  for (int64_t n : kSizes) {
    auto l = onebit::compression_layout(n, world);
    auto we = torch::zeros({l.padded_numel});
    auto se = torch::zeros({l.chunk_numel});
    std::vector<torch::Tensor> ref_we(world, torch::zeros({l.padded_numel}));
    std::vector<torch::Tensor> ref_se(world, torch::zeros({l.chunk_numel}));
    for (int round = 0; round < 3; ++round) {
      auto t = input_of(rank, round, n);
      onebit::compressed_allreduce(t, we, se, comm::world());
      std::vector<torch::Tensor> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(input_of(r, round, n));
      auto want = reference_round(inputs, ref_we, ref_se)[0];
      EXPECT_TRUE(torch::allclose(t, want, 1e-6, 1e-6))
          << "n " << n << " round " << round << " max diff " << (t - want).abs().max().item<float>();
      EXPECT_TRUE(torch::allclose(we, ref_we[rank], 1e-6, 1e-6)) << "worker error, n " << n;
      EXPECT_TRUE(torch::allclose(se, ref_se[rank], 1e-6, 1e-6)) << "server error, n " << n;
    }
  }
}

TEST(CompressedAllreduceDist, MatchesWorkerServerModelOnTwoRanks) { run_ranks(2, check_matches_model); }
TEST(CompressedAllreduceDist, MatchesWorkerServerModelOnThreeRanks) { run_ranks(3, check_matches_model); }
TEST(CompressedAllreduceDist, MatchesWorkerServerModelOnFourRanks) { run_ranks(4, check_matches_model); }

// Repeated all-reduces of gradient-like tensors (a per-rank direction plus fresh noise): error
// feedback makes the compression unbiased over time. Exactly: the running sum of the true
// averages minus the running sum of the results equals what the error buffers hold now (the
// workers' errors averaged, plus the servers' errors), so nothing is lost; and the errors
// settle at a steady size instead of growing with the rounds.
TEST(CompressedAllreduceDist, ErrorFeedbackLosesNothingAndSettlesOnFourRanks) {
  run_ranks(4, [](int rank, int world) {
    const int64_t n = 999;
    auto l = onebit::compression_layout(n, world);
    auto we = torch::zeros({l.padded_numel});
    auto se = torch::zeros({l.chunk_numel});
    auto direction = 0.3 * input_of(rank, 0, n);
    auto sum_true = torch::zeros({n}, torch::kDouble);
    auto sum_sent = torch::zeros({n}, torch::kDouble);
    const int rounds = 400;
    std::vector<double> error(rounds);
    double max_input = 0;
    for (int k = 0; k < rounds; ++k) {
      auto mine = direction + 0.5 * input_of(rank, k + 1, n);
      max_input = std::max(max_input, mine.abs().max().item<double>());
      auto avg = mine.clone();
      comm::all_reduce(avg, comm::ReduceOp::kAvg);
      auto t = mine.clone();
      onebit::compressed_allreduce(t, we, se, comm::world());
      sum_true += avg.to(torch::kDouble);
      sum_sent += t.to(torch::kDouble);
      error[k] = we.abs().max().item<double>();
    }
    auto held = we.clone();
    comm::all_reduce(held, comm::ReduceOp::kAvg);
    auto servers = torch::empty({l.padded_numel});
    comm::all_gather(servers, se);
    held += servers;
    const double mismatch =
        (sum_true - sum_sent - held.narrow(0, 0, n).to(torch::kDouble)).abs().max().item<double>();
    EXPECT_LT(mismatch, 1e-2) << "error feedback lost or invented mass";
    EXPECT_GT(held.abs().max().item<double>(), 1.0) << "the errors did hold something";
    auto mean = [&](int from, int to) {
      double s = 0;
      for (int i = from; i < to; ++i) s += error[i];
      return s / (to - from);
    };
    // The errors settle within ~200 rounds (at about 10x the inputs for this persistent
    // direction); afterwards they fluctuate by a few percent.
    EXPECT_LT(mean(300, 400), 1.25 * mean(200, 300)) << "the worker errors keep growing";
    EXPECT_LT(*std::max_element(error.begin(), error.end()), 20 * max_input);
  });
}

// The comms logger lists the compressed all-reduce under its own name next to the collectives
// it is made of.
TEST(CompressedAllreduceDist, CommsLoggerShowsItByName) {
  run_ranks(2, [](int, int) {
    CommsLoggerConfig c;
    c.enabled = true;
    comm::configure_comms_logger(c);
    comm::reset_comms_log();
    auto l = onebit::compression_layout(100, 2);
    auto we = torch::zeros({l.padded_numel});
    auto se = torch::zeros({l.chunk_numel});
    auto t = torch::randn({100});
    onebit::compressed_allreduce(t, we, se, comm::world());
    std::vector<std::string> names;
    for (const auto& e : comm::comms_log_entries()) names.push_back(e.record_name);
    for (const char* want : {"compressed_allreduce", "all_to_all_single", "all_gather"}) {
      EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
    }
    EXPECT_NE(comm::comms_log_summary_string().find("compressed_allreduce"), std::string::npos);
  });
}

}  // namespace
}  // namespace deepspeed
