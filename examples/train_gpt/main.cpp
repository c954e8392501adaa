// train_gpt: trains a GPT-2-style model on a real English corpus (Jane Austen's novels by
// default) with deepspeed-cpp, one process per rank:
//   deepspeed --num_gpus 2 train_gpt --deepspeed_config ds_config.json --steps 200
// Prints one line every steps_per_print steps (loss averaged over ranks, lr, gradient norm,
// tokens/s, memory, progress and the estimated time left), the held-out loss before and after
// training, and (with --metrics_file) one JSON object per optimizer step. Optional: the engine's
// DeepSpeed-format lines (--deepspeed_log), model FLOPs utilization against a device's peak
// (--peak_tflops), and loss / lr curves as a PNG (--plot, needs gnuplot). A nan/inf training loss
// on an applied step stops every rank with an error naming the step and the ranks
// (--continue_on_nonfinite_loss trains on).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "bpe_tokenizer.h"
#include "deepspeed/comms_logging.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/tensor_parallel.h"
#include "gpt_model.h"
#include "gpt_pipe.h"
#include "gpt_tensor_parallel.h"
#include "step_metrics.h"
#include "curriculum_windows.h"
#include "dynamic_documents.h"
#include "token_dataset.h"
#include "util/cli_checks.h"

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
  bool progress = false;
  bool deepspeed_log = false;
  double peak_tflops = 0.0;
  std::string plot;
  bool compact_vocab = false;
  bool exp_avg_mask = false;  // 1-bit optimizers: mask the embedding rows of unused token ids
  std::string save_dir;       // checkpoints go here (DeepSpeed layout)
  int64_t save_interval = 0;  // every N steps (and after the last); 0: after the last only
  std::string load_dir;       // resume from <load_dir>/latest
  bool continue_on_nonfinite_loss = false;  // train on after a nan/inf loss (default: stop)
  bool activation_checkpointing = false;    // each block through checkpointing::checkpoint
  double dropout = 0.0;                     // GPT-2's dropout probability (0.1 there)
  std::string lm_loss = "cross_entropy";  // the LM loss's form (GptConfig::lm_loss)
  int64_t pipeline_parallel_size = 1;  // > 1: the GPT as a PipelineModule of this many stages
  // How the pipeline cuts its layers; empty: by blocks, "type:Block" (Megatron-DeepSpeed's GPT
  // uses "type:transformer"), as "parameters" would weigh the vocabulary's embedding as a stage.
  std::string pipe_partition_method;
  deepspeed::examples::GptMoeConfig moe;  // --moe_*: MoE blocks (gpt_moe.h, docs/moe.md)
  int64_t tensor_parallel_size = 1;    // > 1: AutoTP shards attention and MLP over this many ranks
};

// Progress on rank 0: a bar with the estimated time left and the finish time, from the mean of
// the last 20 step times. Every log line ends with it; on a terminal (or with --progress) it
// also redraws in place between log lines.
class ProgressBar {
 public:
  ProgressBar(int64_t total, bool redraw) : total_(total), redraw_(redraw) {}

  void record(double step_s) {
    recent_.push_back(step_s);
    if (recent_.size() > 20) recent_.pop_front();
  }

  /// "[=====>    ] 12/200 6% | ETA 0h01m43s (finish 19:40:12)"
  std::string text(int64_t step) const {
    const double mean =
        recent_.empty() ? 0.0 : std::accumulate(recent_.begin(), recent_.end(), 0.0) / recent_.size();
    const double left_s = mean * static_cast<double>(total_ - step);
    const std::time_t finish = std::time(nullptr) + static_cast<std::time_t>(left_s);
    char when[16];
    std::strftime(when, sizeof when, "%H:%M:%S", std::localtime(&finish));
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * step / total_);
    const std::string bar = std::string(filled, '=') + (filled < kWidth ? ">" : "") +
                            std::string(std::max(0, kWidth - filled - 1), ' ');
    const long long left = static_cast<long long>(left_s);
    char out[160];
    std::snprintf(out, sizeof out, "[%s] %lld/%lld %d%% | ETA %lldh%02lldm%02llds (finish %s)",
                  bar.c_str(), static_cast<long long>(step), static_cast<long long>(total_),
                  static_cast<int>(100 * step / total_), left / 3600, left / 60 % 60, left % 60,
                  when);
    return out;
  }

  /// Between log lines: the bar alone, redrawn in place.
  void redraw(int64_t step, double loss) const {
    if (!redraw_) return;
    std::printf("\r%s | loss %.4f\033[K", text(step).c_str(), loss);
    std::fflush(stdout);
  }
  /// Wipes a redrawn bar so that a log line can take its place.
  void clear() const {
    if (redraw_) std::printf("\r\033[K");
  }

 private:
  int64_t total_;
  bool redraw_;
  std::deque<double> recent_;
};

// Model FLOPs per token of training (forward + backward), PaLM's estimate (appendix B), as
// nanoGPT's estimate_mfu: 6 N for the matmuls of N parameters (position embeddings excluded:
// a lookup; the tied token embedding is the output projection) plus 12 L C T for attention's
// q@k^T and att@v (non-causal count, as PaLM). Biases, LayerNorm, softmax and GELU are left out.
double model_flops_per_token(int64_t params, const GptConfig& c, int64_t seq_len) {
  const double n = static_cast<double>(params - c.block_size * c.n_embd);
  return 6.0 * n + 12.0 * c.n_layer * c.n_embd * static_cast<double>(seq_len);
}

// Loss (left axis) and learning rate (right axis) per optimizer step, drawn by gnuplot.
void write_plot(const std::string& png, const std::vector<int64_t>& steps,
                const std::vector<double>& losses, const std::vector<double>& lrs) {
  FILE* gp = ::popen("gnuplot 2>&1", "w");
  if (!gp) throw ds::UsageError("--plot: cannot start gnuplot");
  std::string quoted;
  for (char ch : png) quoted += ch == '\'' ? std::string("''") : std::string(1, ch);
  std::fprintf(gp,
               "set terminal pngcairo size 1000,600\nset output '%s'\n"
               "set xlabel 'optimizer step'\nset ylabel 'training loss'\n"
               "set y2label 'learning rate'\nset ytics nomirror\nset y2tics\nset grid\n"
               "$data << EOD\n",
               quoted.c_str());
  for (size_t i = 0; i < steps.size(); ++i) {
    std::fprintf(gp, "%lld %.6g %.6g\n", static_cast<long long>(steps[i]), losses[i], lrs[i]);
  }
  std::fprintf(gp,
               "EOD\nplot $data using 1:2 with lines lw 2 title 'loss' axes x1y1, "
               "$data using 1:3 with lines lw 2 dt 2 title 'lr' axes x1y2\n");
  const int status = ::pclose(gp);
  if (status != 0) {
    throw ds::UsageError("--plot: gnuplot failed (exit status " + std::to_string(status) +
                         "); is it installed? (Debian: apt-get install gnuplot-nox)");
  }
}

// --compact_vocab: renumbers the ids to the corpus's distinct tokens (in ascending id order) and
// returns how many there are. A small corpus uses about a thousand of GPT-2's 50257 ids; the
// embedding and the tied output layer then shrink to those rows, which makes a tiny model
// 20-40x cheaper per step (quick experiments, e2e tests). The tokens' meaning is unchanged.
int64_t compact_vocabulary(std::vector<uint16_t>& tokens) {
  std::vector<uint16_t> ids(tokens);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (auto& t : tokens) {
    t = static_cast<uint16_t>(std::lower_bound(ids.begin(), ids.end(), t) - ids.begin());
  }
  return static_cast<int64_t>(ids.size());
}

// --exp_avg_mask: DeepSpeed's exp_avg_mask for the tied token embedding (vocab x n_embd): 1 on
// the rows of token ids that occur in the training split, 0 on the others. Those rows only get
// the output softmax's small push-down gradient, and after a 1-bit optimizer's freeze their
// compressed momentum would be +-(the whole tensor's scale) over a tiny frozen variance (Note
// [Momentum mask] in the library); masked, they keep a zero momentum, as DeepSpeed's BERT
// example does for position embeddings beyond the trained sequence length.
torch::Tensor unused_token_mask(const std::vector<uint16_t>& train, int64_t vocab_size,
                                int64_t n_embd) {
  auto used = torch::zeros({vocab_size}, torch::kFloat);
  float* u = used.data_ptr<float>();
  for (uint16_t t : train) u[t] = 1.0f;
  return used.unsqueeze(1).expand({vocab_size, n_embd}).contiguous();
}

// The param groups for --exp_avg_mask: the token embedding in a group of its own with its mask
// (DeepSpeed's masks are per group), everything else in the other.
std::vector<ds::ParamGroup> masked_embedding_groups(deepspeed::examples::GptImpl& model,
                                                    const torch::Tensor& mask) {
  ds::ParamGroup rest, embedding;
  for (auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    (item.key() == "wte.weight" ? embedding : rest).params.push_back(item.value());
  }
  embedding.exp_avg_mask = mask;
  return {rest, embedding};
}

struct Batch {
  torch::Tensor inputs, targets;
};

// The sequence length this step trains on: a "seqlen" curriculum's current difficulty (the
// engine updates it at each training forward / train_batch), at most --seq_len.
int64_t curriculum_seq_len(ds::Engine& engine, int64_t seq_len) {
  const ds::CurriculumScheduler* c = engine.curriculum_scheduler_legacy();
  if (c == nullptr || c->config().curriculum_type != "seqlen") return seq_len;
  return std::min(seq_len, c->get_current_difficulty());
}

// Tokens trained on in global steps 1..steps, replaying the engine's curriculum (a resumed run
// counts its earlier steps at the lengths they had).
int64_t tokens_before(const ds::DeepSpeedConfig& config, int64_t steps, int64_t seq_len) {
  const auto& cl = config.curriculum_learning;
  const int64_t batch = config.batch.train_batch_size;
  if (!cl.enabled || cl.curriculum_type != "seqlen" || cl.schedule_type == "custom") {
    return batch * seq_len * steps;
  }
  ds::CurriculumScheduler replay(cl);
  int64_t tokens = 0;
  for (int64_t t = 1; t <= steps; ++t) {
    tokens += batch * std::min(seq_len, replay.update_difficulty(t));
  }
  return tokens;
}

Batch make_batch(const std::vector<uint16_t>& tokens, const std::vector<int64_t>& windows,
                 int64_t seq_len) {
  const int64_t b = static_cast<int64_t>(windows.size());
  Batch out{torch::empty({b, seq_len}, torch::kLong), torch::empty({b, seq_len}, torch::kLong)};
  deepspeed::examples::gather_windows(tokens, windows, seq_len, out.inputs.data_ptr<int64_t>(),
                                      out.targets.data_ptr<int64_t>());
  return out;
}

// Mean loss over the first eval_batches * micro * dp validation windows, all data-parallel
// replicas together (replica r takes every dp-th window; tensor-parallel peers read the same
// ones, as their layers need), averaged across ranks.
double held_out_loss(ds::ModuleEngine<deepspeed::examples::GptImpl>& engine,
                     const std::vector<uint16_t>& val, const Args& a, int64_t micro) {
  const int world = engine.data_parallel_group().size(), rank = engine.dp_rank();
  const int64_t available = deepspeed::examples::num_windows(val.size(), a.seq_len);
  const int64_t batches = std::min<int64_t>(a.eval_batches, available / (micro * world));
  if (batches <= 0) throw ds::UsageError("the validation split is too small for one eval batch");
  torch::NoGradGuard no_grad;
  // Evaluation draws from the generator too (MoE's second-expert sampling): it runs on a copy of
  // the generator's state, so training after it is the same as without it (exact resume).
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng_state = gen.get_state();
  engine.eval();
  // The module is called directly (no training timers); torch_autocast still applies, as to
  // every forward through DeepSpeed's engine.
  std::optional<ds::AutocastScope> autocast;
  if (auto dtype = engine.torch_autocast_dtype()) autocast.emplace(engine.device().type(), *dtype);
  double sum = 0.0;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<int64_t> windows;
    for (int64_t j = 0; j < micro; ++j) windows.push_back((b * micro + j) * world + rank);
    auto batch = make_batch(val, windows, a.seq_len);
    sum += engine.typed_module()
               .forward(batch.inputs.to(engine.device()), batch.targets.to(engine.device()))
               .item<double>();
  }
  engine.train();
  gen.set_state(rng_state);
  auto t = torch::tensor({sum / static_cast<double>(batches)}, torch::kDouble);
  ds::comm::all_reduce(t, ds::comm::ReduceOp::kAvg);
  return t.item<double>();
}

// held_out_loss for the pipeline: eval_batch over the same windows, each data-parallel replica
// taking every dp-th window (the first and last stages read them; the loss reaches every rank).
double pipeline_held_out_loss(ds::pipe::PipelineEngine& engine, const std::vector<uint16_t>& val,
                              const Args& a, int64_t micro, int64_t gas) {
  const auto& groups = engine.pipeline_module().groups();
  const int dp = groups.data().size(), dp_rank = groups.coord("data");
  const int64_t available = deepspeed::examples::num_windows(val.size(), a.seq_len);
  const int64_t calls = std::min<int64_t>(std::max<int64_t>(1, a.eval_batches / gas),
                                          available / (micro * gas * dp));
  if (calls <= 0) {
    throw ds::UsageError("the validation split is too small for one pipeline eval batch (" +
                         std::to_string(micro * gas * dp) + " windows of " +
                         std::to_string(a.seq_len) + " tokens)");
  }
  // As held_out_loss: on a copy of the generator's state (MoE's sampling draws from it).
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng_state = gen.get_state();
  double sum = 0.0;
  int64_t b = 0;
  for (int64_t c = 0; c < calls; ++c) {
    sum += engine.eval_batch([&]() {
      std::vector<int64_t> windows;
      for (int64_t j = 0; j < micro; ++j) windows.push_back((b * micro + j) * dp + dp_rank);
      ++b;
      auto batch = make_batch(val, windows, a.seq_len);
      return ds::pipe::MicroBatch{batch.inputs, batch.targets};
    }).item<double>();
  }
  gen.set_state(rng_state);
  return sum / static_cast<double>(calls);
}

// Every rank's own loss of `step` (one all-gather, on the way out only), naming the ranks whose
// loss was not finite.
std::string non_finite_loss_message(int64_t step, double mine, int world) {
  auto all = torch::empty({world}, torch::kDouble);
  ds::comm::all_gather(all, torch::tensor({mine}, torch::kDouble));
  std::ostringstream ranks, losses;
  int bad = 0;
  for (int r = 0; r < world; ++r) {
    const double v = all[r].item<double>();
    if (!std::isfinite(v)) ranks << (bad++ ? ", " : "") << r;
    losses << (r ? ", " : "") << "rank " << r << ": " << (std::isnan(v) ? "nan" : std::to_string(v));
  }
  std::ostringstream os;
  os << "step " << step << ": the training loss is not finite on rank" << (bad > 1 ? "s " : " ")
     << ranks.str() << " (" << losses.str()
     << "); the optimizer step was applied, so the weights are now unusable. Training diverged "
        "or the data holds a bad value: lower the optimizer's lr, set gradient_clipping, or "
        "pass --continue_on_nonfinite_loss to train on";
  return os.str();
}

int run(const Args& a) {
  // A pipeline's batch sizes count its data-parallel replicas (world / stages): its config is
  // read once the module (and its groups) exist.
  const bool pipelined = a.pipeline_parallel_size > 1;
  const int tp = static_cast<int>(a.tensor_parallel_size);
  if (a.exp_avg_mask && (pipelined || tp > 1)) {
    throw ds::UsageError("--exp_avg_mask masks the data-parallel GPT's embedding; it does not "
                         "combine with --pipeline_parallel_size or --tensor_parallel_size");
  }
  if (!a.pipe_partition_method.empty() && !pipelined) {
    throw ds::UsageError("--pipe_partition_method needs --pipeline_parallel_size > 1");
  }
  const ds::LmLoss lm_loss = ds::parse_lm_loss(a.lm_loss, "--lm_loss");
  if (pipelined && lm_loss == ds::LmLoss::kFused) {
    throw ds::UsageError("--lm_loss fused: the pipeline's head is its own stage layer; use "
                         "--lm_loss chunked with --pipeline_parallel_size");
  }
  ds::DeepSpeedConfig config;
  if (pipelined || tp > 1) {
    ds::comm::init_distributed();
  } else {
    config = ds::load_config(a.deepspeed_config);
  }
  const int rank = ds::comm::get_rank(), world = ds::comm::get_world_size();

  // Rank 0 tokenizes (and caches) first; the others then read the cache.
  auto tokenizer = BpeTokenizer::from_default_files();
  std::vector<uint16_t> tokens;
  if (rank == 0) tokens = deepspeed::examples::load_or_build_token_cache(tokenizer, a.data);
  ds::comm::barrier();
  if (rank != 0) tokens = deepspeed::examples::load_or_build_token_cache(tokenizer, a.data);
  // Per token of the stream, whether its text holds a line break: dynamic batching's documents
  // end there (read before --compact_vocab renumbers the ids).
  std::vector<bool> ends_line(tokens.size());
  {
    std::vector<bool> by_id(tokenizer.vocab_size());
    for (size_t id = 0; id < by_id.size(); ++id) {
      by_id[id] = tokenizer.decode({static_cast<int32_t>(id)}).find('\n') != std::string::npos;
    }
    for (size_t t = 0; t < tokens.size(); ++t) ends_line[t] = by_id.at(tokens[t]);
  }
  const int64_t vocab_size = a.compact_vocab ? compact_vocabulary(tokens)
                                             : static_cast<int64_t>(tokenizer.vocab_size());
  auto split = deepspeed::examples::split_train_val(tokens, a.val_fraction);
  ends_line.resize(split.train.size());  // the training split is the stream's first part

  torch::manual_seed(static_cast<uint64_t>(a.seed));
  GptConfig gcfg;
  gcfg.vocab_size = vocab_size;
  gcfg.block_size = a.seq_len;
  gcfg.n_layer = a.n_layer;
  gcfg.n_head = a.n_head;
  gcfg.n_embd = a.n_embd;
  gcfg.dropout = a.dropout;
  gcfg.lm_loss = lm_loss;
  gcfg.moe = a.moe;
  // sparse_attention: DeepSpeed's block-sparse attention in every block (read from the file
  // here: a pipeline's stages are built before the engine's config is).
  gcfg.sparse_attention = ds::sparse_attention::read_sparse_attention_config(a.deepspeed_config);
  gcfg.sparse_attention_seed = a.seed;
  if (gcfg.sparse_attention && a.seq_len % gcfg.sparse_attention->block != 0) {
    throw ds::UsageError("train_gpt: --seq_len " + std::to_string(a.seq_len) +
                         " is not a multiple of sparse_attention.block " +
                         std::to_string(gcfg.sparse_attention->block));
  }
  // A pipeline checkpoints its layers itself (activation_checkpoint_interval 1: each block).
  gcfg.activation_checkpointing = a.activation_checkpointing && !pipelined;
  // Under ZeRO-3 the blocks are partitioned as they are built (DeepSpeed's zero.Init), so no
  // rank ever holds the whole model.
  std::shared_ptr<deepspeed::examples::GptImpl> model;
  ds::compression::CompressionConfig compression;  // compression_training (non-pipeline runs)
  std::shared_ptr<ds::ModuleEngine<deepspeed::examples::GptImpl>> dp_engine;
  std::shared_ptr<ds::pipe::PipelineEngine> pp_engine;
  int64_t num_parameters = 0;
  int replicas = world, replica = rank;  // data-parallel size and index: who reads which batch
  if (pipelined) {
    // --pipeline_parallel_size P: embedding | blocks | ln_f | tied head.
    ds::pipe::PipelineModuleOptions po;
    po.num_stages = static_cast<int>(a.pipeline_parallel_size);
    po.partition_method = a.pipe_partition_method.empty() ? "type:Block" : a.pipe_partition_method;
    po.loss_fn = gcfg.lm_loss == ds::LmLoss::kChunked
                     ? deepspeed::examples::gpt_pipeline_chunked_loss
                     : deepspeed::examples::gpt_pipeline_loss;
    po.seed_layers = true;
    po.base_seed = a.seed;
    po.activation_checkpoint_interval = a.activation_checkpointing ? 1 : 0;
    po.aux_loss_coef = a.moe.aux_loss_coef;  // MoE blocks: each stage trains its gates
    if (tp > 1) {  // 3D: pipe P x model T x data world / (P T); AutoTP inside each stage
      deepspeed::examples::check_gpt_tensor_parallel(gcfg, tp);
      po.topology = deepspeed::examples::gpt_parallel_topology(po.num_stages, tp);
      po.num_stages = 0;
    }
    auto module = std::make_shared<ds::pipe::PipelineModule>(
        deepspeed::examples::gpt_pipeline_specs(gcfg), po);
    config = ds::load_config(a.deepspeed_config, module->mpu().get());
    if (tp > 1) deepspeed::examples::request_autotp(&config, tp);
    if (ds::compression::compression_config(config).any_enabled()) {
      throw ds::UsageError("train_gpt: compression_training with --pipeline_parallel_size is not "
                           "supported (the stages' layers are built by the PipelineModule)");
    }
    // The config's activation_checkpointing section applies to the checkpointed layers.
    if (a.activation_checkpointing) ds::checkpointing::configure(module->mpu().get(), &config);
    pp_engine = ds::pipe::initialize(module, config);
    replicas = module->groups().data().size();
    replica = module->groups().coord("data");
    // Every stage's parameters once (the tied copies after the first stage left out).
    double mine = 0.0;
    for (const auto& p : module->parameters()) {  // a tensor-parallel shard is 1/T of its weight
      mine += static_cast<double>(p.numel()) * (ds::tensor_parallel::is_tensor_parallel(p) ? tp : 1);
    }
    for (const auto& p : module->replicated_tied_parameters()) mine -= static_cast<double>(p.numel());
    auto t = torch::tensor({mine}, torch::kDouble);
    ds::comm::all_reduce(t, ds::comm::ReduceOp::kSum, false, module->groups().pipe());
    num_parameters = static_cast<int64_t>(t.item<double>());
  } else {
    // --tensor_parallel_size T: groups pipe 1 x model T x data world / T; the engine's AutoTP
    // (tensor_parallel.autotp_size) shards the GPT's attention and MLP.
    std::shared_ptr<ds::TopologyMpu> mpu;
    if (tp > 1) {
      deepspeed::examples::check_gpt_tensor_parallel(gcfg, tp);
      mpu = deepspeed::examples::gpt_parallel_mpu(1, tp);
      config = ds::load_config(a.deepspeed_config, mpu.get());
      deepspeed::examples::request_autotp(&config, tp);
      replicas = mpu->groups().data().size();
      replica = mpu->groups().coord("data");
    }
    if (a.activation_checkpointing) ds::checkpointing::configure(mpu.get(), &config);
    {
      std::optional<ds::zero::Init> partitioned;
      if (config.zero_optimization.stage == 3) partitioned.emplace(config);
      model = std::make_shared<deepspeed::examples::GptImpl>(gcfg);
    }
    if (tp > 1) num_parameters = model->num_parameters();  // the full model, before AutoTP
    // compression_training: DeepSpeed's init_compression before the engine is built (the
    // optimizer must see the topk scores); redundancy_clean after training, below.
    compression = ds::compression::compression_config(config);
    if (compression.any_enabled()) ds::compression::init_compression(*model, compression);
    if (a.exp_avg_mask) {
      const auto mask = unused_token_mask(split.train, vocab_size, a.n_embd);
      if (rank == 0) {
        std::printf("train_gpt: exp_avg_mask: %lld of %lld token ids occur in the training "
                    "split; the other rows of wte keep a zero momentum after the 1-bit freeze\n",
                    static_cast<long long>(mask.select(1, 0).sum().item<double>()),
                    static_cast<long long>(vocab_size));
      }
      dp_engine = ds::initialize(model, config, masked_embedding_groups(*model, mask)).engine;
    } else {
      dp_engine = ds::initialize(model, config, nullptr, nullptr, mpu).engine;
    }
    if (tp <= 1) num_parameters = model->num_parameters();
    // sequence_parallel_size P: each sample's tokens split over P consecutive ranks, which read
    // the same windows (the model keeps its chunk of them).
    if (dp_engine->sequence_parallel_size() > 1) {
      model->set_sequence_parallel_group(dp_engine->sequence_parallel_group());
      replicas = dp_engine->data_parallel_group().size();
      replica = dp_engine->dp_rank();
    }
  }
  ds::Engine* engine = pp_engine ? static_cast<ds::Engine*>(pp_engine.get()) : dp_engine.get();
  const int64_t micro = config.batch.train_micro_batch_size_per_gpu;
  const int64_t gas = config.batch.gradient_accumulation_steps;
  // One readable line per print interval is this program's (below); DeepSpeed's lines on request.
  engine->set_step_logging(a.deepspeed_log);
  const auto eval_loss = [&] {
    return pp_engine ? pipeline_held_out_loss(*pp_engine, split.val, a, micro, gas)
                     : held_out_loss(*dp_engine, split.val, a, micro);
  };

  DistributedBatchSampler sampler(deepspeed::examples::num_windows(split.train.size(), a.seq_len),
                                  micro, gas, replicas, replica, static_cast<uint64_t>(a.seed));
  // data_efficiency.data_sampling's curriculum draws the windows instead (before the resume:
  // the engine's checkpoints restore its sampler).
  // In a pipeline the first and last stages read the micro-batches: their samplers draw alike
  // (same seed, same calls), each over its stage's data-parallel group.
  const auto curriculum =
      deepspeed::examples::CurriculumWindows::create(*engine, split.train, a.seq_len);
  // data_efficiency.data_sampling.dynamic_batching: documents packed by length instead.
  std::unique_ptr<deepspeed::examples::DynamicDocuments> documents;
  if (ds::data_sampling::dynamic_batching_config(engine->config()).enabled) {
    if (pp_engine || curriculum || replicas != world / std::max<int64_t>(1, tp)) {
      throw ds::UsageError(
          "train_gpt: data_efficiency.data_sampling.dynamic_batching packs documents of "
          "different lengths; it does not combine with --pipeline_parallel_size, sequence "
          "parallelism or the data_sampling curriculum here");
    }
    documents = deepspeed::examples::DynamicDocuments::create(*dp_engine, split.train,
                                                              ends_line, a.seq_len);
  }
  const int64_t print_every = config.steps_per_print.value_or(10);
  if (rank == 0) {
    // With pipeline or tensor parallelism only the data-parallel replicas read their own batches.
    const std::string ranks = replicas == world ? std::to_string(world) + " ranks"
                                                : std::to_string(world) + " ranks, " +
                                                      std::to_string(replicas) + " data-parallel";
    std::printf("train_gpt: %s: %zu tokens (%zu train, %zu held out), %lld params, "
                "%s x micro-batch %lld x accumulation %lld = %lld sequences of %lld tokens "
                "per step\n",
                a.data.c_str(), tokens.size(), split.train.size(), split.val.size(),
                static_cast<long long>(num_parameters), ranks.c_str(),
                static_cast<long long>(micro), static_cast<long long>(gas),
                static_cast<long long>(config.batch.train_batch_size),
                static_cast<long long>(a.seq_len));
    if (documents) {
      std::printf("train_gpt: dynamic batching: %lld documents of 8 to %lld tokens (cut at line "
                  "ends), packed into micro-batches of at most %lld tokens\n",
                  static_cast<long long>(documents->num_documents()),
                  static_cast<long long>(a.seq_len),
                  static_cast<long long>(
                      ds::data_sampling::dynamic_batching_config(config).max_tokens));
    }
  }
  // Resume: the engine restores weights, optimizer, schedule, counters and RNG; the data order
  // comes back from the sampler position saved as client state (or, in a checkpoint without
  // it, from the step count).
  int64_t first_step = 1;
  if (!a.load_dir.empty()) {
    auto loaded = pp_engine ? pp_engine->load_checkpoint(a.load_dir)
                            : dp_engine->load_checkpoint(a.load_dir);
    // The engine, as DeepSpeed, only warns when there is no `latest` to load; a resume that
    // went on from scratch would then overwrite the real checkpoints in --save_dir.
    if (!loaded.load_path) {
      throw ds::UsageError(
          "--load_dir " + a.load_dir + ": nothing to resume from: " +
          (std::filesystem::is_directory(a.load_dir)
               ? "it has no 'latest' file (" + a.load_dir + "/latest names the tag to resume)"
               : "the directory does not exist (looked for " + a.load_dir + "/latest)") +
          "; fix the path, or leave --load_dir out to train from scratch. Nothing was trained "
          "or saved");
    }
    const auto& cs = loaded.client_state;
    if (cs.contains("sampler_epoch") && cs.contains("sampler_windows")) {
      // Windows of the epoch already trained on, all ranks together: a job resumed on another
      // data-parallel size (an elastic config keeps the global batch) goes on where it stopped.
      const int64_t windows = cs.at("sampler_windows").toInt();
      const int64_t per_micro_batch = micro * replicas;
      if (windows % per_micro_batch != 0) {
        throw ds::UsageError(
            "--load_dir " + a.load_dir + ": the checkpoint stopped " + std::to_string(windows) +
            " windows into its epoch, which is not a whole number of micro-batches of " +
            std::to_string(micro) + " x " + std::to_string(replicas) +
            " data-parallel replicas; resume with a batch that divides it (elasticity keeps "
            "the global batch across data-parallel sizes)");
      }
      sampler.set_position(cs.at("sampler_epoch").toInt(), windows / per_micro_batch);
    } else if (cs.contains("sampler_epoch") && cs.contains("sampler_micro_batch")) {
      sampler.set_position(cs.at("sampler_epoch").toInt(), cs.at("sampler_micro_batch").toInt());
    } else {  // another trainer's (Python DeepSpeed's): past the batches its steps consumed
      const int64_t consumed = engine->global_steps() * gas;
      sampler.set_position(consumed / sampler.micro_batches_per_epoch(),
                           consumed % sampler.micro_batches_per_epoch());
    }
    // Dynamic batching's loader yields the same batches every epoch: past the steps trained.
    if (documents) documents->skip(engine->global_steps() * gas);
    first_step = engine->global_steps() + 1;
    if (rank == 0) {
      std::printf("train_gpt: resumed from %s at step %lld\n", loaded.load_path->c_str(),
                  static_cast<long long>(first_step - 1));
    }
  }
  const auto save = [&] {
    const ds::ClientState state{
        {"sampler_epoch", c10::IValue(sampler.epoch())},
        {"sampler_micro_batch", c10::IValue(sampler.micro_batch_in_epoch())},
        {"sampler_windows", c10::IValue(sampler.micro_batch_in_epoch() * micro * replicas)}};
    if (pp_engine) {
      pp_engine->save_checkpoint(a.save_dir, std::nullopt, state);
    } else {
      dp_engine->save_checkpoint(a.save_dir, std::nullopt, state);
    }
  };
  const double initial_val = eval_loss();
  if (rank == 0) std::printf("step 0 | held-out loss %.4f\n", initial_val);

  std::ofstream metrics;
  if (rank == 0 && !a.metrics_file.empty()) {
    metrics.open(a.metrics_file, std::ios::trunc);
    if (!metrics) throw ds::UsageError("cannot write --metrics_file " + a.metrics_file);
  }
  const double flops_per_token = model_flops_per_token(num_parameters, gcfg, a.seq_len);
  if (rank == 0 && a.peak_tflops > 0) {
    std::printf("train_gpt: MFU against %.1f TFLOP/s per device; model FLOPs per token "
                "6N + 12LCT = %.2f MFLOP\n", a.peak_tflops, flops_per_token / 1e6);
  }
  std::unique_ptr<ProgressBar> bar;
  if (rank == 0) {
    bar = std::make_unique<ProgressBar>(a.steps, a.progress || ::isatty(STDOUT_FILENO));
  }
  // Fail before training, not after it.
  if (rank == 0 && !a.plot.empty() && std::system("gnuplot --version > /dev/null 2>&1") != 0) {
    throw ds::UsageError("--plot needs gnuplot (Debian: apt-get install gnuplot-nox)");
  }
  std::vector<int64_t> plot_steps;
  std::vector<double> plot_losses, plot_lrs;
  double first_loss = -1.0;
  // A checkpoint already at --steps leaves nothing to train; --save_dir then writes what was
  // loaded, as it stands (re-saving another trainer's checkpoint in train_gpt's own files).
  if (first_step > a.steps && !a.save_dir.empty()) {
    if (rank == 0) {
      std::printf("train_gpt: nothing to train (the checkpoint is at step %lld, --steps %lld); "
                  "saving it to %s\n",
                  static_cast<long long>(first_step - 1), static_cast<long long>(a.steps),
                  a.save_dir.c_str());
    }
    save();
  }
  int64_t tokens_seen = tokens_before(config, first_step - 1, a.seq_len);
  if (documents) {
    tokens_seen = 0;
    for (int64_t t = 1; t < first_step; ++t) tokens_seen += documents->tokens_of_step(t);
  }
  for (int64_t step = first_step; step <= a.steps; ++step) {
    // With --deepspeed_log the engine prints its lines in step() at steps_per_print.
    if (bar && step % print_every == 0) bar->clear();
    auto t0 = std::chrono::steady_clock::now();
    const int64_t bytes_before = ds::comm::bytes_sent();
    double loss_sum = 0.0;
    double aux_sum = 0.0;  // the MoE layers' load-balancing losses over the micro-steps
    const int64_t skipped_before = engine->skipped_steps();
    int64_t step_seq_len = a.seq_len;
    if (pp_engine) {
      // The first and last stages read the micro-batches; the loss (the last stage's, averaged
      // over the micro-batches and replicas) comes back on every stage.
      const double loss = pp_engine->train_batch([&]() {
        auto batch = make_batch(
            split.train, curriculum ? curriculum->next_micro_batch() : sampler.next_micro_batch(),
            a.seq_len);
        // A "seqlen" curriculum: the pipeline engine passes no kwargs, so the batch is cut to
        // this step's length here (Megatron-DeepSpeed's way); train_batch set it.
        step_seq_len = curriculum_seq_len(*pp_engine, a.seq_len);
        return ds::pipe::MicroBatch{batch.inputs.slice(1, 0, step_seq_len),
                                    batch.targets.slice(1, 0, step_seq_len)};
      }).item<double>();
      loss_sum = loss * static_cast<double>(gas);
      aux_sum = pp_engine->agg_aux_loss() * static_cast<double>(gas);
    } else {
      for (int64_t m = 0; m < gas; ++m) {
        Batch batch;
        if (documents) {
          auto mb = documents->next_micro_batch();
          batch = Batch{mb.inputs, mb.targets};
        } else {
          batch = make_batch(split.train,
                             curriculum ? curriculum->next_micro_batch()
                                        : sampler.next_micro_batch(),
                             a.seq_len);
        }
        auto loss = dp_engine->forward(batch.inputs, batch.targets);
        step_seq_len = documents ? batch.inputs.size(1)  // the batch's longest document
                                 : curriculum_seq_len(*dp_engine, a.seq_len);  // what it trained on
        dp_engine->backward(loss);
        dp_engine->step();
        loss_sum += loss.item<double>();
        aux_sum += model->last_moe_aux_loss();
      }
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Bytes this rank sent in the step's collectives (Note [Sent bytes]), before the metrics'
    // own all-reduce below.
    const int64_t comm_bytes = ds::comm::bytes_sent() - bytes_before;
    // One small all-reduce per step: the loss and memory figures of every rank.
    auto stats = torch::tensor({loss_sum / static_cast<double>(gas),
                                aux_sum / static_cast<double>(gas)}, torch::kDouble);
    ds::comm::all_reduce(stats, ds::comm::ReduceOp::kAvg);
    auto mem = engine->memory_stats();
    // Per component, one number per rank (bytes); rss and peak also under their old keys.
    const ds::json memory = deepspeed::examples::gather_memory_figures(mem);
    const double loss = stats[0].item<double>();
    const double moe_aux_loss = stats[1].item<double>();
    // The averaged loss is the same on every rank, so all of them stop together. A step the
    // engine skipped (fp16 overflow, bf16 check_grad_overflow) changed nothing and said so.
    if (!std::isfinite(loss) && engine->skipped_steps() == skipped_before &&
        !a.continue_on_nonfinite_loss) {
      throw ds::Error(non_finite_loss_message(step, loss_sum / static_cast<double>(gas), world));
    }
    if (first_loss < 0) first_loss = loss;
    const double lr = engine->get_lr().at(0);
    const int64_t tokens_per_step = documents ? documents->tokens_of_step(step)
                                              : config.batch.train_batch_size * step_seq_len;
    tokens_seen += tokens_per_step;
    const double tps = static_cast<double>(tokens_per_step) / secs;
    // Achieved model FLOP/s per device over its peak.
    const double mfu =
        a.peak_tflops > 0 ? flops_per_token * tps / world / (a.peak_tflops * 1e12) : 0.0;
    const bool log_line = step % print_every == 0 || step == first_step || step == a.steps;
    if (bar) bar->record(secs);
    if (rank == 0 && log_line) {
      bar->clear();
      std::printf("step %lld | loss %.4f | lr %.3e", static_cast<long long>(step), loss, lr);
      if (a.moe.enabled()) std::printf(" | moe_aux_loss %.4f", moe_aux_loss);
      if (auto norm = engine->get_global_grad_norm()) std::printf(" | grad_norm %.4f", *norm);
      if (engine->skipped_steps() > 0) {
        std::printf(" | skipped %lld", static_cast<long long>(engine->skipped_steps()));
      }
      if (engine->loss_scale() != 1.0) std::printf(" | loss_scale %g", engine->loss_scale());
      std::printf(" | tokens/s %.0f | step %.3f s | rss %.0f MiB", tps, secs,
                  mem.rss_bytes / 1048576.0);
      if (a.peak_tflops > 0) std::printf(" | mfu %.2f%%", 100.0 * mfu);
      std::printf(" | %s\n", bar->text(step).c_str());
      std::fflush(stdout);
    } else if (bar) {
      bar->redraw(step, loss);
    }
    if (rank == 0 && !a.plot.empty()) {
      plot_steps.push_back(step);
      plot_losses.push_back(loss);
      plot_lrs.push_back(lr);
    }
    if (metrics.is_open()) {
      const ds::json rss = memory["rss"], peak = memory["peak_rss"];
      ds::json row = {{"step", step},
                      {"loss", loss},
                      {"lr", lr},
                      {"samples", engine->global_samples()},
                      {"tokens", tokens_seen},
                      {"seq_len", step_seq_len},
                      {"tokens_per_s", tps},
                      {"step_time_s", secs},
                      {"comm_bytes", comm_bytes},
                      {"grad_norm", engine->get_global_grad_norm().value_or(0.0)},
                      {"skipped_steps", engine->skipped_steps()},
                      {"rss_bytes", rss},
                      {"peak_rss_bytes", peak},
                      {"memory_bytes", memory}};
      if (a.peak_tflops > 0) row["mfu"] = mfu;
      if (a.moe.enabled()) row["moe_aux_loss"] = moe_aux_loss;
      if (const ds::RandomLtdScheduler* ltd = engine->random_ltd_scheduler()) {
        // The tokens the dropping blocks kept this step, and DeepSpeed's running layer-token
        // count (what Megatron-DeepSpeed's token-based LR decay reads).
        row["random_ltd_seq"] = ltd->get_current_seq();
        row["consumed_layer_tokens"] = ltd->consumed_layer_tokens();
      }
      if (curriculum) row["curriculum_difficulty"] = curriculum->difficulties();
      if (documents) row["sequences"] = documents->sequences_of_step(step);
      metrics << row.dump() << "\n";
      metrics.flush();
    }
    if (!a.save_dir.empty() &&
        (step == a.steps || (a.save_interval > 0 && step % a.save_interval == 0))) {
      if (bar) bar->clear();
      save();
    }
  }
  // checkpoint.writer.decoupled: the last save has no next step to commit it.
  engine->commit_decoupled_checkpoint();
  const double final_val = eval_loss();
  if (rank == 0) {
    std::printf("train_gpt: done: %lld steps | first training loss %.4f | held-out loss %.4f -> "
                "%.4f\n",
                static_cast<long long>(a.steps), first_loss, initial_val, final_val);
  }
  if (compression.any_enabled() && model) {
    // The masks multiplied in and pruned rows cut out (with related_modules): the model as it
    // would be exported, scored again.
    const int64_t before = model->num_parameters();
    ds::compression::redundancy_clean(*model, compression);
    const double cleaned_val = eval_loss();
    if (rank == 0) {
      std::printf("train_gpt: redundancy_clean: %lld -> %lld parameters | held-out loss %.4f\n",
                  static_cast<long long>(before), static_cast<long long>(model->num_parameters()),
                  cleaned_val);
    }
  }
  if (rank == 0) {
    if (!a.plot.empty()) {
      write_plot(a.plot, plot_steps, plot_losses, plot_lrs);
      std::printf("train_gpt: wrote loss and lr curves to %s\n", a.plot.c_str());
    }
  }
  // As DeepSpeed's example scripts call deepspeed.comm.log_summary(): with comms_logger
  // enabled, rank 0 prints the table of this run's collectives (every rank takes part).
  if (ds::comm::comms_logger_config().enabled) ds::comm::log_summary();
  // The engine first: under ZeRO-3 it gathers the model back (a collective) as it goes.
  dp_engine.reset();
  pp_engine.reset();
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
      ->check(deepspeed::util::at_least_one());
  app.add_option("--n_layer", a.n_layer, "transformer blocks")->capture_default_str();
  app.add_option("--n_head", a.n_head, "attention heads")->capture_default_str();
  app.add_option("--n_embd", a.n_embd, "embedding width")->capture_default_str();
  app.add_option("--seq_len", a.seq_len, "tokens per sequence")->capture_default_str();
  app.add_option("--data", a.data, "UTF-8 text corpus")->capture_default_str();
  app.add_option("--seed", a.seed, "model init and data order")->capture_default_str();
  app.add_option("--metrics_file", a.metrics_file, "write one JSON object per optimizer step");
  app.add_option("--eval_batches", a.eval_batches, "held-out micro-batches per rank")
      ->capture_default_str();
  app.add_option("--val_fraction", a.val_fraction,
                 "share of the corpus held out (the end) for the held-out loss")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 0.5));
  app.add_option("--save_dir", a.save_dir,
                 "write checkpoints (DeepSpeed's layout) here, every --save_interval steps and "
                 "after the last (a resumed checkpoint already at --steps: what was loaded)");
  app.add_option("--save_interval", a.save_interval, "steps between checkpoints (0: last only)")
      ->capture_default_str();
  app.add_option("--load_dir", a.load_dir,
                 "resume from <load_dir>/latest (weights, optimizer, schedule, data position); "
                 "--steps stays the total");
  app.add_option("--local_rank", a.local_rank, "set by the launcher (LOCAL_RANK is used)");
  app.add_flag("--progress", a.progress,
               "redraw the progress bar in place after every step (default: on a terminal; every "
               "log line ends with the progress and the estimated finish anyway)");
  app.add_flag("--deepspeed_log", a.deepspeed_log,
               "also print the engine's lines every steps_per_print steps: DeepSpeed's "
               "'step=N, skipped=...' and 'RunningAvgSamplesPerSec=...' lines and its readable "
               "line (rank 0's loss)");
  app.add_option("--peak_tflops", a.peak_tflops,
                 "peak TFLOP/s of one device: report model FLOPs utilization (MFU)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--compact_vocab", a.compact_vocab,
               "keep only the corpus's own token ids (a much smaller embedding and output layer)");
  app.add_flag("--exp_avg_mask", a.exp_avg_mask,
               "1-bit optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb): give the token "
               "embedding DeepSpeed's exp_avg_mask, zero on the rows of token ids the training "
               "split never uses (docs/onebit.md)");
  app.add_option("--plot", a.plot,
                 "write loss and learning-rate curves to this PNG (needs gnuplot)");
  app.add_flag("--activation_checkpointing", a.activation_checkpointing,
               "recompute each transformer block in backward instead of keeping its activations "
               "(the config's activation_checkpointing section applies)");
  app.add_option("--lm_loss", a.lm_loss,
                 "cross_entropy | chunked (no fp32 [tokens, vocab] tensors) | fused (the output "
                 "projection fused into the loss: no logits)")
      ->capture_default_str();
  app.add_option("--dropout", a.dropout, "dropout probability (GPT-2: 0.1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--continue_on_nonfinite_loss", a.continue_on_nonfinite_loss,
               "train on when the loss is nan or inf (default: stop with an error naming the "
               "step and the ranks)");
  app.add_option("--pipeline_parallel_size", a.pipeline_parallel_size,
                 "pipeline stages: the GPT becomes a PipelineModule (embedding, blocks, final "
                 "norm + tied head) trained with the pipeline engine; world size = stages x "
                 "data-parallel size (docs/pipeline.md)")
      ->capture_default_str()
      ->check(deepspeed::util::at_least_one());
  app.add_option("--pipe_partition_method", a.pipe_partition_method,
                 "how the pipeline cuts its layers (GptEmbedding, Block x n_layer, LayerNorm, "
                 "GptEmbedding): DeepSpeed's partition_method, \"type:<regex>\" (balance the "
                 "matching layers), \"parameters\" or \"uniform\" (default: type:Block)");
  deepspeed::examples::add_moe_flags(app, a.moe);
  app.add_option("--tensor_parallel_size", a.tensor_parallel_size,
                 "tensor-parallel ranks: AutoTP (tensor_parallel.autotp_size) splits each "
                 "block's attention (q|k|v by heads) and MLP over this many adjacent ranks; "
                 "world size = tensor x data-parallel size (docs/tensor_parallel.md)")
      ->capture_default_str()
      ->check(deepspeed::util::at_least_one());
  CLI11_PARSE(app, argc, argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    int rank = ds::comm::is_initialized() ? ds::comm::get_rank() : 0;
    std::fprintf(stderr, "train_gpt: [rank %d] error: %s\n", rank, e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "train_gpt: error: unknown exception (a bug in deepspeed-cpp)\n");
    return 1;
  }
}
