// Universal checkpoints on the example GPT under AutoTP: a TP=2 checkpoint (ZeRO-1, AdamW)
// converted by ds_to_universal and loaded with checkpoint.load_universal on TP=1 (one process),
// TP=4 (4 ranks, ZeRO-2), TP=2 x DP=2 (4 ranks, ZeRO-0) and ZeRO-3 on 2 ranks continues with the
// losses of the uninterrupted TP=2 run (1e-5 relative). A ZeRO-3 checkpoint (2 ranks, several
// sub-groups, a frozen parameter) converts and continues on ZeRO-3 with 3 ranks (padded
// shards) and 1 rank, and on TP=2 with ZeRO-1. The universal layout (one folder per parameter,
// full tensors, cat_dim), the slicing rules (stride-3 q|k|v, vocabulary padding) and the errors
// for bad input.
#include "deepspeed/deepspeed.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/tensor_parallel.h"
#include "deepspeed/universal_checkpoint.h"
#include "gpt_model.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

namespace ckpt = checkpoint;
namespace tp = tensor_parallel;
using examples::GptConfig;
using examples::GptImpl;
using testing::run_ranks;

constexpr int64_t kGlobalBatch = 6;  // 1, 2 or 3 data-parallel ranks
constexpr int64_t kMicro = 1;
constexpr int64_t kSeq = 8;

GptConfig tiny_gpt() {
  GptConfig c;
  c.vocab_size = 37;
  c.block_size = kSeq;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  return c;
}

json config(int stage, int autotp, bool universal) {
  json c = {{"train_batch_size", kGlobalBatch},
            {"train_micro_batch_size_per_gpu", kMicro},
            {"gradient_clipping", 0.5},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}},
            {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 500}}}};
  // ZeRO-3: several sub-groups, every parameter partitioned.
  if (stage == 3) {
    c["zero_optimization"]["sub_group_size"] = 1000;
    c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  }
  if (autotp > 1) c["tensor_parallel"] = {{"autotp_size", autotp}};
  if (universal) c["checkpoint"] = {{"load_universal", true}};
  return c;
}

std::pair<at::Tensor, at::Tensor> sequences(int64_t first, int64_t count) {
  std::vector<at::Tensor> xs, ys;
  for (int64_t i = first; i < first + count; ++i) {
    auto pos = torch::arange(kSeq + 1, torch::kLong);
    auto stream = (pos * (i % 5 + 2) + i * 3 + (pos * pos) % 7) % 37;
    xs.push_back(stream.narrow(0, 0, kSeq));
    ys.push_back(stream.narrow(0, 1, kSeq));
  }
  return {torch::stack(xs), torch::stack(ys)};
}

// Steps [first, first + steps) of the stream on data-parallel rank `dp_rank`; the global loss
// of each step.
std::vector<double> train(const std::shared_ptr<ModuleEngine<GptImpl>>& engine, int first,
                          int steps) {
  const int dp = engine->dp_world_size();
  const int dp_rank = engine->data_parallel_group().rank();
  const int64_t gas = kGlobalBatch / (kMicro * dp);
  std::vector<double> losses;
  for (int s = first; s < first + steps; ++s) {
    double sum = 0.0;
    for (int64_t m = 0; m < gas; ++m) {
      auto [x, y] = sequences(s * kGlobalBatch + (dp_rank * gas + m) * kMicro, kMicro);
      auto loss = engine->forward(x, y);
      sum += loss.item<double>();
      engine->backward(loss);
      engine->step();
    }
    at::Tensor mean = torch::tensor({sum / gas}, torch::kDouble);
    if (dp > 1) comm::all_reduce(mean, comm::ReduceOp::kAvg, false, engine->data_parallel_group());
    losses.push_back(mean.item<double>());
  }
  return losses;
}

void save_losses(const std::string& dir, const std::vector<double>& losses) {
  torch::save(torch::tensor(losses, torch::kDouble), dir + "/losses.pt");
}
at::Tensor load_losses(const std::string& dir) {
  at::Tensor t;
  torch::load(t, dir + "/losses.pt");
  return t;
}

// The example GPT; `freeze`: its position embedding is frozen (a parameter without optimizer
// state, which ZeRO-3 keeps as frozen_param_fragments).
std::shared_ptr<GptImpl> make_model(bool freeze) {
  auto model = std::make_shared<GptImpl>(tiny_gpt());
  if (freeze) model->named_parameters()["wpe.weight"].set_requires_grad(false);
  return model;
}

using Env = std::vector<std::pair<std::string, std::string>>;

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

// The usual two param groups (weight decay for matrices, none for biases and norms): they
// interleave in module order, so the optimizer's order is not the module's.
std::vector<ParamGroup> decay_groups(const std::shared_ptr<GptImpl>& model) {
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : model->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    (p.value().dim() >= 2 ? decay : no_decay).push_back(p.value());
  }
  return {ParamGroup(decay), ParamGroup(no_decay, {{"weight_decay", 0.0}})};
}

// The engine of config(stage, autotp, universal) in the variant the environment names:
// DS_TEST_BF16 (bf16 training), DS_TEST_GROUPS (decay_groups).
std::shared_ptr<ModuleEngine<GptImpl>> make_engine(const std::shared_ptr<GptImpl>& model,
                                                   int stage, int autotp, bool universal) {
  json c = config(stage, autotp, universal);
  if (env_flag("DS_TEST_BF16")) c["bf16"] = {{"enabled", true}};
  if (!env_flag("DS_TEST_GROUPS")) return initialize(model, c).engine;
  return initialize(model, c, decay_groups(model)).engine;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Trains TP=2 (ZeRO-1) 2 steps, saves "step2", trains 2 more: the checkpoint and the losses
// of steps 3-4. Returns the output directory.
std::string tp2_checkpoint() {
  run_ranks(2, [](int rank, int) {
    torch::manual_seed(42);
    auto model = std::make_shared<GptImpl>(tiny_gpt());
    auto engine = initialize(model, config(1, 2, false)).engine;
    train(engine, 0, 2);
    engine->save_checkpoint(testing::rank_output_dir() + "/ckpt", std::string("step2"));
    const auto losses = train(engine, 2, 2);
    if (rank == 0) save_losses(testing::rank_output_dir(), losses);
  });
  return testing::rank_output_dir();
}

// ZeRO `stage` on 2 ranks (with a frozen parameter unless `freeze` is false; `variant`: the
// make_engine flags): trains 2 steps, saves "step2", trains 2 more.
std::string frozen_checkpoint(int stage, const Env& variant = {}, bool freeze = true) {
  testing::RunOptions o;
  o.env = {{"DS_TEST_STAGE", std::to_string(stage)}, {"DS_TEST_FREEZE", freeze ? "1" : "0"}};
  o.env.insert(o.env.end(), variant.begin(), variant.end());
  run_ranks(2, [](int rank, int) {
    torch::manual_seed(42);
    auto engine = make_engine(make_model(env_flag("DS_TEST_FREEZE")),
                              std::stoi(std::getenv("DS_TEST_STAGE")), 1, false);
    train(engine, 0, 2);
    engine->save_checkpoint(testing::rank_output_dir() + "/ckpt", std::string("step2"));
    const auto losses = train(engine, 2, 2);
    if (rank == 0) save_losses(testing::rank_output_dir(), losses);
  }, o);
  return testing::rank_output_dir();
}

// Loads the universal checkpoint in `dir` (tag from latest_universal) on `world` ranks with
// AutoTP `autotp` and ZeRO `stage`, trains steps 3-4, and compares the losses with `want`.
// `universal` false: a plain load of tag step2 (the direct reshape, beyond DeepSpeed).
// `freeze`: the model has the frozen position embedding of zero3_checkpoint().
// `variant`: the make_engine flags; `rtol`: the losses' relative tolerance.
void resume_universal(const std::string& ckpt_dir, const std::string& want_dir, int world,
                      int autotp, int stage, bool universal = true, bool freeze = false,
                      const Env& variant = {}, double rtol = 1e-5) {
  testing::RunOptions o;
  o.timeout_s = 120;
  o.env = {{"DS_TEST_CKPT", ckpt_dir}, {"DS_TEST_TP", std::to_string(autotp)},
           {"DS_TEST_STAGE", std::to_string(stage)},
           {"DS_TEST_UNIVERSAL", universal ? "1" : "0"}, {"DS_TEST_FREEZE", freeze ? "1" : "0"}};
  o.env.insert(o.env.end(), variant.begin(), variant.end());
  run_ranks(world, [](int rank, int) {
    torch::manual_seed(7);  // another initialization: everything comes from the checkpoint
    auto model = make_model(env_flag("DS_TEST_FREEZE"));
    const bool u = env_flag("DS_TEST_UNIVERSAL");
    auto engine = make_engine(model, std::stoi(std::getenv("DS_TEST_STAGE")),
                              std::stoi(std::getenv("DS_TEST_TP")), u);
    auto loaded = u ? engine->load_checkpoint(std::getenv("DS_TEST_CKPT"))
                    : engine->load_checkpoint(std::getenv("DS_TEST_CKPT"), std::string("step2"));
    ASSERT_TRUE(loaded.load_path.has_value());
    EXPECT_EQ(engine->global_steps(), 2);
    const auto losses = train(engine, 2, 2);
    if (rank == 0) save_losses(testing::rank_output_dir(), losses);
  }, o);
  if (testing::in_rank_process()) return;
  const at::Tensor got = load_losses(testing::rank_output_dir());
  const at::Tensor want = load_losses(want_dir);
  EXPECT_TRUE(torch::allclose(got, want, rtol, 0.0))
      << "TP=" << autotp << " on " << world << " ranks, ZeRO-" << stage << ": got " << got
      << " want " << want;
}

TEST(UniversalCheckpointDist, Tp2ToUniversalResumesOnTp1Tp4AndTp2xDp2) {
  const std::string first = tp2_checkpoint();
  const std::string ckpt_dir = first + "/ckpt";
  if (!testing::in_rank_process()) {
    const std::string ms_path = ckpt_dir + "/step2/mp_rank_01_model_states.pt";
    const auto ms = ckpt::ModelStates::from_ivalue(ckpt::load(ms_path), ms_path);
    EXPECT_EQ(ms.checkpoint_parallel_dimensions.tp_degree, 2);  // DeepSpeed's record
    EXPECT_EQ(ms.checkpoint_parallel_dimensions.pp_degree, 1);
    const auto r = ckpt::ds_to_universal(ckpt_dir + "/step2", ckpt_dir + "/step2_universal");
    EXPECT_EQ(r.tp_degree, 2);
    // Layout: one folder per parameter with full tensors, DeepSpeed's names.
    const std::string zero = ckpt_dir + "/step2_universal/zero/";
    for (const char* f : {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt", "step.pt"}) {
      EXPECT_TRUE(exists(zero + "h.0.attn.c_attn.weight/" + f)) << f;
    }
    EXPECT_TRUE(exists(zero + "optimizer_state.pt"));
    EXPECT_TRUE(exists(ckpt_dir + "/step2_universal/mp_rank_00_model_states.pt"));
    EXPECT_TRUE(exists(ckpt_dir + "/step2_universal/mp_rank_01_model_states.pt"));
    EXPECT_EQ(ckpt::read_latest_universal(ckpt_dir).value_or(""), "step2_universal");
    auto qkv = ckpt::load(zero + "h.0.attn.c_attn.weight/fp32.pt").toGenericDict();
    EXPECT_EQ(qkv.at("param").toTensor().sizes(), at::IntArrayRef({48, 16}));
    EXPECT_EQ(qkv.at("cat_dim").toInt(), 0);
    EXPECT_EQ(qkv.at("param_n_sub_params").toInt(), 3);
    auto proj = ckpt::load(zero + "h.1.mlp.c_proj.weight/exp_avg.pt").toGenericDict();
    EXPECT_EQ(proj.at("param").toTensor().sizes(), at::IntArrayRef({16, 64}));
    EXPECT_EQ(proj.at("cat_dim").toInt(), 1);
    auto wte = ckpt::load(zero + "wte.weight/fp32.pt").toGenericDict();
    EXPECT_FALSE(wte.contains("cat_dim"));  // replicated
  }
  resume_universal(ckpt_dir, first, 1, 1, 1);
  resume_universal(ckpt_dir, first, 4, 4, 2);
  resume_universal(ckpt_dir, first, 4, 2, 0);
  resume_universal(ckpt_dir, first, 2, 1, 3);
}

TEST(UniversalCheckpointDist, Zero3ToUniversalResumesOnOtherRanksAndStages) {
  const std::string first = frozen_checkpoint(3);
  const std::string ckpt_dir = first + "/ckpt";
  if (!testing::in_rank_process()) {
    const std::string out = ckpt_dir + "/step2_universal";
    const auto r = ckpt::ds_to_universal(ckpt_dir + "/step2", out);
    EXPECT_EQ(r.tp_degree, 1);
    EXPECT_EQ(r.dp_degree, 2);
    const std::string zero = out + "/zero/";
    for (const char* f : {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt", "step.pt"}) {
      EXPECT_TRUE(exists(zero + "h.1.mlp.c_fc.weight/" + f)) << f;
    }
    EXPECT_TRUE(exists(zero + "wpe.weight/fp32.pt"));  // frozen: the weight only
    EXPECT_FALSE(exists(zero + "wpe.weight/exp_avg.pt"));
    // Every weight is the full tensor zero_to_fp32 rebuilds from the shards.
    const ckpt::TensorDict full = ckpt::consolidate_zero_checkpoint(ckpt_dir, "step2");
    int compared = 0;
    for (const auto& item : full) {
      if (!exists(zero + item.key())) continue;  // buffers, tied aliases
      EXPECT_TRUE(torch::equal(ckpt::load_universal_state(out, item.key(), "fp32"), item.value()))
          << item.key();
      ++compared;
    }
    EXPECT_EQ(compared, r.parameters);
    EXPECT_GE(compared, 10);
    // The copied model states hold the whole module, not ZeRO-3's placeholders.
    const std::string ms_path = out + "/mp_rank_00_model_states.pt";
    const auto ms = ckpt::ModelStates::from_ivalue(ckpt::load(ms_path), ms_path);
    const at::Tensor* qkv = ms.module.find("h.0.attn.c_attn.weight");
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(qkv->sizes(), at::IntArrayRef({48, 16}));
    EXPECT_EQ(ms.global_steps, 2);
  }
  resume_universal(ckpt_dir, first, 3, 1, 3, true, /*freeze=*/true);
  resume_universal(ckpt_dir, first, 1, 1, 3, true, true);
  resume_universal(ckpt_dir, first, 2, 2, 1, true, true);
}

TEST(UniversalCheckpointDist, Zero2WithFrozenParameterResumesUnderZero3) {
  const std::string first = frozen_checkpoint(2);
  const std::string ckpt_dir = first + "/ckpt";
  if (!testing::in_rank_process()) {
    ckpt::ds_to_universal(ckpt_dir + "/step2", ckpt_dir + "/step2_universal");
    EXPECT_TRUE(exists(ckpt_dir + "/step2_universal/zero/wpe.weight/fp32.pt"));
  }
  resume_universal(ckpt_dir, first, 3, 1, 3, true, /*freeze=*/true);
}

// ZeRO-0 keeps the optimizer in the model states; param_shapes (written at stage 0 too) says
// which parameter each piece of it belongs to. fp32: the optimizer's own state per parameter,
// two param groups in an order other than the module's, a frozen parameter.
TEST(UniversalCheckpointDist, Zero0ToUniversalResumesOnOtherRanksAndStages) {
  const Env groups = {{"DS_TEST_GROUPS", "1"}};
  const std::string first = frozen_checkpoint(0, groups);
  const std::string ckpt_dir = first + "/ckpt";
  if (!testing::in_rank_process()) {
    const std::string source = ckpt_dir + "/step2/mp_rank_00_model_states.pt";
    const auto saved = ckpt::ModelStates::from_ivalue(ckpt::load(source), source);
    ASSERT_TRUE(saved.param_shapes.has_value());
    ASSERT_EQ(saved.param_shapes->size(), 2u);
    EXPECT_EQ((*saved.param_shapes)[1].size(), 18u);  // 2 layers x 8 biases/norms + ln_f
    EXPECT_FALSE(saved.param_shapes->front().contains("wpe.weight"));  // frozen

    const std::string out = ckpt_dir + "/step2_universal";
    const auto r = ckpt::ds_to_universal(ckpt_dir + "/step2", out);
    EXPECT_EQ(r.dp_degree, 2);
    const std::string zero = out + "/zero/";
    for (const char* f : {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt", "step.pt"}) {
      EXPECT_TRUE(exists(zero + "h.0.ln_1.bias/" + f)) << f;
      EXPECT_TRUE(exists(zero + "h.1.attn.c_proj.weight/" + f)) << f;
    }
    EXPECT_TRUE(exists(zero + "wpe.weight/fp32.pt"));
    EXPECT_FALSE(exists(zero + "wpe.weight/exp_avg.pt"));
    // fp32 at stage 0: the masters are the module's weights.
    int compared = 0;
    for (const auto& item : saved.module) {
      if (!exists(zero + item.key())) continue;  // buffers
      EXPECT_TRUE(torch::equal(ckpt::load_universal_state(out, item.key(), "fp32"), item.value()))
          << item.key();
      ++compared;
    }
    EXPECT_EQ(compared, r.parameters);
    // The global state keeps both groups' options; the optimizer itself left the model states.
    auto opt = ckpt::load(zero + "optimizer_state.pt").toGenericDict();
    auto param_groups = opt.at("param_groups").toList();
    ASSERT_EQ(param_groups.size(), 2u);
    EXPECT_EQ(param_groups.get(1).toGenericDict().at("weight_decay").toDouble(), 0.0);
    const std::string ms_path = out + "/mp_rank_00_model_states.pt";
    EXPECT_TRUE(ckpt::ModelStates::from_ivalue(ckpt::load(ms_path), ms_path).optimizer.isNone());
  }
  resume_universal(ckpt_dir, first, 3, 1, 1, true, /*freeze=*/true, groups);
  resume_universal(ckpt_dir, first, 1, 1, 3, true, true, groups);
  resume_universal(ckpt_dir, first, 2, 2, 0, true, true, groups);
}

// 16-bit ZeRO-0: FP16_Optimizer's flat fp32 masters and the inner optimizer's state over each
// flat group, cut by param_shapes. The same shape resumes exactly; ZeRO-2 within bf16's
// rounding of the loss.
TEST(UniversalCheckpointDist, Zero0Bf16ToUniversalResumes) {
  const Env bf16_groups = {{"DS_TEST_BF16", "1"}, {"DS_TEST_GROUPS", "1"}};
  const std::string first = frozen_checkpoint(0, bf16_groups);
  const std::string ckpt_dir = first + "/ckpt";
  if (!testing::in_rank_process()) {
    ckpt::ds_to_universal(ckpt_dir + "/step2", ckpt_dir + "/step2_universal");
    const std::string zero = ckpt_dir + "/step2_universal/zero/";
    EXPECT_TRUE(exists(zero + "h.1.mlp.c_fc.bias/exp_avg_sq.pt"));
    auto opt = ckpt::load(zero + "optimizer_state.pt").toGenericDict();
    EXPECT_TRUE(opt.contains("loss_scaler"));
    EXPECT_FALSE(opt.contains("fp32_groups_flat"));
    // zero_to_fp32: trainable parameters from the fp32 masters, the frozen one in the dtype it
    // was saved in (bf16), as ZeRO 1-3's frozen_param_fragments give it.
    const ckpt::TensorDict full = ckpt::consolidate_zero_checkpoint(ckpt_dir, "step2");
    const std::string ms_path = ckpt_dir + "/step2/mp_rank_00_model_states.pt";
    const auto ms = ckpt::ModelStates::from_ivalue(ckpt::load(ms_path), ms_path);
    const at::Tensor* frozen = full.find("wpe.weight");
    ASSERT_NE(frozen, nullptr);
    EXPECT_EQ(frozen->scalar_type(), at::kBFloat16);
    EXPECT_TRUE(torch::equal(*frozen, *ms.module.find("wpe.weight")));
    EXPECT_EQ(full.find("h.0.attn.c_attn.weight")->scalar_type(), at::kFloat);
  }
  resume_universal(ckpt_dir, first, 2, 1, 0, true, /*freeze=*/true, bf16_groups);
  resume_universal(ckpt_dir, first, 2, 1, 2, true, true, bf16_groups, 1e-2);
}

// DeepSpeed writes no param_shapes at stage 0: one param group is the module's parameters in
// order; with two the conversion is refused by name.
TEST(UniversalCheckpointDist, Zero0WithoutParamShapes) {
  const std::string first = frozen_checkpoint(0, {}, /*freeze=*/false);
  const std::string grouped = frozen_checkpoint(0, {{"DS_TEST_GROUPS", "1"}}, false);
  const std::string ckpt_dir = first + "/ckpt";
  if (!testing::in_rank_process()) {
    for (const std::string& dir : {first, grouped}) {  // as DeepSpeed writes stage 0
      const std::string path = dir + "/ckpt/step2/mp_rank_00_model_states.pt";
      ckpt::Dict d = ckpt::load(path).toGenericDict();
      d.insert_or_assign("param_shapes", c10::IValue());
      d.insert_or_assign("shared_params", c10::IValue());
      ckpt::save(d, path);
    }
    ckpt::ds_to_universal(ckpt_dir + "/step2", ckpt_dir + "/step2_universal");
  }
  resume_universal(ckpt_dir, first, 3, 1, 1);
  if (testing::in_rank_process()) return;
  try {
    ckpt::ds_to_universal(grouped + "/ckpt/step2", grouped + "/ckpt/u");
    ADD_FAILURE() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("mp_rank_00_model_states.pt"), std::string::npos) << what;
    EXPECT_NE(what.find("2 param groups"), std::string::npos) << what;
  }
}

TEST(UniversalCheckpointDist, Tp2CheckpointLoadsDirectlyOnTp1) {
  const std::string first = tp2_checkpoint();
  resume_universal(first + "/ckpt", first, 1, 1, 1, /*universal=*/false);
  if (!testing::in_rank_process()) {  // the conversion folder is gone, the checkpoint untouched
    EXPECT_FALSE(exists(first + "/ckpt/.step2.tp1.universal"));
    EXPECT_FALSE(exists(first + "/ckpt/latest_universal"));
  }
}

TEST(UniversalCheckpointDist, BadInputNamesTheFolderAndTheParameter) {
  const std::string first = tp2_checkpoint();
  const std::string ckpt_dir = first + "/ckpt";
  if (!testing::in_rank_process()) {
    try {
      ckpt::ds_to_universal(ckpt_dir + "/no_such_tag", ckpt_dir + "/u");
      ADD_FAILURE() << "expected CheckpointError";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("no_such_tag"), std::string::npos) << e.what();
    }
    ckpt::ds_to_universal(ckpt_dir + "/step2", ckpt_dir + "/step2_universal");
    ASSERT_EQ(std::system(("rm -rf '" + ckpt_dir + "/step2_universal/zero/h.1.mlp.c_fc.bias'")
                              .c_str()),
              0);
  }
  testing::RunOptions o;
  o.env = {{"DS_TEST_CKPT", ckpt_dir}};
  run_ranks(1, [](int, int) {
    torch::manual_seed(7);
    auto model = std::make_shared<GptImpl>(tiny_gpt());
    auto engine = initialize(model, config(1, 1, true)).engine;
    try {
      engine->load_checkpoint(std::getenv("DS_TEST_CKPT"));
      ADD_FAILURE() << "expected CheckpointError";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("h.1.mlp.c_fc.bias"), std::string::npos)
          << e.what();
    }
    // No latest_universal: DeepSpeed's ValueError, here a CheckpointError naming the file.
    try {
      engine->load_checkpoint(testing::rank_output_dir());
      ADD_FAILURE() << "expected CheckpointError";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("latest_universal"), std::string::npos) << e.what();
    }
  }, o);
}

TEST(UniversalCheckpoint, SliceHonoursStrideAndVocabularyPadding) {
  // A fused q|k|v of 3 blocks of 4 rows: rank 1 of 2 gets rows 2-3 of each block.
  const at::Tensor full = torch::arange(12 * 2, torch::kFloat).view({12, 2});
  ckpt::TensorParallelSplit qkv;
  qkv.partition_stride = 3;
  const at::Tensor piece = ckpt::universal_slice(full, {6, 2}, &qkv, 1, 2, "qkv");
  EXPECT_TRUE(torch::equal(piece, tp::shard_of(full, 0, 2, 1, 3)));
  EXPECT_TRUE(torch::equal(tp::unshard({tp::shard_of(full, 0, 2, 0, 3), piece}, 0, 3), full));
  // A 37-row vocabulary on 2 ranks: 19 rows each, the last rank's last row the zero padding.
  const at::Tensor emb = torch::randn({37, 3});
  ckpt::TensorParallelSplit vocab;
  vocab.original_vocab_size = 37;
  const at::Tensor last = ckpt::universal_slice(emb, {19, 3}, &vocab, 1, 2, "wte");
  EXPECT_TRUE(torch::equal(last.narrow(0, 0, 18), emb.narrow(0, 19, 18)));
  EXPECT_EQ(last[18].abs().sum().item<float>(), 0.0f);
  // Sizes that do not fit name the parameter.
  try {
    ckpt::universal_slice(full, {5, 2}, &qkv, 0, 2, "h.0.attn.c_attn.weight");
    ADD_FAILURE() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("h.0.attn.c_attn.weight"), std::string::npos);
  }
}

}  // namespace
}  // namespace deepspeed
