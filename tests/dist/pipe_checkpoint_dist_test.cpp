// Pipeline checkpoints on Gloo ranks: DeepSpeed's layout (a file per layer with state, one per
// stage), exact resume in new processes (2 steps + save, load in a new job + 2 steps == 4
// steps), the layer files of a P=2 checkpoint loaded onto P=4, and a P=2 ZeRO-1 checkpoint
// through ds_to_universal resuming with its optimizer state on P=4 and P=1 (and the same from
// ZeRO-0, whose stages keep the optimizer in their model states); a decoupled save resumes too.
#include "deepspeed/pipe.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/universal_checkpoint.h"
#include "support/expect_throw.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"
#include "support/tiny_pipe_model.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

std::string new_shared_dir() { return testing::new_shared_run_dir("DS_PIPE_OUT"); }
std::string shared_dir() { return std::getenv("DS_PIPE_OUT"); }

constexpr int kMicro = 2;
constexpr int kGas = 3;

json config() {
  return json{{"train_batch_size", kMicro * kGas},
              {"train_micro_batch_size_per_gpu", kMicro},
              {"gradient_accumulation_steps", kGas},
              {"gradient_clipping", 0.5},
              {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.2}, {"momentum", 0.9}}}}},
              {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}}}}}};
}

// AdamW (moments a universal checkpoint carries) under ZeRO-1, or the stage DS_ZERO_STAGE
// names; `load_universal`: the checkpoint section's key.
json universal_config(bool load_universal) {
  json c = config();
  c["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 0.05}, {"weight_decay", 0.01}}}};
  const char* stage = std::getenv("DS_ZERO_STAGE");
  c["zero_optimization"] = {{"stage", stage ? std::stoi(stage) : 1}};
  if (load_universal) c["checkpoint"] = {{"load_universal", true}};
  return c;
}

std::shared_ptr<pipe::PipelineEngine> make_engine(int stages, const json& cfg = config()) {
  pipe::PipelineModuleOptions o;
  o.num_stages = stages;
  o.loss_fn = testing::tiny_pipe_loss;
  o.seed_layers = true;
  auto module = std::make_shared<pipe::PipelineModule>(testing::tiny_pipe_specs(), o);
  return pipe::initialize(module, cfg);
}

void train(pipe::PipelineEngine& engine, int first_step, int steps) {
  for (int s = first_step; s < first_step + steps; ++s) {
    int j = 0;
    engine.train_batch([&]() { return testing::tiny_pipe_batch(int64_t{s} * kGas + j++, kMicro); });
  }
}

// Each rank writes its stage's parameters as "<prefix>_<name>.pt" files (one tensor each).
void dump(pipe::PipelineEngine& engine, const std::string& prefix) {
  for (const auto& p : engine.module().named_parameters()) {
    torch::save(p.value().detach().clone(),
                shared_dir() + "/" + prefix + "_" + p.key() + ".pt");
  }
}

at::Tensor read(const std::string& prefix, const std::string& name) {
  at::Tensor t;
  torch::load(t, shared_dir() + "/" + prefix + "_" + name + ".pt");
  return t;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> param_names() {
  testing::TinyPipeReferenceImpl ref;
  std::vector<std::string> names;
  for (const auto& p : ref.named_parameters()) names.push_back(p.key());
  return names;
}

TEST(PipeCheckpointDist, ExactResumeInNewProcessesAndLoadOntoFourStages) {
  new_shared_dir();
  run_ranks(2, [](int, int) {
    auto engine = make_engine(2);
    train(*engine, 0, 4);
    dump(*engine, "continuous");
  });
  run_ranks(2, [](int, int) {
    auto engine = make_engine(2);
    train(*engine, 0, 2);
    engine->save_checkpoint(shared_dir() + "/ckpt");
    dump(*engine, "saved");
  });
  if (!testing::in_rank_process()) {
    // DeepSpeed's layout: layers 0-5 have state (the head is a function of the tied
    // embedding, saved as layer 0), one model-states file per stage.
    const std::string dir = shared_dir() + "/ckpt/global_step2";
    for (int i = 0; i <= 5; ++i) {
      EXPECT_TRUE(exists(dir + "/layer_0" + std::to_string(i) + "-model_states.pt")) << i;
    }
    EXPECT_FALSE(exists(dir + "/layer_06-model_states.pt"));
    EXPECT_TRUE(exists(dir + "/mp_rank_00_model_states.pt"));
    EXPECT_TRUE(exists(dir + "/mp_rank_01_model_states.pt"));
    const std::string ms_path = dir + "/mp_rank_01_model_states.pt";
    const auto ms = checkpoint::ModelStates::from_ivalue(checkpoint::load(ms_path), ms_path);
    EXPECT_EQ(ms.checkpoint_parallel_dimensions.pp_degree, 2);
    EXPECT_EQ(ms.checkpoint_parallel_dimensions.tp_degree, 1);
  }
  run_ranks(2, [](int, int) {
    auto engine = make_engine(2);
    auto loaded = engine->load_checkpoint(shared_dir() + "/ckpt");
    ASSERT_TRUE(loaded.load_path.has_value());
    EXPECT_EQ(engine->global_steps(), 2);
    train(*engine, 2, 2);
    dump(*engine, "resumed");
  });
  run_ranks(4, [](int, int) {
    auto engine = make_engine(4);
    EXPECT_THROW_WITH(engine->load_checkpoint(shared_dir() + "/ckpt"),
                      CheckpointError, "written by 2 pipeline stages, this job has 4");
    LoadCheckpointOptions o;
    o.load_module_only = true;
    engine->load_checkpoint(shared_dir() + "/ckpt", std::nullopt, o);
    dump(*engine, "p4");
  });
  if (testing::in_rank_process()) return;
  for (const auto& name : param_names()) {
    EXPECT_TRUE(torch::equal(read("resumed", name), read("continuous", name))) << name;
    EXPECT_TRUE(torch::equal(read("p4", name), read("saved", name))) << name;
  }
}

// checkpoint.writer.decoupled (Note [Decoupled checkpoints]): the stages' layer files join the
// background writes, `latest` moves at the next train_batch's step, and the checkpoint resumes
// exactly.
TEST(PipeCheckpointDist, DecoupledSaveCommitsAtTheNextBatchAndResumesExactly) {
  new_shared_dir();
  json decoupled = config();
  decoupled["checkpoint"] = {{"writer", {{"type", "fast"}, {"decoupled", true},
                                         {"io_buffer_size", 8192}}}};
  run_ranks(2, [](int, int) {
    auto engine = make_engine(2);
    train(*engine, 0, 4);
    dump(*engine, "continuous");
  });
  run_ranks(2, [&](int, int) {
    const std::string dir = shared_dir() + "/ckpt";
    auto engine = make_engine(2, decoupled);
    train(*engine, 0, 2);
    engine->save_checkpoint(dir);
    EXPECT_FALSE(checkpoint::read_latest(dir).has_value());
    train(*engine, 2, 1);
    EXPECT_EQ(checkpoint::read_latest(dir).value_or(""), "global_step2");
  });
  run_ranks(2, [&](int, int) {
    auto engine = make_engine(2, decoupled);
    ASSERT_TRUE(engine->load_checkpoint(shared_dir() + "/ckpt").load_path.has_value());
    EXPECT_EQ(engine->global_steps(), 2);
    train(*engine, 2, 2);
    dump(*engine, "resumed");
  });
  if (testing::in_rank_process()) return;
  for (const auto& name : param_names()) {
    EXPECT_TRUE(torch::equal(read("resumed", name), read("continuous", name))) << name;
  }
}

// P=2 under ZeRO `zero_stage` trains 4 steps; a save after 2, converted by ds_to_universal,
// resumes on P=4 and P=1 and ends where the uninterrupted run does.
void universal_resume_on_four_stages_and_one(int zero_stage) {
  new_shared_dir();
  testing::RunOptions source;
  source.env = {{"DS_ZERO_STAGE", std::to_string(zero_stage)}};
  run_ranks(2, [](int, int) {
    auto engine = make_engine(2, universal_config(false));
    train(*engine, 0, 4);
    dump(*engine, "continuous");
  }, source);
  run_ranks(2, [](int, int) {
    auto engine = make_engine(2, universal_config(false));
    train(*engine, 0, 2);
    engine->save_checkpoint(shared_dir() + "/ckpt");
  }, source);
  if (!testing::in_rank_process()) {
    const std::string dir = shared_dir() + "/ckpt";
    const auto r = checkpoint::ds_to_universal(dir + "/global_step2", dir + "/global_step2_universal");
    EXPECT_EQ(r.pp_degree, 2);
    EXPECT_EQ(r.tp_degree, 1);
    // Every parameter once by its global layer name (the tied embedding of stages 0 and 1 too).
    EXPECT_EQ(r.parameters, static_cast<int64_t>(param_names().size()));
    for (const auto& name : param_names()) {
      EXPECT_TRUE(exists(dir + "/global_step2_universal/zero/" + name + "/exp_avg.pt")) << name;
    }
  }
  for (int stages : {4, 1}) {
    testing::RunOptions o;
    o.env = {{"DS_PIPE_STAGES", std::to_string(stages)},
             {"DS_ZERO_STAGE", std::to_string(zero_stage)}};
    run_ranks(stages, [](int, int) {
      const int p = std::stoi(std::getenv("DS_PIPE_STAGES"));
      auto engine = make_engine(p, universal_config(true));
      auto loaded = engine->load_checkpoint(shared_dir() + "/ckpt");
      ASSERT_TRUE(loaded.load_path.has_value());
      EXPECT_EQ(engine->global_steps(), 2);
      train(*engine, 2, 2);
      dump(*engine, "p" + std::to_string(p));
    }, o);
  }
  if (testing::in_rank_process()) return;
  // The stages sum the gradient norm in another order: equal up to float rounding.
  for (const auto& name : param_names()) {
    for (const char* run : {"p4", "p1"}) {
      EXPECT_TRUE(torch::allclose(read(run, name), read("continuous", name), 1e-5, 1e-6))
          << run << " " << name << ": " << (read(run, name) - read("continuous", name)).abs().max();
    }
  }
}

TEST(PipeCheckpointDist, UniversalCheckpointResumesOnFourStagesAndOne) {
  universal_resume_on_four_stages_and_one(1);
}

// ZeRO-0 keeps each stage's optimizer in its model states.
TEST(PipeCheckpointDist, Zero0UniversalCheckpointResumesOnFourStagesAndOne) {
  universal_resume_on_four_stages_and_one(0);
}

}  // namespace
}  // namespace deepspeed
