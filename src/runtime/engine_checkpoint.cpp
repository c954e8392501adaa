// Engine::save_checkpoint / load_checkpoint / save_16bit_model: the parts every ZeRO stage
// shares (module, scheduler, counters, RNG states, client state, `latest`; reference §5.4-5.5,
// §6) and how the ranks meet. Each stage writes and reads its own part (ZeroOptimizer's
// checkpoint methods, zero/zero_checkpoint.h); the file formats live in
// include/deepspeed/checkpoint.h.
//
// Two rules shape this file:
//  - A load reads and checks everything before it changes anything, and the ranks agree on the
//    outcome (all_ranks_or_none): a bad checkpoint leaves the engine as it was on every rank.
//  - A save writes every file atomically; `latest` moves only after every rank's files are
//    durable (commit_checkpoint), so a crash mid-save leaves the previous checkpoint loadable.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/data_sampling.h"
#include "deepspeed/compression.h"
#include "deepspeed/engine.h"
#include "deepspeed/onebit.h"
#include "deepspeed/optimizers.h"
#include "deepspeed/progressive_layer_drop.h"
#include "deepspeed/random_ltd.h"
#include "deepspeed/universal_checkpoint.h"
#include "deepspeed/version.h"
#include "deepspeed/zero3.h"
#include "runtime/checkpoint/checkpoint_writer.h"
#include "runtime/checkpoint/shared_file_writers.h"
#include "runtime/data_efficiency/sampler_checkpoint.h"
#include "runtime/data_efficiency/variable_batch_lr.h"
#include "runtime/precision/loss_scaler.h"
#include "runtime/sparse_grad.h"
#include "runtime/tensor_parallel/engine_autotp.h"
#include "runtime/zero/flat_zero_optimizer.h"
#include "runtime/zero/universal_load.h"
#include "runtime/zero/zero_checkpoint.h"
#include "runtime/zero/zero_optimizer.h"
#include "util/check.h"
#include "util/env.h"
#include "util/logging.h"
#include "util/remove_tree.h"
#include "util/torch_compat.h"

namespace deepspeed {
namespace {

namespace ckpt = checkpoint;
using c10::IValue;
using List = c10::impl::GenericList;

// Ours, not DeepSpeed's: every rank's generator state, in the model-states file (rank 0 writes
// it), as a list indexed by rank of {"torch_rng_state": uint8 tensor} (Megatron's key name).
constexpr const char* kRngStateKey = "rng_state";
// DeepSpeed's key for what ds_to_universal needs to know about the model-parallel splits.
constexpr const char* kUniversalInfoKey = "universal_checkpoint_info";

// Runs `fn` on every rank; if it threw on any rank, every rank throws: the failing ranks their
// own error, the others a CheckpointError naming them. Keeps ranks from parting ways (one rank
// going on to a collective the others never reach) and from half-applied state.
void all_ranks_or_none(const std::string& what, const std::function<void()>& fn) {
  std::exception_ptr error;
  try {
    fn();
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  const int world = comm::get_world_size();
  if (world == 1) {
    if (error) std::rethrow_exception(error);
    return;
  }
  at::Tensor flags = at::zeros({world}, at::kLong);
  at::Tensor mine = at::full({1}, error ? 1 : 0, at::kLong);
  comm::all_gather(flags, mine);
  if (error) std::rethrow_exception(error);
  std::vector<int> failed;
  for (int r = 0; r < world; ++r) {
    if (flags[r].item<int64_t>() != 0) failed.push_back(r);
  }
  if (failed.empty()) return;
  std::ostringstream os;
  for (size_t i = 0; i < failed.size(); ++i) os << (i ? ", " : "") << failed[i];
  DS_CHECK(false, CheckpointError, what, " failed on rank(s) [", os.str(),
           "] (their log has the reason); nothing was changed on rank ", comm::get_rank());
}

ckpt::LossScalerState scaler_state_from_json(const json& j) {
  ckpt::LossScalerState s;
  s.dynamic = j.value("dynamic", false);
  s.cur_scale = j.value("cur_scale", 1.0);
  s.cur_iter = j.value("cur_iter", int64_t{0});
  if (!s.dynamic) return s;
  s.last_overflow_iter = j.at("last_overflow_iter").get<int64_t>();
  s.scale_factor = j.at("scale_factor").get<double>();
  s.scale_window = j.at("scale_window").get<int64_t>();
  s.min_scale = j.at("min_scale").get<double>();
  s.delayed_shift = j.at("delayed_shift").get<int64_t>();
  s.cur_hysteresis = j.at("cur_hysteresis").get<int64_t>();
  s.consecutive_hysteresis = j.at("consecutive_hysteresis").get<bool>();
  s.raise_error_at_min_scale = j.at("raise_error_at_min_scale").get<bool>();
  return s;
}

// DS_CHECKPOINT_PYTHON_OBJECTS=1: DeepSpeed's pickled classes, for Python DeepSpeed to resume.
bool python_objects() { return env::get_int("DS_CHECKPOINT_PYTHON_OBJECTS").value_or(0) != 0; }

// ZeRO-3 with NVMe offload keeps the optimizer's shards in swap files between steps; a save or
// load has them in memory for its duration.
class SwappedIn {
 public:
  explicit SwappedIn(runtime::ZeroOptimizer* zero) : zero_(zero) {
    if (zero_) zero_->swap_in_optimizer_states();
  }
  ~SwappedIn() {
    if (zero_) zero_->swap_out_optimizer_states();
  }
  SwappedIn(const SwappedIn&) = delete;
  SwappedIn& operator=(const SwappedIn&) = delete;

 private:
  runtime::ZeroOptimizer* zero_;
};

// A 64-bit digest of the tag (FNV-1a): equal on every rank iff the tags are, with overwhelming
// probability. DeepSpeed uses SHA-1 for the same all-reduce MAX/MIN comparison.
int64_t tag_digest(const std::string& tag) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : tag) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h >> 1);
}

// This rank's state of `gen`, and every rank's gathered (as int64 words so that any backend
// moves it).
at::Tensor gather_rng_states(at::Generator gen) {
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  const int64_t bytes = state.numel();
  const int64_t words = (bytes + 7) / 8;
  at::Tensor packed = at::zeros({words}, at::kLong);
  std::memcpy(packed.data_ptr(), state.data_ptr(), static_cast<size_t>(bytes));
  const int world = comm::get_world_size();
  at::Tensor all = world == 1 ? packed : at::empty({world * words}, at::kLong);
  if (world > 1) comm::all_gather(all, packed);
  return all.view({world, words}).narrow(1, 0, words).contiguous().view(at::kByte)
      .narrow(1, 0, bytes).contiguous();
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool same_ranks(const comm::Group& a, const comm::Group& b) {
  if (a.size() != b.size()) return false;
  for (int i = 0; i < a.size(); ++i) {
    if (a.global_rank(i) != b.global_rank(i)) return false;
  }
  return true;
}

// The model-parallel rank that names a rank's checkpoint files, and their number. It is the
// model-parallel group's, except in a pipeline with tensor parallelism inside its stages (3D),
// whose model-parallel group is the stages: there it is DeepSpeed's ds_model_rank over both,
// stage * T + tensor-parallel rank, so that the T ranks of a stage write files of their own.
struct CheckpointModelParallel {
  int rank = 0;
  int size = 1;
  int tp_size = 1;  // the tensor-parallel size inside it
};

CheckpointModelParallel checkpoint_model_parallel(const torch::nn::Module& module,
                                                  const comm::Group& mp) {
  const auto tp = runtime::tensor_parallel_group_of(module.parameters());
  if (!tp || tp->size() == 1) return {mp.rank(), mp.size(), 1};
  if (same_ranks(*tp, mp)) return {mp.rank(), mp.size(), tp->size()};
  return {mp.rank() * tp->size() + tp->rank(), mp.size() * tp->size(), tp->size()};
}

int saved_zero_stage(const ckpt::ModelStates& states) {
  const json& cfg = states.ds_config;
  if (!cfg.is_object()) return 0;
  auto z = cfg.find("zero_optimization");
  if (z == cfg.end() || !z->is_object()) return 0;
  auto s = z->find("stage");
  return s != z->end() && s->is_number_integer() ? s->get<int>() : 0;
}

std::string join_names(const std::vector<std::string>& names, size_t max = 5) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < max; ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > max) os << ", ... (" << names.size() << " in all)";
  return os.str();
}

// The module's state as load_module_state_dict will see it, checked without touching the module.
// `partitioned`: names whose saved entry is a ZeRO-3 placeholder (checked by name only).
void check_module_state(torch::nn::Module& module, const ckpt::TensorDict& saved, bool strict,
                        const std::string& source,
                        const std::set<std::string>* partitioned = nullptr) {
  ckpt::TensorDict targets = ckpt::module_state_dict(module);
  std::vector<std::string> missing, unexpected, shapes;
  for (const auto& t : targets) {
    const at::Tensor* s = saved.find(t.key());
    if (!s) {
      missing.push_back(t.key());
    } else if (!(partitioned && partitioned->count(t.key())) &&
               !s->sizes().equals(t.value().sizes())) {
      std::ostringstream os;
      os << t.key() << " (checkpoint " << s->sizes() << ", model " << t.value().sizes() << ")";
      shapes.push_back(os.str());
    }
  }
  for (const auto& s : saved) {
    if (!targets.contains(s.key())) unexpected.push_back(s.key());
  }
  DS_CHECK(shapes.empty(), CheckpointError, source,
           ": parameter shapes differ from the model's: ", join_names(shapes));
  DS_CHECK(!strict || (missing.empty() && unexpected.empty()), CheckpointError, source,
           ": the module's names differ from the checkpoint's: missing [", join_names(missing),
           "], unexpected [", join_names(unexpected),
           "]; load with load_module_strict=false to ignore them");
}

// What a load will apply, read and checked in full first: the stage's part, and the engine's.
struct LoadPlan : runtime::ZeroLoadPlan {
  std::optional<json> lr_scheduler;
  std::optional<json> random_ltd;
  std::optional<json> data_sampler;
  std::optional<at::Tensor> rng_state;
  std::optional<at::Tensor> cuda_rng_state;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// save

ckpt::LossScalerState Engine::scaler_state() const {
  ckpt::LossScalerState s = scaler_state_from_json(
      loss_scaler_ ? loss_scaler_->state_dict()
                   : json{{"cur_scale", 1.0}, {"dynamic", false}, {"cur_iter", 0}});
  s.dtype = model_dtype_;
  return s;
}

runtime::ZeroCheckpointContext Engine::checkpoint_context(const std::string& tag_dir) const {
  runtime::ZeroCheckpointContext ctx;
  ctx.config = &config_;
  ctx.optimizer = optimizer_.get();
  ctx.module = module_.get();
  ctx.tag_dir = tag_dir;
  ctx.mp_rank = checkpoint_model_parallel(*module_, mp_group_).rank;
  ctx.loss_scaler = loss_scaler_ ? loss_scaler_->state_dict()
                                 : json{{"cur_scale", 1.0}, {"dynamic", false}, {"cur_iter", 0}};
  ctx.loss_scaler_state = scaler_state();
  ctx.python_objects = python_objects();
  ctx.shared_params = shared_params_;
  return ctx;
}

ckpt::TensorDict Engine::read_layer_files(const std::string& tag_dir,
                                         const std::string& model_file) const {
  throw CheckpointError(model_file + ": 'module' is None: a pipeline checkpoint, whose weights "
                        "are in the layer files of " + tag_dir + "; load it with a pipeline "
                        "engine (pipe::initialize), or convert it with ds_to_universal");
}

ckpt::ModelStates Engine::model_states(const ClientState& client_state,
                                       bool exclude_frozen_parameters) {
  ckpt::ModelStates m;
  // A pipeline's weights go to files of their own, one per layer (DeepSpeed's layout).
  m.module_in_layer_files = module_in_layer_files();
  if (!m.module_in_layer_files) m.module = ckpt::module_state_dict(*module_);
  std::vector<std::string> frozen;
  for (const auto& p : module_->named_parameters()) {
    if (!p.value().requires_grad()) frozen.push_back(p.key());
  }
  if (exclude_frozen_parameters) {
    ckpt::TensorDict kept;
    for (const auto& item : m.module) {
      if (std::find(frozen.begin(), frozen.end(), item.key()) == frozen.end()) {
        kept.insert(item.key(), item.value());
      }
    }
    m.module = std::move(kept);
  }
  m.buffer_names = ckpt::module_buffer_names(*module_);
  // Matches DeepSpeed: the embedding weights under sparse_gradients (an empty set without).
  if (config_.sparse_gradients) {
    m.sparse_tensor_module_names = runtime::sparse_gradient_names(*module_);
  }
  if (zero_) {  // the stage's part: stage 0's optimizer, ZeRO's param_shapes, ...
    runtime::ZeroCheckpointContext ctx = checkpoint_context("");
    ctx.exclude_frozen_parameters = exclude_frozen_parameters;
    zero_->add_model_states(ctx, &m);
  }
  if (const auto variable = data_sampling::engine_variable_batch_lr(*this)) {
    // Dynamic batching: DeepSpeed's VariableBatchSizeLR's layout, which its engine loads.
    m.lr_scheduler = ckpt::ivalue_from_json(
        data_sampling::variable_batch_lr_state_dict(*variable, *lr_scheduler_));
  } else if (lr_scheduler_) {
    m.lr_scheduler = ckpt::ivalue_from_json(lr_scheduler_->state_dict());
  }
  if (random_ltd_) m.random_ltd = ckpt::ivalue_from_json(random_ltd_->state_dict());
  if (const auto* sampler = data_sampling::engine_data_sampler(*this)) {
    m.data_sampler = ckpt::ivalue_from_json(sampler->state_dict());
  }
  m.skipped_steps = skipped_steps_;
  m.global_steps = global_steps_;
  m.global_samples = global_samples_;
  m.dp_world_size = config_.batch.dp_world_size;
  // Matches DeepSpeed (its mpu's model-parallel size, pipeline and tensor-parallel sizes): the
  // model-parallel group is the tensor-parallel one, or a pipeline's stages (with any tensor
  // parallelism inside).
  const CheckpointModelParallel mp = checkpoint_model_parallel(*module_, mp_group_);
  m.mp_world_size = mp.size;
  m.checkpoint_parallel_dimensions.tp_degree = mp.tp_size;
  m.checkpoint_parallel_dimensions.pp_degree = mp.size / mp.tp_size;
  m.ds_config = config_.raw;
  m.ds_version = kDeepSpeedCompatVersion;
  // After the stage's own top-level keys (MoE's num_experts), as DeepSpeed's state.update().
  m.client_state.insert(m.client_state.end(), client_state.begin(), client_state.end());
  if (mp.size > 1) {  // which parameters are split, for ds_to_universal
    m.client_state.emplace_back(kUniversalInfoKey,
                                ckpt::universal_checkpoint_info(*module_, mp.tp_size));
  }
  return m;
}

bool Engine::writes_replicated_checkpoint_files() const {
  return ckpt::writes_shared_files(dp_group_, config_.checkpoint.use_node_local_storage);
}

ckpt::CheckpointWriter& Engine::checkpoint_writer() {
  if (!checkpoint_writer_) {
    checkpoint_writer_ = std::make_unique<ckpt::CheckpointWriter>(config_.checkpoint.writer);
  }
  return *checkpoint_writer_;
}

ckpt::FileSaver Engine::checkpoint_file_saver() { return checkpoint_writer().saver(); }

bool Engine::commit_decoupled_checkpoint() {
  if (!pending_checkpoint_) return false;
  const PendingCheckpoint pending = std::move(*pending_checkpoint_);
  pending_checkpoint_.reset();
  comm::PhaseScope phase(comm::Phase::kCheckpoint);
  const std::string tag_dir = ckpt::tag_directory(pending.save_dir, pending.tag);
  const auto start = std::chrono::steady_clock::now();
  ckpt::CheckpointWriter::Summary written;
  all_ranks_or_none("committing the decoupled checkpoint " + tag_dir,
                    [&] { written = checkpoint_writer().wait(); });
  const auto barrier = [] {
    if (comm::get_world_size() > 1) comm::barrier();
  };
  ckpt::commit_checkpoint(pending.save_dir, pending.tag, pending.keeps_save_dir,
                          pending.save_latest, barrier);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char facts[200];
  std::snprintf(facts, sizeof(facts),
                ": rank 0 wrote %lld files (%.1f MB) in %.3f s in the background after a %.3f s "
                "snapshot; the commit waited %.3f s",
                static_cast<long long>(written.files), written.bytes / 1e6, written.write_seconds,
                written.snapshot_seconds, waited);
  log::info_rank0("committed checkpoint " + tag_dir + (pending.save_latest ? " (latest)" : "") +
                  facts);
  return true;
}

bool Engine::save_checkpoint(const std::string& save_dir, const std::optional<std::string>& tag,
                             const ClientState& client_state, bool save_latest,
                             bool exclude_frozen_parameters) {
  comm::PhaseScope phase(comm::Phase::kCheckpoint);
  DS_CHECK(!save_dir.empty(), UsageError, "save_checkpoint: save_dir is empty");
  DS_CHECK(!zero_ || !zero_->backward_pending(), UsageError,
           "save_checkpoint: called between backward() and step() on an accumulation boundary; "
           "save after step()");
  for (const auto& [key, value] : client_state) {
    DS_CHECK(key != kRngStateKey && key != kUniversalInfoKey, UsageError,
             "save_checkpoint: client_state key '", key, "' is reserved for the engine");
  }
  commit_decoupled_checkpoint();  // the previous decoupled save, if any, first
  const std::string name = tag.value_or(ckpt::default_tag(global_steps_));
  const std::string mode = config_.checkpoint.tag_validation;
  if (mode != "IGNORE" && comm::get_world_size() > 1) {
    at::Tensor hi = at::full({1}, tag_digest(name), at::kLong);
    at::Tensor lo = hi.clone();
    comm::all_reduce(hi, comm::ReduceOp::kMax);
    comm::all_reduce(lo, comm::ReduceOp::kMin);
    if (!hi.equal(lo)) {
      const std::string msg = "[rank=" + std::to_string(comm::get_rank()) +
                              "] The checkpoint tag name '" + name +
                              "' is not consistent across all ranks. Including rank unique "
                              "information in checkpoint tag could cause issues when restoring "
                              "with different world sizes.";
      DS_CHECK(mode != "FAIL", UsageError, msg);
      log::warn(msg);
    }
  }
  const std::string tag_dir = ckpt::tag_directory(save_dir, name);
  // The model-states file: one data-parallel replica of each model-parallel rank writes it
  // (as DeepSpeed's save_non_zero_checkpoint); `latest` and the directory: global rank 0, or
  // each node's local rank 0 (Note [Node-local checkpoint storage]).
  const bool keeps_save_dir = config_.checkpoint.use_node_local_storage
                                  ? comm::get_local_rank() == 0
                                  : comm::get_rank() == 0;
  const bool writes_replicated = writes_replicated_checkpoint_files();
  const int dp_rank = dp_group_.rank();
  const int mp_rank = checkpoint_model_parallel(*module_, mp_group_).rank;
  const auto barrier = [] {
    if (comm::get_world_size() > 1) comm::barrier();
  };
  all_ranks_or_none("save_checkpoint(" + tag_dir + ") creating the directory", [&] {
    if (keeps_save_dir) ckpt::create_directories(tag_dir);
  });
  // Gathered on every rank (a collective), written by rank 0.
  at::Tensor rng = gather_rng_states(at::detail::getDefaultCPUGenerator());
  // Megatron's key beside it: the training device's CUDA generator (dropout on the GPU).
  const at::Tensor cuda_rng =
      device_.is_cuda() ? gather_rng_states(compat::default_cuda_generator(device_.index()))
                        : at::Tensor();
  SwappedIn swapped(zero_.get());
  const ckpt::FileSaver save_file = checkpoint_file_saver();
  all_ranks_or_none("save_checkpoint(" + tag_dir + ")", [&] {
    // The stage names the model-states file this rank writes (ZeRO-3: every rank its own;
    // otherwise one replica the one file of its model-parallel rank) and its own
    // optimizer-states file. Without an optimizer: that replica, the module alone.
    const std::string model_file =
        zero_ ? zero_->model_states_file_name(writes_replicated, mp_rank)
              : writes_replicated ? ckpt::model_states_file_name(mp_rank) : std::string();
    if (!model_file.empty()) {
      ckpt::ModelStates m = model_states(client_state, exclude_frozen_parameters);
      List states(c10::AnyType::get());
      for (int64_t r = 0; r < rng.size(0); ++r) {
        ckpt::Dict d = ckpt::new_dict();
        d.insert("torch_rng_state", rng[r]);
        if (cuda_rng.defined()) d.insert("cuda_rng_state", cuda_rng[r]);
        states.push_back(d);
      }
      m.client_state.emplace_back(kRngStateKey, IValue(states));
      save_file(m.to_ivalue(), tag_dir + "/" + model_file);
    }
    if (zero_) {
      runtime::ZeroCheckpointContext ctx = checkpoint_context(tag_dir);
      ctx.save_file = save_file;
      if (auto file = zero_->optimizer_states_file(ctx)) {
        save_file(file->second, tag_dir + "/" + file->first);
      }
    }
    // 1-bit optimizers: each rank's error-feedback buffers (no-op for other optimizers).
    if (optimizer_) {
      onebit::save_rank_local_state(*optimizer_, tag_dir, dp_rank, mp_rank, save_file);
    }
  });
  if (checkpoint_writer().decoupled()) {
    // Note [Decoupled checkpoints]: committed at the next step, save or load.
    pending_checkpoint_ = PendingCheckpoint{save_dir, name, keeps_save_dir, save_latest};
    log::info_rank0("saving checkpoint " + tag_dir + " in the background (checkpoint.writer."
                    "decoupled); `latest` moves when it is committed");
    return true;
  }
  ckpt::commit_checkpoint(save_dir, name, keeps_save_dir, save_latest, barrier);
  log::info_rank0("saved checkpoint " + tag_dir + (save_latest ? " (latest)" : ""));
  return true;
}

bool Engine::save_16bit_model(const std::string& save_dir, const std::string& save_filename,
                              bool exclude_frozen_parameters) {
  comm::PhaseScope phase(comm::Phase::kCheckpoint);
  DS_CHECK(!save_dir.empty(), UsageError, "save_16bit_model: save_dir is empty");
  const std::string path = save_dir + "/" + save_filename;
  std::optional<zero::GatheredParameters> gathered;
  if (config_.zero_optimization.stage == 3) {
    // Matches DeepSpeed: stage 3 saves only with stage3_gather_16bit_weights_on_model_save
    // (gathering the whole model on every rank), else warns and returns false.
    if (!config_.zero_optimization.stage3_gather_16bit_weights_on_model_save) {
      log::warn_rank0("Did not save the model " + path + " because "
                      "stage3_gather_16bit_weights_on_model_save is False");
      return false;
    }
    gathered.emplace(*module_);
  }
  all_ranks_or_none("save_16bit_model(" + path + ")", [&] {
    if (comm::get_rank() != 0) return;
    ckpt::create_directories(save_dir);
    // The module as it is (gathered under ZeRO-3), not model_states(): that one holds
    // ZeRO-3 placeholders.
    ckpt::TensorDict state = ckpt::module_state_dict(*module_);
    std::set<std::string> frozen;
    if (exclude_frozen_parameters) {
      for (const auto& p : module_->named_parameters()) {
        if (!p.value().requires_grad()) frozen.insert(p.key());
      }
    }
    // Tied weights once (as torch.save of a Python state_dict stores one storage): the alias
    // entries are dropped; loading with strict=false (or re-tying) restores them.
    ckpt::TensorDict unique;
    for (const auto& item : state) {
      const bool alias = std::any_of(shared_params_.begin(), shared_params_.end(),
                                     [&](const auto& s) { return s.first == item.key(); });
      if (!alias && !frozen.count(item.key())) unique.insert(item.key(), item.value());
    }
    const std::string suffix = ".safetensors";
    const bool safetensors = save_filename.size() > suffix.size() &&
                             save_filename.compare(save_filename.size() - suffix.size(),
                                                   suffix.size(), suffix) == 0;
    if (safetensors) {
      ckpt::save_safetensors(unique, path);
    } else {
      // Matches DeepSpeed: the writer's type applies; a decoupled writer commits at once.
      checkpoint_writer().immediate_saver()(ckpt::ivalue_from_tensors(unique), path);
    }
  });
  if (comm::get_world_size() > 1) comm::barrier();
  log::info_rank0("saved 16-bit model " + path);
  return true;
}

// ---------------------------------------------------------------------------------------------
// load

LoadedCheckpoint Engine::load_checkpoint(const std::string& load_dir,
                                         const std::optional<std::string>& tag,
                                         const LoadCheckpointOptions& options) {
  comm::PhaseScope phase(comm::Phase::kCheckpoint);
  DS_CHECK(!load_dir.empty(), UsageError, "load_checkpoint: load_dir is empty");
  DS_CHECK(!zero_ || !zero_->backward_pending(), UsageError,
           "load_checkpoint: called between backward() and step() on an accumulation boundary");
  commit_decoupled_checkpoint();  // a decoupled save's files are complete before anything reads
  std::optional<std::string> name = tag;
  const bool universal = config_.checkpoint.load_universal;
  if (!name && universal) {
    // Matches DeepSpeed: a universal load without a tag needs `latest_universal`.
    name = ckpt::read_latest_universal(load_dir);
    DS_CHECK(name.has_value(), CheckpointError, "load_checkpoint: checkpoint.load_universal is "
             "true but ", load_dir, "/latest_universal does not exist; pass the tag of the "
             "universal checkpoint folder or run ds_to_universal");
  }
  if (!name) {
    name = ckpt::read_latest(load_dir);
    if (!name) {
      // Matches DeepSpeed: no `latest` is a warning and nothing loaded.
      log::warn_rank0("Unable to find latest file at " + load_dir +
                      "/latest, if trying to load latest checkpoint please ensure this file "
                      "exists or pass an explicit checkpoint tag when loading a checkpoint.");
      return {};
    }
  }
  const std::string tag_dir = ckpt::tag_directory(load_dir, *name);
  const int stage = static_cast<int>(config_.zero_optimization.stage);
  const bool want_optimizer =
      optimizer_ && options.load_optimizer_states && !options.load_module_only;
  const bool want_scheduler =
      lr_scheduler_ && options.load_lr_scheduler_states && !options.load_module_only;

  SwappedIn swapped(zero_.get());
  LoadPlan plan;
  runtime::ZeroCheckpointContext ctx = checkpoint_context(tag_dir);
  // Beyond DeepSpeed: a checkpoint of another tensor-parallel size loads directly. Global rank 0
  // converts it as ds_to_universal does, into a hidden folder beside it (every rank must see
  // it, as they see the checkpoint), and every rank loads that as a universal checkpoint; the
  // folder is removed once every rank has read it (all_ranks_or_none meets after the read).
  bool reshape = false;
  struct RemoveOnRank0 {
    std::string dir;
    ~RemoveOnRank0() {
      if (!dir.empty() && comm::get_rank() == 0) util::remove_tree(dir);
    }
  } reshape_folder;
  // Only where the checkpoint's model-parallel ranks are tensor-parallel ones (not a
  // pipeline's stages).
  const CheckpointModelParallel mp = checkpoint_model_parallel(*module_, mp_group_);
  if (!universal && zero_ && mp.size == mp.tp_size && is_directory(tag_dir)) {
    const int saved_tp = ckpt::count_model_parallel_files(tag_dir);
    if (saved_tp > 0 && saved_tp != mp.size) {
      reshape = true;
      const std::string tmp =
          load_dir + "/." + *name + ".tp" + std::to_string(mp.size) + ".universal";
      all_ranks_or_none("load_checkpoint(" + tag_dir + ") converting tensor-parallel size " +
                            std::to_string(saved_tp) + " to " + std::to_string(mp.size),
                        [&] {
                          if (comm::get_rank() != 0) return;
                          reshape_folder.dir = tmp;
                          ckpt::ds_to_universal(tag_dir, tmp, /*write_latest=*/false);
                        });
      ctx.tag_dir = tmp;
      log::info_rank0("load_checkpoint: " + tag_dir + " was written with tensor-parallel size " +
                      std::to_string(saved_tp) + ", this engine runs " +
                      std::to_string(mp.size) + ": loading it through a universal conversion");
    }
  }
  ctx.want_optimizer = want_optimizer;
  ctx.load_module_strict = options.load_module_strict;
  // The checks of what every stage shares, once the stage has read the model states.
  ctx.check_model_states = [&](runtime::ZeroLoadPlan* read) {
    if (read->states.module_in_layer_files) {  // what the reader put there (experts) stays
      ckpt::TensorDict module = read_layer_files(ctx.tag_dir, read->model_file);
      for (const auto& item : read->states.module) {
        if (module.contains(item.key())) {
          module[item.key()] = item.value();
        } else {
          module.insert(item.key(), item.value());
        }
      }
      read->states.module = std::move(module);
    }
    check_module_state(*module_, read->states.module, options.load_module_strict,
                       read->model_file,
                       read->placeholders.empty() ? nullptr : &read->placeholders);
    const int saved_stage = saved_zero_stage(read->states);
    if (want_optimizer && !read->load_optimizer) {  // a stage that took it checked its files
      DS_CHECK(saved_stage == stage, CheckpointError, read->model_file,
               ": the checkpoint was written with zero_optimization.stage ", saved_stage,
               ", this engine runs stage ", stage,
               "; its optimizer state cannot be loaded: load with load_optimizer_states=false "
               "(weights only) or run the saving stage");
      read->load_optimizer = true;
    }
    if (want_scheduler) {
      DS_CHECK(!read->states.lr_scheduler.isNone(), CheckpointError, read->model_file,
               ": has no lr_scheduler state (part 'lr_scheduler') but this engine has a "
               "scheduler; load with load_lr_scheduler_states=false to keep it fresh");
      plan.lr_scheduler = data_sampling::scheduler_state_from_variable_batch(
          ckpt::json_from_ivalue(read->states.lr_scheduler, read->model_file + ": lr_scheduler"),
          read->model_file + ": lr_scheduler");
    }
    if (random_ltd_ && !options.load_module_only && !read->states.random_ltd.isNone()) {
      plan.random_ltd = ckpt::json_from_ivalue(read->states.random_ltd,
                                               read->model_file + ": random_ltd");
    }
    if (data_sampling::engine_data_sampler(*this) && !options.load_module_only &&
        !read->states.data_sampler.isNone()) {
      plan.data_sampler = data_sampling::data_sampler_state_from_checkpoint(
          read->states.data_sampler, read->model_file + ": data_sampler");
    }
    for (const auto& [key, value] : read->states.client_state) {
      if (key != kRngStateKey || options.load_module_only) continue;
      const auto list = value.toListRef();
      // Indexed by global rank: every process has its own generator.
      if (static_cast<int>(list.size()) == comm::get_world_size()) {
        const auto states = list[static_cast<size_t>(comm::get_rank())].toGenericDict();
        plan.rng_state = states.at("torch_rng_state").toTensor();
        if (states.contains("cuda_rng_state")) {
          plan.cuda_rng_state = states.at("cuda_rng_state").toTensor();
        }
      }
    }
  };
  all_ranks_or_none("load_checkpoint(" + tag_dir + ")", [&] {
    DS_CHECK(is_directory(load_dir), CheckpointError, "load_checkpoint: checkpoint directory ",
             load_dir, " does not exist");
    DS_CHECK(is_directory(tag_dir), CheckpointError, "load_checkpoint: no checkpoint with tag '",
             *name, "' in ", load_dir, " (no directory ", tag_dir, ")");
    if ((universal || reshape) && stage == 3) {
      auto* stage3 = dynamic_cast<runtime::Stage3ZeroOptimizer*>(zero_.get());
      DS_INTERNAL_ASSERT(stage3 != nullptr, "ZeRO stage 3 without a Stage3ZeroOptimizer");
      runtime::read_universal_checkpoint(ctx, *stage3, &plan);
    } else if (universal || reshape) {
      auto* flat = dynamic_cast<runtime::FlatZeroOptimizer*>(zero_.get());
      DS_INTERNAL_ASSERT(!zero_ || flat != nullptr, "ZeRO stage ", stage,
                         " without a FlatZeroOptimizer");
      // Sliced for the tensor-parallel group (a pipeline's stages are model-parallel ranks
      // that hold whole parameters).
      const auto tp_group = runtime::tensor_parallel_group_of(module_->parameters());
      runtime::read_universal_checkpoint(ctx, flat, tp_group ? tp_group->rank() : 0,
                                         tp_group ? tp_group->size() : 1, &plan);
    } else if (zero_) {
      zero_->read_checkpoint(ctx, &plan);
    } else {
      runtime::read_replicated_model_states(ctx, &plan);
    }
  });

  // Apply. The optimizer first: its loader checks everything before it assigns anything.
  std::vector<std::string> restored;
  if (plan.load_optimizer) {
    optim::load_optimizer_state_dict(*optimizer_, plan.optimizer_state);
    restored.push_back("optimizer state");
  }
  if (zero_) {
    zero_->apply_checkpoint(ctx, plan, &restored);
  } else {
    ckpt::load_module_state_dict(*module_, plan.states.module, options.load_module_strict,
                                 plan.model_file);
    restored.insert(restored.begin(), "module");
  }
  if (plan.load_optimizer) {
    // 1-bit optimizers: this rank's error feedback (and 0/1 Adam's local parameters), after
    // the module so that rank-local parameters win over data-parallel rank 0's.
    onebit::load_rank_local_state(*optimizer_, tag_dir, dp_group_.rank(), ctx.mp_rank);
    auto* cc = dynamic_cast<onebit::CompressedCommunication*>(optimizer_.get());
    // fp16: the rank-local parameters are the fp32 masters; the model's copy follows them.
    if (cc != nullptr && cc->rank_local_parameters() && zero_) zero_->masters_to_params();
  }
  if (plan.load_optimizer && config_.fp16.enabled && plan.loss_scaler) {
    // Matches DeepSpeed's ZeRO: the checkpoint's scaler (kind and options) replaces ours.
    loss_scaler_ = runtime::loss_scaler_from_state_dict(*plan.loss_scaler);
    restored.push_back("loss scaler (scale " + std::to_string(loss_scale()) + ")");
  }
  if (plan.lr_scheduler) {
    lr_scheduler_->load_state_dict(*plan.lr_scheduler);
    restored.push_back("lr scheduler");
  }
  if (plan.random_ltd) {
    random_ltd_->load_state_dict(*plan.random_ltd, plan.model_file);
    restored.push_back("random-LTD schedule (kept length " +
                       std::to_string(random_ltd_->get_current_seq()) + ")");
  } else if (random_ltd_ && !options.load_module_only) {
    // DeepSpeed fails on the None a checkpoint without random-LTD holds; the schedule is a
    // function of the global step, so only the consumed layer-tokens are lost.
    log::warn_rank0(plan.model_file + ": no random_ltd state; random-LTD's schedule continues "
                    "from the restored global step, its consumed_layer_tokens from 0");
  }
  if (auto* sampler = data_sampling::engine_data_sampler(*this); sampler && plan.data_sampler) {
    sampler->load_state_dict(*plan.data_sampler, plan.model_file);
    restored.push_back("data sampler (curriculum step " +
                       std::to_string(sampler->curriculum_step()) + ")");
  } else if (sampler && !options.load_module_only) {
    log::warn_rank0(plan.model_file + ": no data_sampler state; the data sampler starts over");
  }
  if (!options.load_module_only) {
    global_steps_ = plan.states.global_steps;
    global_samples_ = plan.states.global_samples >= 0
                          ? plan.states.global_samples
                          : plan.states.global_steps * config_.batch.train_batch_size;
    skipped_steps_ = plan.states.skipped_steps;
    progress_samples_ = global_samples_;
    progress_start_ = std::chrono::steady_clock::now();
    restored.push_back("counters (global_steps " + std::to_string(global_steps_) +
                       ", skipped_steps " + std::to_string(skipped_steps_) + ")");
    // Ours, not DeepSpeed's (whose theta restarts at 1 until the next boundary): theta as the
    // last boundary before the save set it, so that a resumed run trains as an uninterrupted
    // one. The curriculum needs nothing: each forward recomputes it from global_steps.
    if (pld_ && global_steps_ > 0) pld_->update_state(global_steps_ - 1);
    // Ours, not DeepSpeed's (whose compression scheduler and MoQ restart from step 0, the
    // techniques off until their offsets come round again): both resume at the applied steps.
    if (compression_) {
      const int64_t applied = global_steps_ - skipped_steps_;
      compression_->set_training_steps(applied);
      if (moq_ && compression_->weight_quantization_enabled()) {
        // MoQ also quantized in each training forward of global step 0 when on from step 0.
        const bool from_zero = compression_->config().weight_quantization.schedule_offset == 0;
        moq_->set_steps(applied + (from_zero ? config_.batch.gradient_accumulation_steps : 0));
      }
      restored.push_back("compression schedule (step " + std::to_string(applied) + ")");
    }
  }
  if (plan.cuda_rng_state && device_.is_cuda()) {
    at::Generator gen = compat::default_cuda_generator(device_.index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(*plan.cuda_rng_state);
    restored.push_back("CUDA RNG state");
  }
  if (plan.rng_state) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle to the global one
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(*plan.rng_state);
    restored.push_back("RNG state");
  } else if (!options.load_module_only) {
    log::warn_rank0(plan.model_file + ": no RNG state for " + std::to_string(comm::get_world_size()) +
                    " ranks (another world size, or not written by this engine); each rank "
                    "keeps its own generator");
  }

  LoadedCheckpoint out;
  out.load_path = tag_dir;
  out.client_state = ckpt::client_state_of(plan.raw_states, options.load_module_only,
                                           plan.lr_scheduler.has_value(),
                                           plan.load_optimizer && plan.optimizer_in_model_states);
  (void)out.client_state.erase(kRngStateKey);
  (void)out.client_state.erase(kUniversalInfoKey);
  std::ostringstream keys;
  size_t i = 0;
  for (const auto& [key, value] : plan.states.client_state) {
    if (key != kRngStateKey && key != kUniversalInfoKey) keys << (i++ ? ", " : "") << key;
  }
  if (i) restored.push_back("client state [" + keys.str() + "]");
  std::ostringstream os;
  os << "loaded checkpoint " << tag_dir << ": ";
  for (size_t k = 0; k < restored.size(); ++k) os << (k ? ", " : "") << restored[k];
  log::info_rank0(os.str());
  return out;
}

}  // namespace deepspeed
