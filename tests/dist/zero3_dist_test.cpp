// ZeRO stage 3 on N Gloo ranks: the same parameters after K steps as one process with stage 0
// (gradient accumulation, clipping, a parameter tied across two units, a unit called twice in
// one forward, a parameter outside units, a frozen one, sizes W does not divide), for the
// variants the zero_optimization keys select and for partitioned construction (zero::Init);
// MiCS (shard groups, their replicas, the hierarchical gather) and ZeRO++'s hpZ (secondary
// partitions; its backward gathers over the secondary group) match one process too;
// bf16 with fp32 masters agrees with stage 2; the parameters gathered at any moment stay
// within the stated bound; each unit fetch and the refresh after the step gather their small
// shards in one collective; zero::Init never allocates the whole model on a rank.
#include "deepspeed/comms_logging.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/zero3.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <set>

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/counting_allocator.h"
#include "support/logged_collectives.h"
#include "support/multi_rank.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

using testing::run_ranks;
using testing::tiny_batch;

constexpr int kSteps = 5;
constexpr int kMicro = 1;
constexpr int kGas = 2;
constexpr double kClip = 0.05;
constexpr int64_t kIn = 4;
constexpr int64_t kHidden = 13;  // no world size here divides 13*13 or 13*4
constexpr int64_t kOut = 2;

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t in, int64_t out) { fc = register_module("fc", torch::nn::Linear(in, out)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
using Block = zero::Unit<BlockImpl>;

// Reuses the embedding's weight (a parameter tied across two units) and holds a frozen bias.
struct HeadImpl : torch::nn::Module {
  explicit HeadImpl(const torch::Tensor& tied) {
    weight = register_parameter("weight", tied);
    frozen_bias = register_parameter("frozen_bias", torch::full({kIn}, 0.1), false);
  }
  torch::Tensor forward(const torch::Tensor& h) { return torch::matmul(h, weight) + frozen_bias; }
  torch::Tensor weight, frozen_bias;
};
using Head = zero::Unit<HeadImpl>;

// Units: embed, head (zero::Unit), shared (a zero::Unit called twice), body.0, body.2 and
// tail.0 (Sequential children). `scale` is registered outside every unit.
struct Z3Net : torch::nn::Module {
  explicit Z3Net(int64_t seed) {
    torch::manual_seed(seed);
    embed = register_module("embed", std::make_shared<Block>(kIn, kHidden));
    body = register_module("body", torch::nn::Sequential(torch::nn::Linear(kHidden, kHidden),
                                                         torch::nn::Tanh(),
                                                         torch::nn::Linear(kHidden, kHidden)));
    shared = register_module("shared", std::make_shared<Block>(kHidden, kHidden));
    head = register_module("head", std::make_shared<Head>(embed->fc->weight));
    tail = register_module("tail", torch::nn::Sequential(torch::nn::Linear(kIn, kOut)));
    scale = register_parameter("scale", torch::linspace(0.8, 1.2, kHidden));
  }
  // A hand-written squared error: LibTorch 1.13 has no bf16 mse_loss on CPU.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = body->forward(embed->forward(x)) * scale;
    h = shared->forward(shared->forward(h));
    return (tail->forward(head->forward(h)) - y).pow(2).mean();
  }
  std::shared_ptr<Block> embed, shared;
  std::shared_ptr<Head> head;
  torch::nn::Sequential body{nullptr}, tail{nullptr};
  torch::Tensor scale;
};

// The model's distinct parameters in registration order (a tied one once).
std::vector<at::Tensor> distinct_params(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  std::set<const void*> seen;
  for (auto& p : m.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

json base_config(int micro, const json& zero, bool bf16 = false) {
  return {{"train_micro_batch_size_per_gpu", micro},
          {"gradient_accumulation_steps", kGas},
          {"gradient_clipping", kClip},
          {"bf16", {{"enabled", bf16}}},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.1}}}}},
          {"zero_optimization", zero}};
}

// Rank r of W trains on its own slice of every global batch. Returns the final parameters
// (gathered, as fp32) and, last, the global gradient norm of every step.
std::vector<at::Tensor> train(int rank, int world, int micro, const json& zero, int64_t seed,
                              bool use_init = false, bool bf16 = false) {
  const json cfg = base_config(micro, zero, bf16);
  std::shared_ptr<Z3Net> model;
  if (use_init) {
    zero::Init init(load_config(cfg));
    model = std::make_shared<Z3Net>(seed);
  } else {
    model = std::make_shared<Z3Net>(seed);
  }
  auto engine = initialize(model, cfg).engine;
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  const int64_t global = static_cast<int64_t>(micro) * kGas * world;
  std::vector<double> norms;
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < kGas; ++m) {
      auto [x, y] = tiny_batch(s * global + (static_cast<int64_t>(rank) * kGas + m) * micro, micro);
      engine->backward(engine->forward(x.to(dtype), y.to(dtype)));
      engine->step();
    }
    norms.push_back(*engine->get_global_grad_norm());
  }
  std::vector<at::Tensor> out;
  {
    zero::GatheredParameters gathered(*model);
    for (auto& p : distinct_params(*model)) out.push_back(p.detach().to(at::kFloat).clone());
  }
  out.push_back(torch::tensor(norms, torch::kDouble));
  return out;
}

std::string out_file(int rank) {
  return testing::rank_output_dir() + "/params" + std::to_string(rank) + ".pt";
}

void expect_match(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    // fp32 on CPU: within 1e-6 relative (the reduction order differs from one process).
    auto tol = want[i].abs() * 1e-6 + 1e-7;
    auto excess = ((got[i] - want[i]).abs() - tol).max().item<double>();
    EXPECT_LE(excess, 0.0) << what << ": tensor " << i << " differs by "
                           << (got[i] - want[i]).abs().max().item<double>();
  }
}

using Env = std::vector<std::pair<std::string, std::string>>;

// Runs `zero` on `world` ranks (with `env` set) and checks every rank against one process with
// stage 0.
void check_against_single_process(int world, const json& zero, bool use_init = false,
                                  const Env& env = {}) {
  testing::RunOptions o;
  o.env = env;
  o.env.push_back({"DS_TEST_ZERO", zero.dump()});
  o.env.push_back({"DS_TEST_INIT", use_init ? "1" : "0"});
  run_ranks(world, [](int rank, int w) {
    json z = json::parse(std::getenv("DS_TEST_ZERO"));
    const bool init = std::string(std::getenv("DS_TEST_INIT")) == "1";
    torch::save(train(rank, w, kMicro, z, 4321 + rank, init), out_file(rank));
  }, o);
  auto reference = train(0, 1, kMicro * world, json{{"stage", 0}}, 4321);
  for (int r = 0; r < world; ++r) {
    std::vector<at::Tensor> got;
    torch::load(got, out_file(r));
    expect_match(got, reference, zero.dump() + " on " + std::to_string(world) + " ranks, rank " +
                                     std::to_string(r));
  }
}

// Everything partitioned, small buckets (several per backward), release right after use,
// prefetch of about one unit ahead.
json stage3() {
  return {{"stage", 3},
          {"reduce_bucket_size", 200},
          {"stage3_param_persistence_threshold", 0},
          {"stage3_max_reuse_distance", 0},
          {"stage3_prefetch_bucket_size", 200}};
}

TEST(Zero3Dist, MatchesSingleProcessOn2Ranks) { check_against_single_process(2, stage3()); }
TEST(Zero3Dist, MatchesSingleProcessOn3Ranks) { check_against_single_process(3, stage3()); }
TEST(Zero3Dist, MatchesSingleProcessOn4Ranks) { check_against_single_process(4, stage3()); }

// The CPU reduces gradients by all-reduce (Gloo has no reduce-scatter); the reduce-scatter path a
// GPU takes (receive buffers) is covered here.
TEST(Zero3Dist, ReduceScatterPathOfAGpuMatches) {
  check_against_single_process(3, stage3(), false, {{"DS_TEST_STAGE3_REDUCE_SCATTER_ON_CPU", "1"}});
}

TEST(Zero3Dist, PartitionedConstructionMatchesSingleProcess) {
  check_against_single_process(3, stage3(), /*use_init=*/true);
}

// Default buckets, prefetch and reuse distance (parameters stay gathered between their
// forward and backward from the second iteration on).
TEST(Zero3Dist, DeepSpeedDefaultsMatch) {
  check_against_single_process(3, json{{"stage", 3}, {"stage3_param_persistence_threshold", 0}});
}

// DeepSpeed's persistence threshold (1e5) keeps every parameter of this small model gathered.
TEST(Zero3Dist, AllPersistentMatches) { check_against_single_process(2, json{{"stage", 3}}); }

TEST(Zero3Dist, AllReduceVariantsAndSubGroupsMatch) {
  json z = stage3();
  z["reduce_scatter"] = false;
  z["overlap_comm"] = false;
  z["contiguous_gradients"] = false;
  z["stage3_use_all_reduce_for_fetch_params"] = true;
  z["stage3_allgather_sequential"] = true;
  z["sub_group_size"] = 50;  // several sub-groups, each stepped on its own
  check_against_single_process(3, z);
}

TEST(Zero3Dist, PersistentSmallParametersMatch) {
  json z = stage3();
  z["stage3_param_persistence_threshold"] = 13;  // biases and `scale` stay gathered
  check_against_single_process(2, z);
}

// MiCS: partitioned over shard groups of 2, the gradients all-reduced across the 2 replicas.
json mics(int64_t shard_size) {
  json z = stage3();
  z["mics_shard_size"] = shard_size;
  return z;
}

TEST(Zero3Dist, MicsShardGroupsOf2On4RanksMatch) { check_against_single_process(4, mics(2)); }

TEST(Zero3Dist, MicsPartitionedConstructionMatches) {
  check_against_single_process(4, mics(2), /*use_init=*/true);
}

// A shard group of one rank (every rank holds everything; the world is the replica group),
// and one of the whole world (plain ZeRO-3).
TEST(Zero3Dist, MicsShardGroupsOfOneRankMatch) { check_against_single_process(2, mics(1)); }
TEST(Zero3Dist, MicsOneShardGroupMatches) { check_against_single_process(2, mics(2)); }

// The hierarchical gather over 2 "nodes" of 2 ranks (NDEV_PER_NODE, DeepSpeed's variable).
TEST(Zero3Dist, MicsHierarchicalGatherMatches) {
  json z = mics(4);
  z["mics_hierarchical_params_gather"] = true;
  check_against_single_process(4, z, false, {{"NDEV_PER_NODE", "2"}});
}

// Persistent parameters (gathered over the shard group after each step) and the all-reduce
// reduction path of a GPU's reduce_scatter false.
TEST(Zero3Dist, MicsWithPersistentParametersAndAllReduceMatches) {
  json z = mics(2);
  z["stage3_param_persistence_threshold"] = 13;
  z["reduce_scatter"] = false;
  z["overlap_comm"] = false;
  check_against_single_process(4, z);
}

// ZeRO++ hpZ: secondary partitions over groups of 2 (and, as DeepSpeed, groups of min(H, W)).
json hpz(int64_t size) {
  json z = stage3();
  z["zero_hpz_partition_size"] = size;
  return z;
}

TEST(Zero3Dist, HpzSecondaryGroupsOf2On4RanksMatch) { check_against_single_process(4, hpz(2)); }
TEST(Zero3Dist, HpzPartitionedConstructionMatches) {
  check_against_single_process(4, hpz(2), /*use_init=*/true);
}
TEST(Zero3Dist, HpzLargerThanTheWorldMatches) { check_against_single_process(2, hpz(8)); }

// Secondary partitions with default prefetch and reuse (parameters stay gathered from forward
// to backward from the second iteration on) and persistent small parameters.
TEST(Zero3Dist, HpzWithDeepSpeedDefaultsMatches) {
  check_against_single_process(
      4, json{{"stage", 3},
              {"stage3_param_persistence_threshold", 13},
              {"zero_hpz_partition_size", 2}});
}

TEST(Zero3Dist, Bf16WithFp32MastersAgreesWithStage2) {
  run_ranks(2, [](int rank, int world) {
    auto p3 = train(rank, world, kMicro, stage3(), 4321, false, /*bf16=*/true);
    auto p2 = train(rank, world, kMicro, json{{"stage", 2}}, 4321, false, /*bf16=*/true);
    ASSERT_EQ(p3.size(), p2.size());
    for (size_t i = 0; i + 1 < p3.size(); ++i) {
      // One bf16 ulp (2^-8 relative) per step can separate stages: the reduction order differs.
      EXPECT_LE((p3[i] - p2[i]).abs().max().item<double>(), 0.05) << "tensor " << i;
    }
  });
}

// ---- Memory ----------------------------------------------------------------------------

constexpr int64_t kWidth = 64;
constexpr int kLayers = 8;

// Bytes of parameter storage allocated right now (gathered parameters), sampled from inside
// the units' forward and backward.
std::vector<int64_t>* g_samples = nullptr;
torch::nn::Module* g_model = nullptr;

void sample_gathered_bytes() {
  if (g_samples == nullptr || g_model == nullptr) return;
  int64_t total = 0;
  std::set<const void*> seen;
  for (auto& p : g_model->parameters()) {
    const void* s = p.storage().unsafeGetStorageImpl();
    if (seen.insert(s).second) total += static_cast<int64_t>(p.storage().nbytes());
  }
  g_samples->push_back(total);
}

struct ProbeBlockImpl : torch::nn::Module {
  ProbeBlockImpl() { fc = register_module("fc", torch::nn::Linear(kWidth, kWidth)); }
  torch::Tensor forward(const torch::Tensor& x) {
    sample_gathered_bytes();
    auto a = fc(x);
    if (a.requires_grad()) a.register_hook([](const torch::Tensor&) { sample_gathered_bytes(); });
    return torch::tanh(a);
  }
  torch::nn::Linear fc{nullptr};
};
using ProbeBlock = zero::Unit<ProbeBlockImpl>;

struct Tower : torch::nn::Module {
  Tower() {
    torch::manual_seed(5);
    for (int i = 0; i < kLayers; ++i) {
      blocks.push_back(register_module("h" + std::to_string(i), std::make_shared<ProbeBlock>()));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b->forward(x);
    return x.pow(2).mean();
  }
  std::vector<std::shared_ptr<ProbeBlock>> blocks;
};

// Peak gathered-parameter bytes over two optimizer steps (two iterations: the second one runs
// with the recorded trace, so prefetch and reuse are active).
int64_t peak_gathered_bytes(const json& zero, MemoryStats* after_step) {
  auto model = std::make_shared<Tower>();
  json cfg = {{"train_batch_size", 4 * comm::get_world_size()},
              {"optimizer", {{"type", "AdamW"}}},
              {"zero_optimization", zero}};
  auto engine = initialize(model, cfg).engine;
  std::vector<int64_t> samples;
  g_samples = &samples;
  g_model = model.get();
  for (int s = 0; s < 2; ++s) {
    samples.clear();  // the first iteration records the trace; measure the second
    engine->backward(engine->forward(torch::randn({4, kWidth})));
    engine->step();
  }
  g_samples = nullptr;
  g_model = nullptr;
  if (after_step) *after_step = engine->memory_stats();
  EXPECT_FALSE(samples.empty());
  return samples.empty() ? 0 : *std::max_element(samples.begin(), samples.end());
}

TEST(Zero3Dist, GatheredParametersStayWithinLiveUnits) {
  run_ranks(4, [](int, int world) {
    const int64_t block = kWidth * kWidth + kWidth;                       // 4160 elements
    const int64_t shard = (kWidth * kWidth + world - 1) / world + (kWidth + world - 1) / world;
    const int64_t block_bytes = 4 * shard * world;                        // gathered, padded
    const int64_t model_bytes = 4 * block * kLayers;
    json z = {{"stage", 3},
              {"stage3_param_persistence_threshold", 0},
              {"stage3_max_reuse_distance", 0},
              {"stage3_prefetch_bucket_size", block}};
    // Without a live cap: the running unit, one unit of prefetch, and at the turn from forward
    // to backward the last unit, kept because backward reuses it at once (distance 0).
    const int64_t uncapped = peak_gathered_bytes(z, nullptr);
    EXPECT_GE(uncapped, 2 * block_bytes);
    EXPECT_LE(uncapped, 3 * block_bytes);
    // stage3_max_live_parameters caps what prefetch may add: the formula is then at most
    // max(running unit + prefetch, max_live) = 2 units gathered at any moment.
    z["stage3_max_live_parameters"] = 2 * block;
    MemoryStats m;
    const int64_t with_prefetch = peak_gathered_bytes(z, &m);
    EXPECT_GE(with_prefetch, block_bytes);
    EXPECT_LE(with_prefetch, 2 * block_bytes);
    // This rank's parameter memory after the step: its shards only, ~1/W of the model.
    EXPECT_EQ(m.param_bytes, 4 * shard * kLayers);
    EXPECT_LE(m.param_bytes, model_bytes / world + 4 * kLayers * 2 * world);
    // Peak per-rank parameter memory: shards + live units, far below the whole model.
    EXPECT_LE(m.param_bytes + with_prefetch, model_bytes / world + 2 * block_bytes + 4 * 64);
    // Adam state and gradients for the shards only.
    EXPECT_EQ(m.optimizer_state_bytes, 8 * shard * kLayers);
    EXPECT_EQ(m.grad_bytes, 4 * shard * kLayers);
    EXPECT_EQ(m.padding_elements, (shard * world - block) * kLayers);

    z["stage3_prefetch_bucket_size"] = 0;  // no prefetch: one unit at a time
    EXPECT_EQ(peak_gathered_bytes(z, nullptr), block_bytes);

    // DeepSpeed's default reuse distance keeps what backward will use again: from the second
    // iteration the whole model is gathered at the end of forward.
    z.erase("stage3_max_reuse_distance");
    EXPECT_GE(peak_gathered_bytes(z, nullptr), kLayers * block_bytes);
  });
}

// ---- Collectives ---------------------------------------------------------------------------

// This rank's all-gather collectives in one training iteration of the Tower, as the comms
// logger records them under `record` (the world's by default): message size (one rank's share,
// bytes) -> count.
std::map<int64_t, int64_t> all_gathers_of_one_iteration(json zero,
                                                        const std::string& record = "all_gather") {
  auto model = std::make_shared<Tower>();
  json cfg = {{"train_batch_size", 4 * comm::get_world_size()},
              {"optimizer", {{"type", "AdamW"}}},
              {"comms_logger", {{"enabled", true}}},
              {"zero_optimization", std::move(zero)}};
  auto engine = initialize(model, cfg).engine;
  comm::reset_comms_log();  // from here: the first iteration and the refresh after its step
  engine->backward(engine->forward(torch::randn({4, kWidth})));
  engine->step();
  std::map<int64_t, int64_t> out = testing::logged_message_sizes(record);
  comm::configure_comms_logger({});
  return out;
}

// Note [Coalesced gathers]: a unit's weight and bias travel in one all-gather, and the
// persistent parameters refreshed after the step in one more.
TEST(Zero3Dist, EachFetchGathersItsSmallShardsInOneCollective) {
  run_ranks(2, [](int, int world) {
    const int64_t weight_shard = kWidth * kWidth / world, bias_shard = kWidth / world;
    // No prefetch: the first iteration fetches each unit for forward and again for backward.
    json z = {{"stage", 3},
              {"stage3_param_persistence_threshold", 0},
              {"stage3_max_reuse_distance", 0},
              {"stage3_prefetch_bucket_size", 0}};
    const std::map<int64_t, int64_t> per_fetch{{4 * (weight_shard + bias_shard), 2 * kLayers}};
    EXPECT_EQ(all_gathers_of_one_iteration(z), per_fetch);
    // Biases persistent: each fetch gathers its weight alone, and the refresh after the step
    // gathers the 8 biases at once.
    z["stage3_param_persistence_threshold"] = kWidth;
    const std::map<int64_t, int64_t> split{{4 * weight_shard, 2 * kLayers},
                                           {4 * bias_shard * kLayers, 1}};
    EXPECT_EQ(all_gathers_of_one_iteration(z), split);
  });
}

// ZeRO++ hpZ (Note [Secondary partition]): on 4 ranks with zero_hpz_partition_size 2 the
// forward gathers each unit's quarter-shards from all 4 ranks; the backward gathers the halves
// the 2 ranks of a secondary group kept. Without it both gather quarters.
TEST(Zero3Dist, HpzGathersTheBackwardFromTheSecondaryGroup) {
  run_ranks(4, [](int, int) {
    json z = {{"stage", 3},
              {"stage3_param_persistence_threshold", 0},
              {"stage3_max_reuse_distance", 0},
              {"stage3_prefetch_bucket_size", 0}};
    const int64_t unit = kWidth * kWidth + kWidth;  // weight and bias, both divisible by 4
    const std::map<int64_t, int64_t> plain{{4 * unit / 4, 2 * kLayers}};
    EXPECT_EQ(all_gathers_of_one_iteration(z), plain);
    z["zero_hpz_partition_size"] = 2;
    const std::map<int64_t, int64_t> forward{{4 * unit / 4, kLayers}};
    EXPECT_EQ(all_gathers_of_one_iteration(z), forward);
    const std::map<int64_t, int64_t> backward{{4 * unit / 2, kLayers}};
    EXPECT_EQ(all_gathers_of_one_iteration(z, "all_gather (group zero_hpz)"), backward);
  });
}

using testing::CountingAllocator;

constexpr int64_t kBigWidth = 256;

struct WideBlockImpl : torch::nn::Module {
  WideBlockImpl() { fc = register_module("fc", torch::nn::Linear(kBigWidth, kBigWidth)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};

struct WideTower : torch::nn::Module {
  WideTower() {
    torch::manual_seed(9);
    for (int i = 0; i < kLayers; ++i) {
      blocks.push_back(register_module("h" + std::to_string(i),
                                       std::make_shared<zero::Unit<WideBlockImpl>>()));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& b : blocks) x = b->forward(x);
    return x.pow(2).mean();
  }
  std::vector<std::shared_ptr<zero::Unit<WideBlockImpl>>> blocks;
};

TEST(Zero3Dist, PartitionedConstructionNeverHoldsTheWholeModel) {
  run_ranks(4, [](int, int world) {
    const int64_t unit_bytes = 4 * (kBigWidth * kBigWidth + kBigWidth);  // 263 KB
    const int64_t model_bytes = unit_bytes * kLayers;                     // 2.1 MB
    const int64_t unit_numel = kBigWidth * kBigWidth + kBigWidth;
    json cfg = {{"train_batch_size", 2 * world},
                {"optimizer", {{"type", "AdamW"}}},
                {"zero_optimization",
                 {{"stage", 3},
                  {"stage3_param_persistence_threshold", 0},
                  {"reduce_bucket_size", unit_numel}}}};
    const DeepSpeedConfig config = load_config(cfg);
    c10::Allocator* previous = c10::GetCPUAllocator();
    // Leaked: tensors it allocated may be freed by statics after this body returns.
    auto& counting = *new CountingAllocator(previous);
    c10::SetCPUAllocator(&counting, /*priority=*/100);

    std::shared_ptr<WideTower> model;
    int64_t init_peak = 0;
    {
      counting.reset_peak();
      const int64_t before = counting.live();
      zero::Init init(config);
      model = std::make_shared<WideTower>();
      init_peak = counting.peak() - before;
      EXPECT_EQ(init.partitioned_numel(), model_bytes / 4);
      // Held after construction: this rank's shards. Plus at most 1 KiB of the collective
      // check's fingerprint tensors (docs/comm.md), which Gloo's worker thread may still hold
      // for a moment after the collective's wait() returned.
      constexpr int64_t kInFlightBytes = 1024;
      EXPECT_LE(counting.live() - before,
                model_bytes / world + 4 * kLayers * 2 * world + kInFlightBytes);
    }
    // Bound: the shards of the units built so far plus the unit being built (and its
    // initialisation temporaries, at most one more unit).
    EXPECT_LE(init_peak, model_bytes / world + 2 * unit_bytes);
    EXPECT_LT(init_peak, model_bytes / 2);

    // The engine adopts the shards without gathering the whole model either: it adds the fp32
    // master and gradient shards (model / W each) and two reduction buffers of one unit
    // (overlap_comm) with their reduce-scatter outputs.
    counting.reset_peak();
    const int64_t before_engine = counting.live();
    auto engine = initialize(model, cfg).engine;
    const int64_t engine_peak = counting.peak() - before_engine;
    EXPECT_LE(engine_peak, 2 * model_bytes / world + 2 * unit_bytes + 2 * unit_bytes / world +
                               unit_bytes / world);
    EXPECT_LT(engine_peak, model_bytes);
    engine->backward(engine->forward(torch::randn({2, kBigWidth})));
    engine->step();

    // Control: the same model built without zero::Init holds all of it at once.
    counting.reset_peak();
    const int64_t before_plain = counting.live();
    auto plain = std::make_shared<WideTower>();
    // (less a few bytes: other small tensors may be freed meanwhile, lowering the baseline)
    EXPECT_GE(counting.peak() - before_plain, model_bytes - 4096);
    plain.reset();
    engine.reset();
    c10::SetCPUAllocator(previous, /*priority=*/100);
  });
}

TEST(Zero3Dist, InitRefusesOtherStages) {
  run_ranks(2, [](int, int) {
    json cfg = {{"train_batch_size", 2}, {"zero_optimization", {{"stage", 2}}}};
    try {
      zero::Init init(load_config(cfg));
      ADD_FAILURE() << "expected a ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("zero_optimization.stage"), std::string::npos);
    }
  });
}

}  // namespace
}  // namespace deepspeed
