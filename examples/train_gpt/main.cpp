// train_gpt: trains a GPT-2-style model on a real English corpus (Jane Austen's novels by
// default) with deepspeed-cpp, one process per rank:
//   deepspeed --num_gpus 2 train_gpt --deepspeed_config ds_config.json --steps 200
// Prints loss, learning rate and tokens/s every steps_per_print steps, the held-out loss before
// and after training, and (with --metrics_file) one JSON object per optimizer step.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "bpe_tokenizer.h"
#include "deepspeed/deepspeed.h"
#include "gpt_model.h"
#include "token_dataset.h"

namespace ds = deepspeed;
using deepspeed::examples::BpeTokenizer;
using deepspeed::examples::DistributedBatchSampler;
using deepspeed::examples::Gpt;
using deepspeed::examples::GptConfig;

namespace {

struct Args {
  std::string deepspeed_config = std::string(DS_SOURCE_DIR) + "/examples/train_gpt/ds_config.json";
  int64_t steps = 200;
  int64_t n_layer = 4, n_head = 4, n_embd = 128, seq_len = 128;
  std::string data = std::string(DS_SOURCE_DIR) + "/data/austen.txt";
  int64_t seed = 1234;
  std::string metrics_file;
  int64_t eval_batches = 8;
  double val_fraction = 0.05;
  int local_rank = -1;
};

struct Batch {
  torch::Tensor inputs, targets;
};

Batch make_batch(const std::vector<uint16_t>& tokens, const std::vector<int64_t>& windows,
                 int64_t seq_len) {
  const int64_t b = static_cast<int64_t>(windows.size());
  Batch out{torch::empty({b, seq_len}, torch::kLong), torch::empty({b, seq_len}, torch::kLong)};
  deepspeed::examples::gather_windows(tokens, windows, seq_len, out.inputs.data_ptr<int64_t>(),
                                      out.targets.data_ptr<int64_t>());
  return out;
}

// Mean loss over the first eval_batches * micro * world validation windows, all ranks together
// (rank r takes every world-th window), averaged across ranks.
double held_out_loss(ds::ModuleEngine<deepspeed::examples::GptImpl>& engine,
                     const std::vector<uint16_t>& val, const Args& a, int64_t micro) {
  const int world = ds::comm::get_world_size(), rank = ds::comm::get_rank();
  const int64_t available = deepspeed::examples::num_windows(val.size(), a.seq_len);
  const int64_t batches = std::min<int64_t>(a.eval_batches, available / (micro * world));
  if (batches <= 0) throw ds::UsageError("the validation split is too small for one eval batch");
  torch::NoGradGuard no_grad;
  engine.eval();
  double sum = 0.0;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<int64_t> windows;
    for (int64_t j = 0; j < micro; ++j) windows.push_back((b * micro + j) * world + rank);
    auto batch = make_batch(val, windows, a.seq_len);
    sum += engine.typed_module().forward(batch.inputs, batch.targets).item<double>();
  }
  engine.train();
  auto t = torch::tensor({sum / static_cast<double>(batches)}, torch::kDouble);
  ds::comm::all_reduce(t, ds::comm::ReduceOp::kAvg);
  return t.item<double>();
}

int run(const Args& a) {
  auto config = ds::load_config(a.deepspeed_config);
  const int rank = ds::comm::get_rank(), world = ds::comm::get_world_size();
  const int64_t micro = config.batch.train_micro_batch_size_per_gpu;
  const int64_t gas = config.batch.gradient_accumulation_steps;

  // Rank 0 tokenizes (and caches) first; the others then read the cache.
  auto tokenizer = BpeTokenizer::from_default_files();
  std::vector<uint16_t> tokens;
  if (rank == 0) tokens = deepspeed::examples::load_or_build_token_cache(tokenizer, a.data);
  ds::comm::barrier();
  if (rank != 0) tokens = deepspeed::examples::load_or_build_token_cache(tokenizer, a.data);
  auto split = deepspeed::examples::split_train_val(tokens, a.val_fraction);

  torch::manual_seed(static_cast<uint64_t>(a.seed));
  GptConfig gcfg;
  gcfg.vocab_size = static_cast<int64_t>(tokenizer.vocab_size());
  gcfg.block_size = a.seq_len;
  gcfg.n_layer = a.n_layer;
  gcfg.n_head = a.n_head;
  gcfg.n_embd = a.n_embd;
  auto model = std::make_shared<deepspeed::examples::GptImpl>(gcfg);
  auto [engine, optimizer, lr_scheduler] = ds::initialize(model, config);

  DistributedBatchSampler sampler(deepspeed::examples::num_windows(split.train.size(), a.seq_len),
                                  micro, gas, world, rank, static_cast<uint64_t>(a.seed));
  const int64_t print_every = config.steps_per_print.value_or(10);
  if (rank == 0) {
    std::printf("train_gpt: %s: %zu tokens (%zu train, %zu held out), %lld params, "
                "%d ranks x micro-batch %lld x accumulation %lld = %lld sequences of %lld tokens "
                "per step\n",
                a.data.c_str(), tokens.size(), split.train.size(), split.val.size(),
                static_cast<long long>(model->num_parameters()), world,
                static_cast<long long>(micro), static_cast<long long>(gas),
                static_cast<long long>(config.batch.train_batch_size),
                static_cast<long long>(a.seq_len));
  }
  const double initial_val = held_out_loss(*engine, split.val, a, micro);
  if (rank == 0) std::printf("step 0 | held-out loss %.4f\n", initial_val);

  std::ofstream metrics;
  if (rank == 0 && !a.metrics_file.empty()) {
    metrics.open(a.metrics_file, std::ios::trunc);
    if (!metrics) throw ds::UsageError("cannot write --metrics_file " + a.metrics_file);
  }
  const int64_t tokens_per_step = config.batch.train_batch_size * a.seq_len;
  double first_loss = -1.0;
  for (int64_t step = 1; step <= a.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0.0;
    for (int64_t m = 0; m < gas; ++m) {
      auto batch = make_batch(split.train, sampler.next_micro_batch(), a.seq_len);
      auto loss = engine->forward(batch.inputs, batch.targets);
      engine->backward(loss);
      engine->step();
      loss_sum += loss.item<double>();
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // One small all-reduce per step: the loss and memory figures of every rank.
    auto stats = torch::tensor({loss_sum / static_cast<double>(gas)}, torch::kDouble);
    ds::comm::all_reduce(stats, ds::comm::ReduceOp::kAvg);
    auto mem = engine->memory_stats();
    auto mine = torch::tensor({static_cast<double>(mem.rss_bytes),
                               static_cast<double>(mem.peak_rss_bytes)}, torch::kDouble);
    auto all_mem = torch::empty({2 * world}, torch::kDouble);
    ds::comm::all_gather(all_mem, mine);
    const double loss = stats.item<double>();
    if (first_loss < 0) first_loss = loss;
    const double lr = engine->get_lr().at(0);
    const double tps = static_cast<double>(tokens_per_step) / secs;
    if (rank == 0 && (step % print_every == 0 || step == 1 || step == a.steps)) {
      std::printf("step %lld | loss %.4f | lr %.3e | tokens/s %.0f | step %.3f s | rss %.0f MiB\n",
                  static_cast<long long>(step), loss, lr, tps, secs, mem.rss_bytes / 1048576.0);
      std::fflush(stdout);
    }
    if (metrics.is_open()) {
      ds::json rss = ds::json::array(), peak = ds::json::array();
      for (int r = 0; r < world; ++r) {
        rss.push_back(static_cast<int64_t>(all_mem[2 * r].item<double>()));
        peak.push_back(static_cast<int64_t>(all_mem[2 * r + 1].item<double>()));
      }
      ds::json row = {{"step", step},
                      {"loss", loss},
                      {"lr", lr},
                      {"samples", engine->global_samples()},
                      {"tokens", engine->global_samples() * a.seq_len},
                      {"tokens_per_s", tps},
                      {"step_time_s", secs},
                      {"grad_norm", engine->get_global_grad_norm().value_or(0.0)},
                      {"rss_bytes", rss},
                      {"peak_rss_bytes", peak}};
      metrics << row.dump() << "\n";
      metrics.flush();
    }
  }
  const double final_val = held_out_loss(*engine, split.val, a, micro);
  if (rank == 0) {
    std::printf("train_gpt: done: %lld steps | first training loss %.4f | held-out loss %.4f -> "
                "%.4f\n",
                static_cast<long long>(a.steps), first_loss, initial_val, final_val);
  }
  ds::comm::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a GPT-2-style model with deepspeed-cpp"};
  Args a;
  bool deepspeed_flag = false;
  app.add_option("--deepspeed_config", a.deepspeed_config, "ds_config.json (DeepSpeed's flag)")
      ->capture_default_str();
  app.add_flag("--deepspeed", deepspeed_flag, "accepted for compatibility with DeepSpeed scripts");
  app.add_option("--steps", a.steps, "optimizer steps")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--n_layer", a.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--n_head", a.n_head, "attention heads")->capture_default_str();
  app.add_option("--n_embd", a.n_embd, "embedding width")->capture_default_str();
  app.add_option("--seq_len", a.seq_len, "tokens per sequence")->capture_default_str();
  app.add_option("--data", a.data, "UTF-8 text corpus")->capture_default_str();
  app.add_option("--seed", a.seed, "model init and data order")->capture_default_str();
  app.add_option("--metrics_file", a.metrics_file, "write one JSON object per optimizer step");
  app.add_option("--eval_batches", a.eval_batches, "held-out micro-batches per rank")
      ->capture_default_str();
  app.add_option("--local_rank", a.local_rank, "set by the launcher (LOCAL_RANK is used)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    int rank = ds::comm::is_initialized() ? ds::comm::get_rank() : 0;
    std::fprintf(stderr, "train_gpt: [rank %d] error: %s\n", rank, e.what());
    return 1;
  }
}
