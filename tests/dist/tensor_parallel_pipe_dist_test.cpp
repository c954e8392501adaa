// 3D parallelism on 8 Gloo ranks: the example GPT as a pipeline of 2 stages, each stage's
// attention and MLP split over 2 tensor-parallel ranks by AutoTP, 2 data-parallel replicas
// (PipeModelDataParallelTopology(2, 2, 2)). After K steps of ZeRO-1 SGD with active clipping
// every parameter (tensor-parallel shards gathered) equals the single-process model's trained on
// the same global batches, within 1e-5 relative; so do the loss and the gradient norm. 3D
// checkpoints: an exact resume in new processes, a universal conversion that one process
// continues from, and zero_to_fp32's whole model.
#include <sys/stat.h>

#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/pipe.h"
#include "deepspeed/tensor_parallel.h"
#include "deepspeed/universal_checkpoint.h"
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

struct Job {
  std::shared_ptr<pipe::PipelineModule> module;
  std::shared_ptr<pipe::PipelineEngine> engine;
  double loss = 0.0;
};

// The example GPT as a pipeline on `topo`, its engine (`universal`: checkpoint.load_universal).
Job make_job(const ProcessTopology& topo, bool universal = false) {
  pipe::PipelineModuleOptions o;
  o.topology = topo;
  o.loss_fn = examples::gpt_pipeline_loss;
  o.seed_layers = true;
  o.base_seed = 42;
  Job job;
  job.module =
      std::make_shared<pipe::PipelineModule>(examples::gpt_pipeline_specs(tiny_gpt()), o);
  json c = config(job.module->groups().data().size(), topo.get_dim("model"));
  if (universal) c["checkpoint"] = {{"load_universal", true}};
  job.engine = pipe::initialize(job.module, c);
  return job;
}

// Steps [first, first + count) of the data stream.
void run_steps(Job& job, int first, int count) {
  const int dp = job.module->groups().data().size();
  const int dp_rank = job.module->groups().coord("data");
  const int64_t gas = kGlobalBatch / dp;
  for (int s = first; s < first + count; ++s) {
    int64_t j = 0;
    job.loss = job.engine
                   ->train_batch([&]() { return sequence(s * kGlobalBatch + dp_rank * gas + j++); })
                   .item<double>();
  }
}

// Data-parallel rank 0 and tensor-parallel rank 0 of each stage saves the stage's full
// parameters (shards gathered over the tensor-parallel group, which every peer joins), the last
// loss and the gradient norm.
void dump(const Job& job, const std::string& out_name) {
  std::map<std::string, at::Tensor> full;
  for (const auto& item : job.module->named_parameters()) {
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
  if (job.module->groups().coord("data") != 0 || job.module->groups().coord("model") != 0) {
    return;
  }
  const std::string stage = std::to_string(job.module->stage_id());
  std::vector<at::Tensor> tensors;
  std::ofstream names(dir() + "/" + out_name + stage + ".names");
  for (const auto& [n, t] : full) {
    names << n << "\n";
    tensors.push_back(t);
  }
  tensors.push_back(torch::tensor({job.loss, job.engine->get_global_grad_norm().value_or(-1.0)},
                                  torch::kDouble));
  torch::save(tensors, dir() + "/" + out_name + stage + ".pt");
}

void train(const ProcessTopology& topo, const std::string& out_name) {
  Job job = make_job(topo);
  run_steps(job, 0, kSteps);
  dump(job, out_name);
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

// Run `got` (`got_stages` stage files) against run `want` (`want_stages`): every parameter,
// the last loss and the gradient norm, within `rtol` relative (0: bit for bit).
void expect_same(const std::string& want, int want_stages, const std::string& got,
                 int got_stages, double rtol) {
  std::map<std::string, at::Tensor> ref;
  double ref_loss = 0, ref_norm = 0;
  for (int s = 0; s < want_stages; ++s) {
    for (auto& [name, t] : load(want + std::to_string(s), &ref_loss, &ref_norm)) {
      ref.emplace(name, t);  // the tied embedding: its first stage's
    }
  }
  for (int s = 0; s < got_stages; ++s) {
    double loss = 0, norm = 0;
    for (const auto& [name, t] : load(got + std::to_string(s), &loss, &norm)) {
      if (s > 0 && name == "tied_modules.embed.wpe.weight") continue;  // an unused copy
      ASSERT_TRUE(ref.count(name)) << name;
      const at::Tensor& r = ref.at(name);
      ASSERT_EQ(t.sizes(), r.sizes()) << name;
      EXPECT_LE((t - r).abs().max().item<double>(), rtol * r.abs().max().item<double>())
          << got << " " << name << " on stage " << s;
    }
    EXPECT_NEAR(loss, ref_loss, rtol * std::abs(ref_loss)) << got << " stage " << s;
    EXPECT_NEAR(norm, ref_norm, rtol * ref_norm) << got << " stage " << s;
  }
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// 3D checkpoints: TP=2 x PP=2 x DP=2 saves after 2 steps (each stage's two tensor-parallel ranks
// their own files, named as DeepSpeed's), resumes in a new job bit for bit, and through
// ds_to_universal continues in one process (momentum SGD: the universal checkpoint carries
// momentum_buffer) as the uninterrupted run does.
TEST(TensorParallelPipeDist, Tp2xPp2xDp2CheckpointResumesExactlyAndThroughUniversal) {
  testing::new_shared_run_dir("DS_TP3D_OUT");
  testing::RunOptions o;
  o.timeout_s = 300;
  run_ranks(8, [](int, int) {
    Job job = make_job(PipeModelDataParallelTopology(2, 2, 2));
    run_steps(job, 0, 2);
    job.engine->save_checkpoint(dir() + "/ckpt");
    dump(job, "saved");
    run_steps(job, 2, 1);
    dump(job, "continuous");
  }, o);
  run_ranks(8, [](int, int) {
    Job job = make_job(PipeModelDataParallelTopology(2, 2, 2));
    ASSERT_TRUE(job.engine->load_checkpoint(dir() + "/ckpt").load_path.has_value());
    EXPECT_EQ(job.engine->global_steps(), 2);
    run_steps(job, 2, 1);
    dump(job, "resumed");
  }, o);
  if (!testing::in_rank_process()) {
    const std::string tag = dir() + "/ckpt/global_step2";
    // DeepSpeed's names: mp_rank_<stage * T + tensor-parallel rank>, layer_XX-model_YY.
    for (const char* f : {"mp_rank_00_model_states.pt", "mp_rank_03_model_states.pt",
                          "zero_pp_rank_1_mp_rank_02_optim_states.pt",
                          "layer_01-model_00-model_states.pt", "layer_01-model_01-model_states.pt",
                          "layer_03-model_01-model_states.pt"}) {
      EXPECT_TRUE(exists(tag + "/" + f)) << f;
    }
    const auto ms = checkpoint::ModelStates::from_ivalue(
        checkpoint::load(tag + "/mp_rank_03_model_states.pt"), "mp_rank_03");
    EXPECT_EQ(ms.mp_world_size, 4);
    EXPECT_EQ(ms.checkpoint_parallel_dimensions.tp_degree, 2);
    EXPECT_EQ(ms.checkpoint_parallel_dimensions.pp_degree, 2);
    const auto r = checkpoint::ds_to_universal(tag, dir() + "/ckpt/global_step2_universal");
    EXPECT_EQ(r.tp_degree, 2);
    EXPECT_EQ(r.pp_degree, 2);
    EXPECT_EQ(r.dp_degree, 2);
    EXPECT_TRUE(exists(dir() + "/ckpt/global_step2_universal/zero/1.attn.c_attn.weight/"
                       "momentum_buffer.pt"));
    // zero_to_fp32 of the 3D checkpoint: the whole model, each stage's layers under their
    // global names and the tensor-parallel shards joined, the fp32 masters bit for bit.
    auto full = checkpoint::consolidate_zero_checkpoint(dir() + "/ckpt",
                                                        std::string("global_step2"));
    for (int s = 0; s < 2; ++s) {
      double loss = 0, norm = 0;
      for (const auto& [name, t] : load("saved" + std::to_string(s), &loss, &norm)) {
        if (s > 0 && name == "tied_modules.embed.wpe.weight") continue;  // an unused copy
        const at::Tensor* got = full.find(name);
        ASSERT_NE(got, nullptr) << name;
        EXPECT_TRUE(got->equal(t)) << name << " of stage " << s;
      }
    }
  }
  run_ranks(1, [](int, int) {
    Job job = make_job(PipeModelDataParallelTopology(1, 1, 1), /*universal=*/true);
    ASSERT_TRUE(job.engine->load_checkpoint(dir() + "/ckpt").load_path.has_value());
    run_steps(job, 2, 1);
    dump(job, "universal");
  });
  if (testing::in_rank_process()) return;
  expect_same("continuous", 2, "resumed", 2, 0.0);
  expect_same("continuous", 2, "universal", 1, 1e-5);
}

}  // namespace
}  // namespace deepspeed
