// Engine::save_checkpoint / load_checkpoint in one process: DeepSpeed's files and keys, tied
// parameters, client state, load_module_only, save_16bit_model, and every bad input failing with
// an error that names the problem while leaving the engine exactly as it was.
#include "deepspeed/deepspeed.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/optimizers.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

namespace ckpt = checkpoint;
using testing::TempDir;
using testing::tiny_batch;

// A head tied to the first layer's weight: one tensor under two names, used twice per forward.
struct HeadImpl : torch::nn::Module {
  explicit HeadImpl(const at::Tensor& w) { weight = register_parameter("weight", w); }
  at::Tensor weight;
};

struct TiedNetImpl : torch::nn::Module {
  explicit TiedNetImpl(int64_t width = 4, const std::string& first = "fc") {
    torch::manual_seed(3);
    fc = register_module(first, torch::nn::Linear(4, width));
    mid = register_module("mid", torch::nn::Linear(width, 4));
    head = register_module("head", std::make_shared<HeadImpl>(mid->weight));
    frozen = register_module("frozen", torch::nn::Linear(4, 4));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y) {
    auto h = torch::tanh(mid(torch::tanh(fc(x + frozen(x)))));
    auto out = torch::nn::functional::linear(h, head->weight.t());
    return (out.narrow(1, 0, 2) - y).pow(2).mean();
  }
  torch::nn::Linear fc{nullptr}, mid{nullptr}, frozen{nullptr};
  std::shared_ptr<HeadImpl> head;
};

json config(int stage, bool scheduler = true) {
  json cfg = {{"train_micro_batch_size_per_gpu", 4},
              {"gradient_accumulation_steps", 1},
              {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
              {"zero_optimization", {{"stage", stage}}},
              {"steps_per_print", 1000}};
  if (scheduler) {
    cfg["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 5}}}};
  }
  return cfg;
}

using TiedEngine = ModuleEngine<TiedNetImpl>;

std::shared_ptr<TiedEngine> make(int stage, bool scheduler = true, int64_t width = 4,
                                 const std::string& first = "fc") {
  return initialize(std::make_shared<TiedNetImpl>(width, first), config(stage, scheduler)).engine;
}

void train(TiedEngine& e, int steps) {
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = tiny_batch(s * 4, 4);
    e.backward(e.forward(x, y));
    e.step();
  }
}

// Everything a failed load must leave alone.
struct Snapshot {
  explicit Snapshot(Engine& e) {
    for (const auto& item : e.module().named_parameters()) params.push_back(item.value().clone());
    steps = e.global_steps();
    lr = e.get_lr();
    optimizer = ckpt::save_to_string(optim::optimizer_state_dict(*e.optimizer()));
  }
  bool operator==(const Snapshot& o) const {
    if (params.size() != o.params.size() || steps != o.steps || lr != o.lr) return false;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].equal(o.params[i])) return false;
    }
    return optimizer == o.optimizer;
  }
  std::vector<at::Tensor> params;
  int64_t steps;
  std::vector<double> lr;
  std::string optimizer;
};

TEST(EngineCheckpoint, TiedParametersAreSteppedOnceAndRecorded) {
  auto e = make(2);
  ASSERT_EQ(e->shared_params().size(), 1u);
  EXPECT_EQ(e->shared_params()[0].first, "head.weight");
  EXPECT_EQ(e->shared_params()[0].second, "mid.weight");
  train(*e, 2);
  EXPECT_TRUE(e->typed_module().head->weight.is_same(e->typed_module().mid->weight));
}

// TiedNet's param_shapes: one group of the trainable parameters, deduplicated, in flattening
// order (the tied alias and the frozen layer are not in it); the alias in shared_params.
void expect_trainable_param_shapes(const ckpt::ModelStates& states) {
  ASSERT_TRUE(states.param_shapes.has_value());
  ASSERT_EQ(states.param_shapes->size(), 1u);
  std::vector<std::string> names;
  for (const auto& item : (*states.param_shapes)[0]) names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"fc.weight", "fc.bias", "mid.weight", "mid.bias"}));
  ASSERT_TRUE(states.shared_params.has_value());
  ASSERT_EQ(states.shared_params->size(), 1u);
  EXPECT_EQ((*states.shared_params)[0],
            (std::pair<std::string, std::string>{"head.weight", "mid.weight"}));
}

TEST(EngineCheckpoint, WritesDeepSpeedFilesAndKeys) {
  TempDir dir;
  auto e = make(2);
  train(*e, 3);
  ASSERT_TRUE(e->save_checkpoint(dir.path(), std::nullopt, {{"epoch", c10::IValue(int64_t{2})}}));
  EXPECT_EQ(ckpt::read_latest(dir.path()).value_or(""), "global_step3");
  const std::string tag_dir = dir.file("global_step3");
  auto states = ckpt::ModelStates::from_ivalue(ckpt::load(tag_dir + "/mp_rank_00_model_states.pt"), "ms");
  EXPECT_EQ(states.global_steps, 3);
  EXPECT_EQ(states.global_samples, 12);
  EXPECT_TRUE(states.optimizer.isNone());
  expect_trainable_param_shapes(states);
  ASSERT_TRUE(states.frozen_param_shapes.has_value());
  EXPECT_TRUE(states.frozen_param_shapes->contains("frozen.weight"));
  EXPECT_TRUE(states.module.contains("head.weight"));
  auto optim_file = ckpt::ZeroOptimizerFile::from_ivalue(
      ckpt::load(tag_dir + "/zero_pp_rank_0_mp_rank_00_optim_states.pt"), "optim");
  EXPECT_EQ(optim_file.optimizer_state_dict.zero_stage, 2);
  EXPECT_EQ(optim_file.optimizer_state_dict.partition_count, std::vector<int64_t>{1});
  // zero_to_fp32's consolidation gives the engine's weights, the alias included.
  auto full = ckpt::consolidate_zero_checkpoint(dir.path());
  for (const auto& item : e->module().named_parameters()) {
    ASSERT_TRUE(full.contains(item.key())) << item.key();
    EXPECT_TRUE(full[item.key()].equal(item.value())) << item.key();
  }
}

// zero_to_fp32 of a stage-0 checkpoint (beyond DeepSpeed's script, which reads ZeRO 1-3): in
// bf16 the fp32 masters that the optimizer holds, in either of DeepSpeed's stage-0 layouts
// (FP16_Optimizer's flat masters for Adam, FP16_UnfusedOptimizer's per parameter for Lamb);
// in fp32 the module. Frozen parameters first, as DeepSpeed orders them, and in the dtype they
// were saved in (as ZeRO 1-3's frozen_param_fragments give them); the tied alias is its
// source's tensor.
TEST(EngineCheckpoint, ZeroToFp32ReadsStage0Masters) {
  for (const char* optimizer : {"Adam", "Lamb", ""}) {
    SCOPED_TRACE(*optimizer ? optimizer : "fp32 Adam");
    const bool bf16 = *optimizer != '\0';
    TempDir dir;
    json cfg = config(0);
    if (bf16) {
      cfg["bf16"] = {{"enabled", true}};
      cfg["optimizer"]["type"] = optimizer;
    }
    auto e = initialize(std::make_shared<TiedNetImpl>(), cfg).engine;
    const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
    for (int s = 0; s < 3; ++s) {
      auto [x, y] = tiny_batch(s * 4, 4);
      e->backward(e->forward(x.to(dtype), y.to(dtype)));
      e->step();
    }
    ASSERT_TRUE(e->save_checkpoint(dir.path()));
    auto full = ckpt::consolidate_zero_checkpoint(dir.path());
    std::vector<std::string> keys;
    for (const auto& item : full) keys.push_back(item.key());
    EXPECT_EQ(keys, (std::vector<std::string>{"frozen.weight", "frozen.bias", "fc.weight",
                                              "fc.bias", "mid.weight", "mid.bias",
                                              "head.weight"}));
    bool beyond_bf16 = false;  // a master that bf16 cannot hold: not the module's copy
    for (const auto& item : e->module().named_parameters()) {
      const at::Tensor& got = full[item.key()];
      const bool frozen = !item.value().requires_grad();
      EXPECT_EQ(got.scalar_type(), frozen ? dtype : at::kFloat) << item.key();
      EXPECT_TRUE(got.to(item.value().scalar_type()).equal(item.value())) << item.key();
      beyond_bf16 |= bf16 && !frozen && !got.equal(got.to(at::kBFloat16).to(at::kFloat));
    }
    EXPECT_EQ(beyond_bf16, bf16);
    EXPECT_TRUE(full["head.weight"].is_same(full["mid.weight"]));
    ckpt::ConsolidateOptions without_frozen;
    without_frozen.exclude_frozen_parameters = true;
    const auto trainable = ckpt::consolidate_zero_checkpoint(dir.path(), std::nullopt,
                                                             without_frozen);
    EXPECT_EQ(trainable.size(), 5u);
    EXPECT_FALSE(trainable.contains("frozen.weight"));
  }
}

// bf16 ZeRO-1 with fp32 accumulation writes BF16_Optimizer's layout, each partition with its
// padding (49 trainable elements, aligned to 2): zero_to_fp32 gives the masters, and the frozen
// layer, which ZeRO-1 records in the module only (DeepSpeed's script leaves it out).
TEST(EngineCheckpoint, ZeroToFp32ReadsBf16OptimizerPartitions) {
  TempDir dir;
  json cfg = config(1);
  cfg["bf16"] = {{"enabled", true}};
  cfg["data_types"] = {{"grad_accum_dtype", "fp32"}};
  auto e = initialize(std::make_shared<TiedNetImpl>(/*width=*/5), cfg).engine;
  for (int s = 0; s < 2; ++s) {
    auto [x, y] = tiny_batch(s * 4, 4);
    e->backward(e->forward(x.to(at::kBFloat16), y.to(at::kBFloat16)));
    e->step();
  }
  ASSERT_TRUE(e->save_checkpoint(dir.path()));
  const std::string optim =
      dir.file("global_step2") + "/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt";
  const auto file = ckpt::ZeroOptimizerFile::from_ivalue(ckpt::load(optim), optim);
  ASSERT_TRUE(file.optimizer_state_dict.bf16_optimizer);
  ASSERT_EQ(file.optimizer_state_dict.group_paddings, std::vector<int64_t>{1});
  auto full = ckpt::consolidate_zero_checkpoint(dir.path());
  for (const auto& item : e->module().named_parameters()) {
    ASSERT_TRUE(full.contains(item.key())) << item.key();
    EXPECT_TRUE(full[item.key()].to(at::kBFloat16).equal(item.value())) << item.key();
  }
}

// Stage 0 records its optimizer's parameters as param_shapes (DeepSpeed writes None there), so
// that ds_to_universal can name the optimizer's state; a client optimizer's tensor outside the
// module leaves it None rather than failing the save.
TEST(EngineCheckpoint, Stage0RecordsTheOptimizersParameters) {
  TempDir dir;
  auto e = make(0);
  train(*e, 2);
  ASSERT_TRUE(e->save_checkpoint(dir.path()));
  const std::string path = dir.file("global_step2") + "/mp_rank_00_model_states.pt";
  auto states = ckpt::ModelStates::from_ivalue(ckpt::load(path), path);
  EXPECT_FALSE(states.optimizer.isNone());
  expect_trainable_param_shapes(states);

  TempDir other;
  auto model = std::make_shared<TiedNetImpl>();
  std::vector<at::Tensor> params{model->fc->weight, torch::zeros({3}, torch::requires_grad())};
  auto client = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
  auto c = initialize(model, config(0, false), std::move(client)).engine;
  train(*c, 1);
  ASSERT_TRUE(c->save_checkpoint(other.path()));
  const std::string other_path = other.file("global_step1") + "/mp_rank_00_model_states.pt";
  EXPECT_FALSE(ckpt::ModelStates::from_ivalue(ckpt::load(other_path), other_path)
                   .param_shapes.has_value());
}

TEST(EngineCheckpoint, LoadRestoresEverythingAndReturnsClientState) {
  TempDir dir;
  auto a = make(1);
  train(*a, 3);
  a->save_checkpoint(dir.path(), std::string("t1"), {{"note", c10::IValue(std::string("hi"))}});
  train(*a, 2);
  auto b = make(1);
  auto loaded = b->load_checkpoint(dir.path(), std::string("t1"));
  ASSERT_TRUE(loaded.load_path.has_value());
  EXPECT_EQ(*loaded.load_path, dir.file("t1"));
  EXPECT_EQ(loaded.client_state.at("note").toStringRef(), "hi");
  EXPECT_TRUE(loaded.client_state.contains("ds_config"));  // DeepSpeed returns informational keys
  EXPECT_FALSE(loaded.client_state.contains("lr_scheduler"));
  EXPECT_EQ(b->global_steps(), 3);
  train(*b, 2);
  EXPECT_TRUE(Snapshot(*a) == Snapshot(*b)) << "resume in the same process differs";
}

TEST(EngineCheckpoint, LoadModuleOnlyTakesTheWeightsAlone) {
  TempDir dir;
  auto a = make(0);
  train(*a, 3);
  a->save_checkpoint(dir.path());
  auto b = make(0);
  LoadCheckpointOptions o;
  o.load_module_only = true;
  b->load_checkpoint(dir.path(), std::nullopt, o);
  EXPECT_EQ(b->global_steps(), 0);
  auto pa = a->module().parameters(), pb = b->module().parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].equal(pb[i]));
  EXPECT_TRUE(b->optimizer()->state().empty());
}

TEST(EngineCheckpoint, Save16BitModelWritesTheTrainingDtype) {
  TempDir dir;
  json cfg = config(2);
  cfg["bf16"] = {{"enabled", true}};
  auto model = std::make_shared<TiedNetImpl>();
  auto e = initialize(model, cfg).engine;
  ASSERT_TRUE(e->save_16bit_model(dir.path()));
  auto state = ckpt::tensors_from_ivalue(ckpt::load(dir.file("pytorch_model.bin")), "bin");
  EXPECT_TRUE(state.contains("mid.weight"));
  EXPECT_FALSE(state.contains("head.weight"));  // the tied alias is stored once
  EXPECT_EQ(state["mid.weight"].scalar_type(), at::kBFloat16);
  ASSERT_TRUE(e->save_16bit_model(dir.path(), "model.safetensors"));
  auto st = ckpt::load_safetensors(dir.file("model.safetensors"));
  EXPECT_TRUE(st["fc.weight"].equal(model->fc->weight));
}

TEST(EngineCheckpoint, NoLatestLoadsNothing) {
  TempDir dir;
  auto e = make(2);
  Snapshot before(*e);
  auto loaded = e->load_checkpoint(dir.path());
  EXPECT_FALSE(loaded.load_path.has_value());
  EXPECT_TRUE(Snapshot(*e) == before);
}

// ---- bad input: a clear error, nothing changed ----------------------------------------------

class BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = make(2);
    train(*a, 2);
    a->save_checkpoint(dir.path());
    tag_dir = dir.file("global_step2");
    engine = make(2);
    train(*engine, 1);
  }
  // Loading must throw CheckpointError mentioning every one of `parts` and change nothing.
  void expect_refused(const std::vector<std::string>& parts, const LoadCheckpointOptions& o = {},
                      std::shared_ptr<TiedEngine> target = nullptr) {
    auto& e = target ? *target : *engine;
    Snapshot before(e);
    try {
      e.load_checkpoint(dir.path(), std::nullopt, o);
      ADD_FAILURE() << "load_checkpoint accepted a bad checkpoint";
    } catch (const CheckpointError& err) {
      for (const auto& p : parts) {
        EXPECT_NE(std::string(err.what()).find(p), std::string::npos)
            << "'" << p << "' not in: " << err.what();
      }
    }
    EXPECT_TRUE(Snapshot(e) == before) << "a failed load changed the engine";
  }
  TempDir dir;
  std::string tag_dir;
  std::shared_ptr<TiedEngine> engine;
};

TEST_F(BadCheckpoint, MissingDirectory) {
  Snapshot before(*engine);
  try {
    engine->load_checkpoint(dir.file("nowhere"), std::string("global_step2"));
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("nowhere"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(Snapshot(*engine) == before);
}

TEST_F(BadCheckpoint, MissingTag) {
  ckpt::write_latest(dir.path(), "global_step99");
  expect_refused({"global_step99"});
}

TEST_F(BadCheckpoint, TruncatedModelStates) {
  const std::string f = tag_dir + "/mp_rank_00_model_states.pt";
  struct stat st {};
  ASSERT_EQ(::stat(f.c_str(), &st), 0);
  ASSERT_EQ(::truncate(f.c_str(), st.st_size / 2), 0);
  expect_refused({"mp_rank_00_model_states.pt"});
}

TEST_F(BadCheckpoint, CorruptedOptimizerFile) {
  const std::string f = tag_dir + "/zero_pp_rank_0_mp_rank_00_optim_states.pt";
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(0, std::ios::end);
  const auto size = static_cast<int64_t>(io.tellg());
  for (int64_t at = size / 4; at < size / 2; at += 7) {  // scribble over data and headers
    io.seekp(at);
    io.put(static_cast<char>(0x5a));
  }
  io.close();
  expect_refused({"zero_pp_rank_0_mp_rank_00_optim_states.pt"});
}

TEST_F(BadCheckpoint, MissingOptimizerFile) {
  ASSERT_EQ(::unlink((tag_dir + "/zero_pp_rank_0_mp_rank_00_optim_states.pt").c_str()), 0);
  expect_refused({"zero_pp_rank_0_mp_rank_00_optim_states.pt"});
}

TEST_F(BadCheckpoint, ParameterNamesDiffer) {
  auto other = make(2, true, 4, "first");
  expect_refused({"missing", "first.weight", "unexpected", "fc.weight"}, {}, other);
}

TEST_F(BadCheckpoint, ParameterShapesDiffer) {
  auto other = make(2, true, 6);
  expect_refused({"fc.weight", "[6, 4]", "[4, 4]"}, {}, other);
}

TEST_F(BadCheckpoint, DifferentZeroStage) {
  auto other = make(1);
  expect_refused({"stage 2", "stage 1", "load_optimizer_states=false"}, {}, other);
  // The way out the message names works: the weights alone.
  LoadCheckpointOptions weights_only;
  weights_only.load_optimizer_states = false;
  other->load_checkpoint(dir.path(), std::nullopt, weights_only);
  EXPECT_TRUE(other->module().parameters()[0].equal(
      ckpt::load(tag_dir + "/mp_rank_00_model_states.pt").toGenericDict().at("module")
          .toGenericDict().at("fc.weight").toTensor()));
}

TEST_F(BadCheckpoint, MissingSchedulerState) {
  TempDir plain;
  auto a = make(2, /*scheduler=*/false);
  train(*a, 1);
  a->save_checkpoint(plain.path());
  Snapshot before(*engine);
  try {
    engine->load_checkpoint(plain.path());
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("lr_scheduler"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(Snapshot(*engine) == before);
}

TEST(EngineCheckpointSave, EmptyDirectoryAndReservedKeyAreUsageErrors) {
  auto e = make(0);
  EXPECT_THROW(e->save_checkpoint(""), UsageError);
  TempDir dir;
  EXPECT_THROW(e->save_checkpoint(dir.path(), std::nullopt, {{"rng_state", c10::IValue(1)}}),
               UsageError);
  EXPECT_THROW(e->save_checkpoint(dir.path(), std::nullopt,
                                  {{"checkpoint_parallel_dimensions", c10::IValue(1)}}),
               UsageError);
  EXPECT_FALSE(ckpt::read_latest(dir.path()).has_value());
}

}  // namespace
}  // namespace deepspeed
