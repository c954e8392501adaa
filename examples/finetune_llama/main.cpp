// finetune_llama: loads a pretrained Llama (a .gguf file or a Hugging Face folder), fine-tunes it
// on a text corpus with deepspeed-cpp, and scores, generates or exports it. Under ZeRO-3 the
// model is built inside zero::Init, each decoder layer a unit that loads its own weights.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "deepspeed/checkpointing.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/zero3.h"
#include "generation.h"
#include "gguf_file.h"
#include "llama_tokenizer.h"
#include "llama_weights.h"
#include "step_metrics.h"
#include "token_dataset.h"
#include "util/cli_checks.h"

namespace ds = deepspeed;
namespace ex = deepspeed::examples;

namespace {

struct Args {
  std::string model = std::string(DS_SOURCE_DIR) + "/data/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string deepspeed_config = std::string(DS_SOURCE_DIR) + "/examples/finetune_llama/ds_config.json";
  std::string data = std::string(DS_SOURCE_DIR) + "/data/austen.txt";
  int64_t steps = 20;
  int64_t seq_len = 128;
  int64_t seed = 1234;
  int64_t eval_batches = 4;
  std::string metrics_file, save_dir, load_dir, save_hf, score_file, prompt, generation_file;
  int64_t max_new_tokens = 32;
  double temperature = 0.0, top_p = 1.0;
  bool activation_checkpointing = false;  // each layer through checkpointing::checkpoint
  std::string lm_loss = "cross_entropy";  // the loss's form (LlamaForCausalLM::set_lm_loss)
  // LoRA (deepspeed::linear): off while lora_r is 0.
  int64_t lora_r = 0;
  double lora_alpha = 16.0;
  int64_t lora_base_weight_sharding = 1;
  std::vector<std::string> lora_target_mods;  // empty: DeepSpeed's default list
  int local_rank = -1;
};

std::string read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ds::UsageError(std::string(flag) + " " + path + ": cannot read the file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ex::LlamaTokenizer load_tokenizer(const ex::LlamaCheckpoint& ck) {
  if (ck.is_gguf) return ex::LlamaTokenizer::from_gguf(ex::GgufFile::open(ck.path));
  return ex::LlamaTokenizer::from_hf_json((std::filesystem::path(ck.path) / "tokenizer.json").string());
}

// Mean next-token loss of ids (one sequence) and the number of predicted tokens.
std::pair<double, int64_t> score(ex::LlamaForCausalLMImpl& model, const std::vector<int64_t>& ids) {
  if (ids.size() < 2) throw ds::UsageError("--score_file: fewer than 2 tokens to score");
  torch::NoGradGuard no_grad;
  // Every token goes in and the last predicts nothing (-100), as transformers scores with
  // labels=ids: the router's load-balancing loss, where there is one, sees all of them.
  auto t = torch::tensor(ids, torch::kLong).unsqueeze(0);
  const int64_t n = t.size(1) - 1;
  auto targets = torch::cat({t.slice(1, 1, n + 1), torch::full({1, 1}, -100, torch::kLong)}, 1);
  auto loss = model.forward(t, targets);
  return {loss.item<double>(), n};
}

struct Batch {
  torch::Tensor inputs, targets;
};

Batch make_batch(const std::vector<uint16_t>& tokens, const std::vector<int64_t>& windows, int64_t seq_len) {
  const auto b = static_cast<int64_t>(windows.size());
  Batch out{torch::empty({b, seq_len}, torch::kLong), torch::empty({b, seq_len}, torch::kLong)};
  ex::gather_windows(tokens, windows, seq_len, out.inputs.data_ptr<int64_t>(), out.targets.data_ptr<int64_t>());
  return out;
}

// Mean loss over the first eval_batches * micro * world held-out windows, averaged over ranks.
double held_out_loss(ex::LlamaForCausalLMImpl& model, const std::vector<uint16_t>& val,
                     const Args& a, int64_t micro) {
  const int world = ds::comm::get_world_size(), rank = ds::comm::get_rank();
  const int64_t batches = std::min<int64_t>(a.eval_batches, ex::num_windows(val.size(), a.seq_len) / (micro * world));
  if (batches <= 0) throw ds::UsageError("--data: the held-out split is too small for one batch");
  torch::NoGradGuard no_grad;
  double sum = 0.0;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<int64_t> windows;
    for (int64_t j = 0; j < micro; ++j) windows.push_back((b * micro + j) * world + rank);
    auto batch = make_batch(val, windows, a.seq_len);
    sum += model.forward(batch.inputs, batch.targets).item<double>();
  }
  auto t = torch::tensor({sum / static_cast<double>(batches)}, torch::kDouble);
  ds::comm::all_reduce(t, ds::comm::ReduceOp::kAvg);
  return t.item<double>();
}

int run(const Args& a) {
  const ds::LmLoss lm_loss = ds::parse_lm_loss(a.lm_loss, "--lm_loss");
  auto config = ds::load_config(a.deepspeed_config);
  const int rank = ds::comm::get_rank(), world = ds::comm::get_world_size();
  auto ck = ex::open_llama_checkpoint(a.model);
  if (a.lora_r > 0) {
    ds::linear::LoRAConfig lora;
    lora.lora_r = a.lora_r;
    lora.lora_alpha = a.lora_alpha;
    lora.base_weight_sharding = a.lora_base_weight_sharding;
    if (!a.lora_target_mods.empty()) lora.target_mods = a.lora_target_mods;
    ck.config.lora = lora;
  }
  const auto tokenizer = load_tokenizer(ck);
  if (tokenizer.vocab_size() > static_cast<size_t>(ck.config.vocab_size)) {
    throw ex::ModelFileError(a.model + ": the tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                             " tokens but the embedding only " + std::to_string(ck.config.vocab_size) + " rows");
  }

  torch::manual_seed(static_cast<uint64_t>(a.seed));
  // The config's activation_checkpointing section applies to the checkpointed layers.
  if (a.activation_checkpointing) ds::checkpointing::configure(nullptr, &config);
  std::shared_ptr<ex::LlamaForCausalLMImpl> model;
  {
    // Under ZeRO-3 each layer is partitioned right after it loads its weights (DeepSpeed's
    // zero.Init): no rank holds the whole model.
    std::optional<ds::zero::Init> partitioned;
    if (config.zero_optimization.stage == 3) partitioned.emplace(config);
    model = std::make_shared<ex::LlamaForCausalLMImpl>(ck.config, ck.weights);
  }
  model->model->set_activation_checkpointing(a.activation_checkpointing);
  model->set_lm_loss(lm_loss);
  // LoRA trains the adapters alone: everything else frozen (deepspeed.linear.init_lora).
  if (ck.config.lora) ds::linear::init_lora(*model);
  auto [engine, optimizer, lr_scheduler] = ds::initialize(model, config);
  engine->set_step_logging(false);  // one line per step is this program's
  if (rank == 0) {
    const auto& c = ck.config;
    const std::string scaling =
        c.rope_scaling.is_default() ? "" : " (" + c.rope_scaling.rope_type + " scaling)";
    std::printf("finetune_llama: %s: %lld layers, hidden %lld, %lld heads (%lld kv), vocab %lld, "
                "context %lld, rope theta %g%s, %d ranks, ZeRO stage %d\n",
                a.model.c_str(), (long long)c.num_hidden_layers, (long long)c.hidden_size,
                (long long)c.num_attention_heads, (long long)c.num_key_value_heads,
                (long long)c.vocab_size, (long long)c.max_position_embeddings, c.rope_theta,
                scaling.c_str(), world, config.zero_optimization.stage);
  }

  if (!a.score_file.empty()) {
    auto ids = tokenizer.encode(read_file(a.score_file, "--score_file"));
    if (static_cast<int64_t>(ids.size()) > a.seq_len) ids.resize(static_cast<size_t>(a.seq_len));
    const auto [loss, n] = score(*model, ids);
    if (rank == 0) std::printf("score: loss=%.6f tokens=%lld\n", loss, static_cast<long long>(n));
    engine.reset();
    ds::comm::destroy_process_group();
    return 0;
  }

  ex::GenerationOptions gen;
  gen.max_new_tokens = a.max_new_tokens;
  gen.temperature = a.temperature;
  gen.top_p = a.top_p;
  gen.seed = static_cast<uint64_t>(a.seed);
  gen.eos_token_id = ck.config.eos_token_id >= 0 ? ck.config.eos_token_id : tokenizer.eos_token_id();
  std::vector<int64_t> last_generation;
  const auto sample = [&](const char* when) {
    if (a.prompt.empty()) return;
    const auto prompt = tokenizer.encode(a.prompt);
    const auto t0 = std::chrono::steady_clock::now();
    if (config.hybrid_engine.enabled) {
      // DeepSpeed-Chat's actor: eval(), generate through the hybrid engine (under ZeRO-3 with
      // pin_parameters every layer is gathered once, not once per token), back to train().
      engine->eval();
      last_generation = engine->generate_with([&] { return ex::generate(*model, prompt, gen); }, 1);
      engine->train();
    } else {
      last_generation = ex::generate(*model, prompt, gen);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == 0) {
      std::printf("%s: %s%s\n", when, a.prompt.c_str(),
                  tokenizer.decode_continuation(prompt, last_generation).c_str());
      std::printf("finetune_llama: generated %zu tokens in %.3f s\n", last_generation.size(), secs);
      std::fflush(stdout);
    }
  };
  sample(a.steps > 0 ? "before fine-tuning" : "generation");

  if (!a.load_dir.empty()) {
    auto loaded = engine->load_checkpoint(a.load_dir);
    if (!loaded.load_path) throw ds::UsageError("--load_dir " + a.load_dir + ": no 'latest' checkpoint to load");
    if (rank == 0) std::printf("finetune_llama: loaded %s\n", loaded.load_path->c_str());
  }

  if (a.steps > 0) {
    const int64_t micro = config.batch.train_micro_batch_size_per_gpu;
    const int64_t gas = config.batch.gradient_accumulation_steps;
    const auto ids = tokenizer.encode(read_file(a.data, "--data"));
    std::vector<uint16_t> tokens(ids.begin(), ids.end());  // vocabularies below 65536 ids
    if (ck.config.vocab_size > 65536) throw ds::NotSupportedError("finetune_llama's data pipeline holds ids below 65536");
    auto split = ex::split_train_val(tokens, 0.05);
    ex::DistributedBatchSampler sampler(ex::num_windows(split.train.size(), a.seq_len), micro, gas,
                                        world, rank, static_cast<uint64_t>(a.seed));
    const double initial_val = held_out_loss(*model, split.val, a, micro);
    if (rank == 0) {
      std::printf("step 0 | held-out loss %.4f\n", initial_val);
      std::fflush(stdout);
    }
    std::ofstream metrics;
    if (rank == 0 && !a.metrics_file.empty()) {
      metrics.open(a.metrics_file, std::ios::trunc);
      if (!metrics) throw ds::UsageError("cannot write --metrics_file " + a.metrics_file);
    }
    const int64_t first = engine->global_steps() + 1;
    for (int64_t step = first; step <= a.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t bytes_before = ds::comm::bytes_sent();
      double loss_sum = 0.0;
      for (int64_t m = 0; m < gas; ++m) {
        auto batch = make_batch(split.train, sampler.next_micro_batch(), a.seq_len);
        auto loss = engine->forward(batch.inputs, batch.targets);
        engine->backward(loss);
        engine->step();
        loss_sum += loss.item<double>();
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // Bytes this rank sent in the step's collectives, before the metrics' own below.
      const int64_t comm_bytes = ds::comm::bytes_sent() - bytes_before;
      auto stats = torch::tensor({loss_sum / static_cast<double>(gas)}, torch::kDouble);
      ds::comm::all_reduce(stats, ds::comm::ReduceOp::kAvg);
      auto mem = engine->memory_stats();
      // Per component, one number per rank (bytes), as train_gpt's metrics file.
      const ds::json memory = deepspeed::examples::gather_memory_figures(mem);
      const double loss = stats.item<double>();
      if (!std::isfinite(loss)) throw ds::Error("step " + std::to_string(step) + ": the training loss is not finite");
      const double tps = static_cast<double>(config.batch.train_batch_size * a.seq_len) / secs;
      if (rank == 0) {
        std::printf("step %lld | loss %.4f | lr %.3e | tokens/s %.0f | step %.2f s | rss %.0f MiB\n",
                    (long long)step, loss, engine->get_lr().at(0), tps, secs, mem.rss_bytes / 1048576.0);
        std::fflush(stdout);
      }
      if (metrics.is_open()) {
        ds::json row = {{"step", step}, {"loss", loss}, {"lr", engine->get_lr().at(0)},
                        {"samples", engine->global_samples()},
                        {"tokens", engine->global_samples() * a.seq_len}, {"tokens_per_s", tps},
                        {"step_time_s", secs}, {"comm_bytes", comm_bytes},
                        {"grad_norm", engine->get_global_grad_norm().value_or(0.0)},
                        {"skipped_steps", engine->skipped_steps()},
                        {"rss_bytes", memory["rss"]}, {"peak_rss_bytes", memory["peak_rss"]},
                        {"memory_bytes", memory}};
        metrics << row.dump() << "\n";
        metrics.flush();
      }
    }
    const double final_val = held_out_loss(*model, split.val, a, micro);
    if (rank == 0) {
      std::printf("finetune_llama: held-out loss %.4f -> %.4f\n", initial_val, final_val);
      std::fflush(stdout);
    }
    if (!a.save_dir.empty()) {
      engine->save_checkpoint(a.save_dir);
      engine->commit_decoupled_checkpoint();  // checkpoint.writer.decoupled: no next step
    }
    sample("after fine-tuning");
  }

  if (!a.save_hf.empty()) {
    ex::save_hf_weights(*model, a.save_hf, rank == 0);
    if (rank == 0) {
      std::ofstream(std::filesystem::path(a.save_hf) / "tokenizer.json") << tokenizer.to_hf_json().dump();
      std::ofstream(std::filesystem::path(a.save_hf) / "tokenizer_config.json")
          << tokenizer.hf_tokenizer_config(ck.config.max_position_embeddings).dump(2) << "\n";
      std::printf("finetune_llama: wrote the Hugging Face folder %s\n", a.save_hf.c_str());
    }
  }
  if (rank == 0 && !a.generation_file.empty() && !a.prompt.empty()) {
    ds::json g = {{"prompt", a.prompt}, {"token_ids", last_generation},
                  {"text", tokenizer.decode(last_generation, true)}};
    std::ofstream out(a.generation_file);
    if (!out) throw ds::UsageError("cannot write --generation_file " + a.generation_file);
    out << g.dump() << "\n";
  }
  engine.reset();  // under ZeRO-3 the engine gathers the model back (a collective)
  ds::comm::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fine-tune a pretrained Llama model (GGUF or Hugging Face folder) with deepspeed-cpp"};
  Args a;
  bool deepspeed_flag = false;
  app.add_option("--model", a.model, ".gguf file or Hugging Face folder (config.json + *.safetensors)")
      ->capture_default_str();
  app.add_option("--deepspeed_config", a.deepspeed_config, "ds_config.json")->capture_default_str();
  app.add_flag("--deepspeed", deepspeed_flag, "accepted for compatibility with DeepSpeed scripts");
  app.add_option("--data", a.data, "UTF-8 text to fine-tune on (5% held out)")->capture_default_str();
  app.add_option("--steps", a.steps, "optimizer steps (0: load only)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seq_len", a.seq_len, "tokens per sequence")->capture_default_str()
      ->check(deepspeed::util::at_least_one());
  app.add_option("--seed", a.seed, "data order and sampling")->capture_default_str();
  app.add_option("--eval_batches", a.eval_batches, "held-out micro-batches per rank")->capture_default_str();
  app.add_option("--metrics_file", a.metrics_file, "write one JSON object per optimizer step");
  app.add_option("--save_dir", a.save_dir, "write a DeepSpeed checkpoint here after training");
  app.add_option("--load_dir", a.load_dir, "resume from <load_dir>/latest before training");
  app.add_option("--save_hf", a.save_hf, "write a Hugging Face folder (config.json, model.safetensors, "
                                         "tokenizer.json, generation_config.json)");
  app.add_option("--score_file", a.score_file, "print 'score: loss=<mean next-token loss> tokens=<n>' over "
                                               "the first --seq_len tokens of this file and exit");
  app.add_option("--prompt", a.prompt, "generate from this text before and after fine-tuning");
  app.add_option("--max_new_tokens", a.max_new_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", a.temperature, "sampling temperature (0: greedy)")->capture_default_str();
  app.add_option("--top_p", a.top_p, "nucleus sampling mass")->capture_default_str();
  app.add_option("--generation_file", a.generation_file,
                 "write the last generation as JSON (prompt, token_ids, text)");
  app.add_flag("--activation_checkpointing", a.activation_checkpointing,
               "recompute each decoder layer in backward instead of keeping its activations (the "
               "config's activation_checkpointing section applies)");
  app.add_option("--lm_loss", a.lm_loss, "cross_entropy | chunked (no fp32 [tokens, vocab] tensors) | fused (the "
                 "output projection fused into the loss: no logits)")->capture_default_str();
  app.add_option("--lora_r", a.lora_r, "LoRA rank of the adapters on the decoder projections "
                                       "(deepspeed::linear; 0: full fine-tuning)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--lora_alpha", a.lora_alpha, "LoRA scaling numerator (the adapters are scaled "
                                               "by alpha / r)")->capture_default_str();
  app.add_option("--lora_base_weight_sharding", a.lora_base_weight_sharding,
                 "1, or the world size: each rank keeps 1/world of every frozen projection weight")
      ->capture_default_str();
  app.add_option("--lora_target_mods", a.lora_target_mods,
                 "projections that get adapters (default: q_proj k_proj v_proj o_proj gate_proj "
                 "up_proj down_proj)")->delimiter(',');
  app.add_option("--local_rank", a.local_rank, "set by the launcher (LOCAL_RANK is used)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    const int rank = ds::comm::is_initialized() ? ds::comm::get_rank() : 0;
    std::fprintf(stderr, "finetune_llama: [rank %d] error: %s\n", rank, e.what());
    return 1;
  }
}
