// DeepSpeed-Ulysses sequence parallelism on Gloo ranks. The exchange (seq_all_to_all) moves
// exactly the slices it should, forward and backward, in both of DeepSpeed's layouts;
// DistributedAttention over sequence chunks equals causal attention over the whole sequence,
// outputs and input gradients; and an engine with sequence_parallel_size 2 (on 2 ranks, and
// with 2 data-parallel replicas on 4) trains a small attention model to the parameters one
// process reaches on the whole sequences, under ZeRO 0-3: gradients summed over the sequence
// ranks and averaged over the data-parallel ones, as DeepSpeed reduces them.
#include "deepspeed/deepspeed.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/causal_attention.h"
#include "deepspeed/sequence.h"
#include "deepspeed/zero3.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

constexpr int64_t kVocab = 13, kSeq = 8, kEmbd = 8, kHeads = 4, kBatch = 2;
constexpr int kSteps = 3, kGas = 2;
constexpr double kLr = 0.2, kClip = 0.5;

// The whole tensor every rank can build, and this rank's slice of `dim`.
at::Tensor full_tensor(std::vector<int64_t> shape, int64_t seed) {
  torch::manual_seed(static_cast<uint64_t>(seed));
  return torch::randn(shape);
}
at::Tensor slice(const at::Tensor& t, int64_t dim, int rank, int parts) {
  const int64_t n = t.size(dim) / parts;
  return t.narrow(dim, rank * n, n);
}

TEST(SequenceParallelDist, AllToAllTradesTheSequenceSplitForAHeadSplitAndBack) {
  for (int world : {2, 4}) {
    run_ranks(world, [](int rank, int world) {
      const comm::Group group = comm::world();
      // Megatron's [s, b, h, d] (scatter 2, gather 0) and [b, s, h, d] (scatter 2, gather 1).
      for (int64_t seq_dim : {0, 1}) {
        SCOPED_TRACE("sequence dimension " + std::to_string(seq_dim));
        std::vector<int64_t> shape = seq_dim == 0 ? std::vector<int64_t>{8, 3, 4, 5}
                                                  : std::vector<int64_t>{3, 8, 4, 5};
        const at::Tensor full = full_tensor(shape, 1);
        const at::Tensor upstream = full_tensor(shape, 2);
        at::Tensor x = slice(full, seq_dim, rank, world).clone().requires_grad_(true);
        at::Tensor y = sequence::seq_all_to_all(x, group, 2, seq_dim);
        EXPECT_TRUE(torch::equal(y, slice(full, 2, rank, world)));
        // Backward: the upstream gradient of this rank's heads returns to the sequence owners.
        (y * slice(upstream, 2, rank, world)).sum().backward();
        EXPECT_TRUE(torch::equal(x.grad(), slice(upstream, seq_dim, rank, world)));
        EXPECT_TRUE(torch::equal(sequence::seq_all_to_all(y, group, seq_dim, 2), x));
      }
      // Heads that the group does not divide: a UsageError naming the group.
      at::Tensor odd = torch::zeros({2, 3, 3, 2});
      try {
        sequence::seq_all_to_all(odd, group, 2, 1);
        ADD_FAILURE() << "expected a UsageError";
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("not divisible by the sequence-parallel size"),
                  std::string::npos)
            << e.what();
      }
    });
  }
}

// [B, S, h, D] -> causal attention over S -> [B, S, h, D].
at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return nn::causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, false)
      .transpose(1, 2)
      .contiguous();
}

TEST(SequenceParallelDist, DistributedAttentionEqualsAttentionOverTheWholeSequence) {
  run_ranks(2, [](int rank, int world) {
    const std::vector<int64_t> shape{2, kSeq, kHeads, 3};
    std::vector<at::Tensor> full, full_leaf, local;
    for (int i = 0; i < 3; ++i) {
      full.push_back(full_tensor(shape, 10 + i));
      full_leaf.push_back(full.back().clone().requires_grad_(true));
      local.push_back(slice(full.back(), 1, rank, world).clone().requires_grad_(true));
    }
    const at::Tensor upstream = full_tensor(shape, 20);
    at::Tensor want = local_attention(full_leaf[0], full_leaf[1], full_leaf[2]);
    (want * upstream).sum().backward();

    sequence::DistributedAttention attention(local_attention, comm::world(), 2, 1);
    at::Tensor got = attention(local[0], local[1], local[2]);
    (got * slice(upstream, 1, rank, world)).sum().backward();
    EXPECT_TRUE(torch::allclose(got, slice(want, 1, rank, world), 1e-5, 1e-6));
    // Each rank's q, k, v gradient holds every rank's attention to its positions.
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(torch::allclose(local[i].grad(), slice(full_leaf[i].grad(), 1, rank, world),
                                  1e-5, 1e-6))
          << "input " << i;
    }
  });
}

// Causal self-attention through DistributedAttention, with a residual.
struct AttnImpl : torch::nn::Module {
  AttnImpl() {
    qkv = register_module("qkv", torch::nn::Linear(kEmbd, 3 * kEmbd));
    proj = register_module("proj", torch::nn::Linear(kEmbd, kEmbd));
  }
  // x: [B, S/P, C] -> [B, S/P, C]
  torch::Tensor forward(const torch::Tensor& x, const comm::Group& sp) {
    const int64_t b = x.size(0), s = x.size(1);
    auto parts = qkv(x).view({b, s, 3, kHeads, kEmbd / kHeads}).unbind(2);
    sequence::DistributedAttention attention(local_attention, sp, 2, 1);
    return x + proj(attention(parts[0], parts[1], parts[2]).reshape({b, s, kEmbd}));
  }
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};

// Token and position embeddings, one attention block (a ZeRO-3 unit), a head; its loss is the
// mean cross-entropy of the whole sequence on every sequence rank.
struct SpNet : torch::nn::Module {
  explicit SpNet(uint64_t seed = 7) {
    torch::manual_seed(seed);
    wte = register_module("wte", torch::nn::Embedding(kVocab, kEmbd));
    wpe = register_module("wpe", torch::nn::Embedding(kSeq, kEmbd));
    attn = register_module("attn", std::make_shared<zero::Unit<AttnImpl>>());
    head = register_module("head", torch::nn::Linear(kEmbd, kVocab));
  }
  // idx, targets: [B, S/P], this rank's chunk of each sequence.
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets) {
    const int64_t s = idx.size(1), first = sp.rank() * s;
    torch::Tensor h = wte(idx) + wpe(torch::arange(first, first + s, torch::kLong));
    torch::Tensor logits = head(attn->forward(h, sp));
    return sequence::vocab_sequence_parallel_cross_entropy(logits.transpose(0, 1),
                                                           targets.transpose(0, 1), sp)
        .mean();
  }
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::shared_ptr<zero::Unit<AttnImpl>> attn;
  torch::nn::Linear head{nullptr};
  comm::Group sp = comm::self_group("sequence");  // the engine's, once there is one
};

// The whole sequences of one micro-batch of data-parallel replica `replica`.
std::pair<at::Tensor, at::Tensor> sample(int step, int micro, int replica) {
  torch::manual_seed(static_cast<uint64_t>(1000 + step * 100 + micro * 10 + replica));
  return {torch::randint(kVocab, {kBatch, kSeq}, torch::kLong),
          torch::randint(kVocab, {kBatch, kSeq}, torch::kLong)};
}

std::map<std::string, at::Tensor> params_of(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// One process on the whole sequences: plain LibTorch SGD, clipping, accumulation over the
// micro-batches and the replicas' samples averaged.
std::map<std::string, at::Tensor> reference(int replicas) {
  SpNet model;
  torch::optim::SGD sgd(model.parameters(), torch::optim::SGDOptions(kLr).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    for (int micro = 0; micro < kGas; ++micro) {
      for (int r = 0; r < replicas; ++r) {
        auto [idx, targets] = sample(step, micro, r);
        (model.forward(idx, targets) / (kGas * replicas)).backward();
      }
    }
    torch::nn::utils::clip_grad_norm_(model.parameters(), kClip);
    sgd.step();
  }
  return params_of(model);
}

json sp_config(int stage, int sp_size, bool muon = false) {
  json c = {{"train_micro_batch_size_per_gpu", kBatch},
            {"gradient_accumulation_steps", kGas},
            {"gradient_clipping", kClip},
            {"sequence_parallel_size", sp_size},
            {"zero_allow_untested_optimizer", true},
            {"optimizer", {{"type", "SGD"}, {"params", {{"lr", kLr}, {"momentum", 0.9}}}}},
            {"zero_optimization", {{"stage", stage}}}};
  if (muon) {
    // The key part of qkv's bias gets no gradient but rounding noise (softmax ignores a shift
    // common to all keys), which Adam's default eps of 1e-10 would blow up to +-lr: a larger one.
    c["optimizer"] = {{"type", "Muon"},
                      {"params", {{"lr", 0.02}, {"adam_lr", 0.01}, {"momentum", 0.9},
                                  {"eps", 1e-3}}}};
  }
  return c;
}

// Optimizer steps [from, to) of the engine's training, each rank on its chunk of its replica's
// samples.
template <typename EnginePtr>
void train_steps(const EnginePtr& engine, SpNet& model, int from, int to) {
  model.sp = engine->sequence_parallel_group();
  const auto& sp = engine->sequence_parallel_group();
  for (int step = from; step < to; ++step) {
    for (int micro = 0; micro < kGas; ++micro) {
      auto [idx, targets] = sample(step, micro, engine->dp_rank());
      engine->backward(engine->forward(sequence::shard_sequence(idx, sp, 1),
                                       sequence::shard_sequence(targets, sp, 1)));
      engine->step();
    }
  }
}

// kSteps steps; with `checkpoint_dir`, the last one by a new engine (on a model initialized
// otherwise) resumed from a checkpoint saved before it.
std::map<std::string, at::Tensor> train(int stage, int sp_size,
                                        const std::string& checkpoint_dir = "", bool muon = false) {
  auto model = std::make_shared<SpNet>();
  auto [engine, opt, sched] = initialize(model, sp_config(stage, sp_size, muon));
  EXPECT_EQ(engine->sequence_parallel_size(), sp_size);
  EXPECT_EQ(engine->train_batch_size(),
            kBatch * kGas * comm::get_world_size() / sp_size);  // world / sp replicas
  if (checkpoint_dir.empty()) {
    train_steps(engine, *model, 0, kSteps);
    zero::GatheredParameters gathered(*model);
    return params_of(*model);
  }
  train_steps(engine, *model, 0, kSteps - 1);
  engine->save_checkpoint(checkpoint_dir, "resume");
  auto resumed_model = std::make_shared<SpNet>(/*seed=*/99);
  auto resumed = initialize(resumed_model, sp_config(stage, sp_size)).engine;
  resumed->load_checkpoint(checkpoint_dir, "resume");
  train_steps(resumed, *resumed_model, kSteps - 1, kSteps);
  zero::GatheredParameters gathered(*resumed_model);
  return params_of(*resumed_model);
}

void expect_close(const std::map<std::string, at::Tensor>& got,
                  const std::map<std::string, at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    const at::Tensor& g = got.at(name);
    EXPECT_TRUE(torch::allclose(g, w, 1e-4, 1e-6))
        << name << ": max difference " << (g - w).abs().max().item<double>();
  }
}

TEST(SequenceParallelDist, TwoSequenceRanksTrainAsOneProcessOnTheWholeSequence) {
  run_ranks(2, [](int rank, int) {
    const auto want = reference(1);
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      expect_close(train(stage, 2), want);
    }
    (void)rank;
  });
}

TEST(SequenceParallelDist, TwoReplicasOfTwoSequenceRanksTrainAsOneProcessOnBothSamples) {
  run_ranks(4, [](int rank, int) {
    const auto want = reference(2);
    for (int stage : {1, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      expect_close(train(stage, 2), want);
    }
    (void)rank;
  });
}

// Muon: each sequence rank holds the matrices whole; the ZeRO partitions over every rank are
// orthogonalized from the reduced gradients as without sequence parallelism. The reference is
// one process on the whole sequences, at the same ZeRO stage (its clipping order).
TEST(SequenceParallelDist, MuonTrainsAsOneProcessOnTheWholeSequence) {
  const std::string dir = testing::new_shared_run_dir("DS_TEST_SEQUENCE_PARALLEL_DIR");
  const auto file = [](int stage) {
    return std::string(std::getenv("DS_TEST_SEQUENCE_PARALLEL_DIR")) + "/muon" +
           std::to_string(stage) + ".pt";
  };
  auto values = [](const std::map<std::string, at::Tensor>& ps) {
    std::vector<at::Tensor> out;
    for (const auto& [name, t] : ps) out.push_back(t);
    return out;
  };
  run_ranks(1, [&](int, int) {
    for (int stage : {1, 3}) torch::save(values(train(stage, 1, "", true)), file(stage));
  });
  run_ranks(2, [&](int, int) {
    for (int stage : {1, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      std::vector<at::Tensor> want;
      torch::load(want, file(stage));
      const auto got = values(train(stage, 2, "", true));
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-4, 1e-6))
            << "parameter " << i << ": max difference "
            << (got[i] - want[i]).abs().max().item<double>();
      }
    }
  });
  (void)dir;
}

TEST(SequenceParallelDist, CheckpointsResumeExactly) {
  testing::new_shared_run_dir("DS_TEST_SEQUENCE_PARALLEL_DIR");
  run_ranks(2, [](int rank, int) {
    const std::string dir = testing::new_shared_run_dir("DS_TEST_SEQUENCE_PARALLEL_DIR");
    for (int stage : {1, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      const auto straight = train(stage, 2);
      const auto resumed = train(stage, 2, dir + "/stage" + std::to_string(stage));
      ASSERT_EQ(straight.size(), resumed.size());
      for (const auto& [name, w] : straight) {
        EXPECT_TRUE(torch::equal(resumed.at(name), w)) << name;
      }
    }
    (void)rank;
  });
}

TEST(SequenceParallelDist, GroupsAreConsecutiveRanksAndBadSizesAreRefusedByName) {
  run_ranks(4, [](int rank, int) {
    auto model = std::make_shared<SpNet>();
    json cfg = {{"train_micro_batch_size_per_gpu", 1},
                {"sequence_parallel_size", 2},
                {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-3}}}}}};
    auto [engine, opt, sched] = initialize(model, cfg);
    // DeepSpeed-Ulysses' layout: {0,1} and {2,3} share sequences; {0,2} and {1,3} are replicas.
    EXPECT_EQ(engine->sequence_parallel_group().ranks(),
              (std::vector<int>{rank / 2 * 2, rank / 2 * 2 + 1}));
    EXPECT_EQ(engine->data_parallel_group().ranks(), (std::vector<int>{rank % 2, rank % 2 + 2}));
    EXPECT_EQ(engine->seq_data_parallel_group().size(), 4);
    EXPECT_EQ(engine->train_batch_size(), 2);
    for (const auto& [extra, words] :
         {std::pair{json{{"sequence_parallel_size", 3}}, "does not divide the world size (4)"},
          std::pair{json{{"sequence_parallel_size", 2}, {"data_parallel_size", 1}},
                    "data_parallel_size (1) times sequence_parallel_size (2)"},
          // 2 replicas: 3 is no multiple of micro 1 x 2.
          std::pair{json{{"sequence_parallel_size", 2}, {"train_batch_size", 3}},
                    "train_batch_size"}}) {
      json c = {{"train_micro_batch_size_per_gpu", 1},
                {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-3}}}}}};
      c.update(extra);
      try {
        initialize(std::make_shared<SpNet>(), c);
        ADD_FAILURE() << "expected a ConfigError for " << extra.dump();
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    }
  });
}

}  // namespace
}  // namespace deepspeed
