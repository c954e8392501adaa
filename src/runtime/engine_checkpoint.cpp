// Engine::save_checkpoint / load_checkpoint / save_16bit_model: which state goes into which of
// DeepSpeed's files (reference §5.4-5.5, §6), and how the ranks meet. The file formats live in
// include/deepspeed/checkpoint.h; re-partitioning for another world size in zero/repartition.h.
//
// Two rules shape this file:
//  - A load reads and checks everything before it changes anything, and the ranks agree on the
//    outcome (all_ranks_or_none): a bad checkpoint leaves the engine as it was on every rank.
//  - A save writes every file atomically; `latest` moves only after every rank's files are
//    durable (commit_checkpoint), so a crash mid-save leaves the previous checkpoint loadable.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/engine.h"
#include "deepspeed/onebit.h"
#include "deepspeed/optimizers.h"
#include "deepspeed/version.h"
#include "deepspeed/zero3.h"
#include "runtime/precision/loss_scaler.h"
#include "runtime/zero/repartition.h"
#include "runtime/zero/stage3.h"
#include "runtime/zero/stage3_checkpoint.h"
#include "runtime/zero/zero_optimizer.h"
#include "util/check.h"
#include "util/env.h"
#include "util/logging.h"

namespace deepspeed {
namespace {

namespace ckpt = checkpoint;
using c10::IValue;
using List = c10::impl::GenericList;

// Ours, not DeepSpeed's: every rank's generator state, in the model-states file (rank 0 writes
// it), as a list indexed by rank of {"torch_rng_state": uint8 tensor} (Megatron's key name).
constexpr const char* kRngStateKey = "rng_state";

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

json scaler_state_to_json(const ckpt::LossScalerState& s) {
  json j = {{"cur_scale", s.cur_scale}, {"dynamic", s.dynamic}, {"cur_iter", s.cur_iter}};
  if (!s.dynamic) return j;
  j["last_overflow_iter"] = s.last_overflow_iter;
  j["scale_factor"] = s.scale_factor;
  j["scale_window"] = s.scale_window;
  j["min_scale"] = s.min_scale;
  j["delayed_shift"] = s.delayed_shift;
  j["cur_hysteresis"] = s.cur_hysteresis;
  j["consecutive_hysteresis"] = s.consecutive_hysteresis;
  j["raise_error_at_min_scale"] = s.raise_error_at_min_scale;
  return j;
}

// DS_CHECKPOINT_PYTHON_OBJECTS=1: DeepSpeed's pickled classes, for Python DeepSpeed to resume.
bool python_objects() { return env::get_int("DS_CHECKPOINT_PYTHON_OBJECTS").value_or(0) != 0; }

// ZeRO-3 with NVMe offload keeps the optimizer's shards in swap files between steps; a save or
// load has them in memory for its duration.
class SwappedIn {
 public:
  explicit SwappedIn(runtime::Stage3ZeroOptimizer* zero) : zero_(zero) {
    if (zero_) zero_->swap_in_optimizer_states();
  }
  ~SwappedIn() {
    if (zero_) zero_->swap_out_optimizer_states();
  }
  SwappedIn(const SwappedIn&) = delete;
  SwappedIn& operator=(const SwappedIn&) = delete;

 private:
  runtime::Stage3ZeroOptimizer* zero_;
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

// This rank's CPU generator state, and every rank's gathered (as int64 words so that any
// backend moves it).
at::Tensor gather_rng_states() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
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

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// This rank's real (unpadded) element count in a flat group.
int64_t real_partition_numel(const runtime::FlatGroupLayout& layout) {
  const int64_t begin = static_cast<int64_t>(layout.partition) * layout.partition_numel;
  return std::clamp<int64_t>(layout.numel - begin, 0, layout.partition_numel);
}

at::Tensor padded_to(const at::Tensor& t, int64_t numel, const std::string& where) {
  DS_CHECK(t.dim() == 1 && t.numel() <= numel, CheckpointError, where, " has ", t.numel(),
           " elements, this rank's partition holds ", numel,
           " (the model or the number of ranks differs from the checkpoint's)");
  at::Tensor out = at::zeros({numel}, t.options().dtype(at::kFloat));
  out.narrow(0, 0, t.numel()).copy_(t);
  return out;
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

// The saved partitions re-laid for this engine's flat groups (any saved world size).
struct RepartitionedZeroState {
  std::vector<at::Tensor> masters;  // per flat group, this rank's partition (padding zero)
  IValue optimizer_state;           // the inner optimizer's state dict for our flat params
  int64_t saved_world = 0;
};

RepartitionedZeroState repartition(const std::vector<ckpt::ZeroOptimizerFile>& files,
                                   const std::vector<std::string>& paths,
                                   const std::vector<ckpt::ShapeDict>& shapes,
                                   const std::vector<runtime::FlatGroupLayout>& layout) {
  RepartitionedZeroState out;
  out.saved_world = static_cast<int64_t>(files.size());
  const std::string source = paths.front();
  const auto& first = files.front().optimizer_state_dict;
  DS_CHECK(first.single_partition_of_fp32_groups.size() == shapes.size(), CheckpointError,
           source, ": ", first.single_partition_of_fp32_groups.size(),
           " fp32 partition groups but param_shapes lists ", shapes.size());
  // fp32 masters: each saved group's partitions concatenated in rank order, cut by name.
  runtime::SavedParams masters;
  for (size_t g = 0; g < shapes.size(); ++g) {
    std::vector<at::Tensor> parts;
    for (size_t r = 0; r < files.size(); ++r) {
      const auto& groups = files[r].optimizer_state_dict.single_partition_of_fp32_groups;
      DS_CHECK(groups.size() == shapes.size(), CheckpointError, paths[r], ": ", groups.size(),
               " fp32 partition groups, rank 0's file has ", shapes.size());
      parts.push_back(groups[g].reshape({-1}));
    }
    runtime::split_saved_group(at::cat(parts), shapes[g], source, &masters);
  }
  for (const auto& l : layout) {
    out.masters.push_back(runtime::assemble_partition(l, masters, at::kFloat, source));
  }

  // Optimizer state: per saved group, tensors with one element per partition element are cut
  // and re-laid like the masters; the rest (step counts) are the same on every rank.
  const auto base_of = [&](size_t r) {
    return files[r].optimizer_state_dict.base_optimizer_state.toGenericDict();
  };
  ckpt::Dict base0 = base_of(0);
  DS_CHECK(base0.contains("param_groups") && base0.contains("state"), CheckpointError, source,
           ": base_optimizer_state has no param_groups/state");
  auto saved_groups = base0.at("param_groups").toListRef();
  DS_CHECK(saved_groups.size() == layout.size(), CheckpointError, source, ": ",
           saved_groups.size(), " optimizer param groups, this engine has ", layout.size(),
           " (with trainable parameters); the param groups must match to re-partition");
  ckpt::Dict new_state = ckpt::new_dict();
  List new_groups(c10::AnyType::get());
  for (size_t g = 0; g < layout.size(); ++g) {
    ckpt::Dict group = saved_groups[g].toGenericDict().copy();
    const int64_t id = group.at("params").toListRef().at(0).toInt();
    List ids(c10::AnyType::get());
    ids.push_back(static_cast<int64_t>(g));
    group.insert_or_assign("params", ids);
    new_groups.push_back(group);
    if (!base0.at("state").toGenericDict().contains(id)) continue;  // no step taken yet
    ckpt::Dict saved0 = base0.at("state").toGenericDict().at(id).toGenericDict();
    const int64_t part0 = first.single_partition_of_fp32_groups[g].numel() +
                          (first.group_paddings.size() > g ? first.group_paddings[g] : 0);
    ckpt::Dict entry = ckpt::new_dict();
    for (const auto& item : saved0) {
      const std::string key = item.key().toStringRef();
      const IValue& v0 = item.value();
      if (!(v0.isTensor() && v0.toTensor().dim() == 1 && v0.toTensor().numel() == part0)) {
        entry.insert(key, v0);
        continue;
      }
      std::vector<at::Tensor> parts;
      for (size_t r = 0; r < files.size(); ++r) {
        parts.push_back(base_of(r).at("state").toGenericDict().at(id).toGenericDict()
                            .at(key).toTensor());
      }
      runtime::SavedParams by_name;
      runtime::split_saved_group(at::cat(parts), shapes[g], source, &by_name);
      entry.insert(key, runtime::assemble_partition(layout[g], by_name,
                                                    v0.toTensor().scalar_type(), source));
    }
    new_state.insert(static_cast<int64_t>(g), entry);
  }
  ckpt::Dict base = ckpt::new_dict();
  base.insert("state", new_state);
  base.insert("param_groups", new_groups);
  out.optimizer_state = base;
  return out;
}

// What a load will apply, read and checked in full first.
struct LoadPlan {
  std::string model_file;
  ckpt::ModelStates states;
  IValue raw_states;
  bool load_optimizer = false;      // optimizer state (and masters, scaler) come from the file
  std::vector<at::Tensor> masters;  // per flat group, this rank's partition
  IValue optimizer_state;           // for optim::load_optimizer_state_dict
  std::optional<json> loss_scaler;
  std::optional<json> lr_scheduler;
  std::optional<at::Tensor> rng_state;
  std::string masters_note;
  std::optional<runtime::Zero3Restore> zero3;  // ZeRO-3: the shards, read and re-laid
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// save

IValue Engine::stage0_optimizer_state() {
  IValue base = optim::optimizer_state_dict(*optimizer_);
  const auto layout = zero_->flat_layout();
  if (layout.empty()) return base;  // fp32: the optimizer steps the parameters themselves
  // fp16/bf16 at stage 0: DeepSpeed's FP16_Optimizer state_dict (fp32 masters replicated),
  // plus our full loss-scaler state so that hysteresis resumes exactly.
  const json scaler = loss_scaler_ ? loss_scaler_->state_dict()
                                   : json{{"cur_scale", 1.0}, {"dynamic", false}, {"cur_iter", 0}};
  ckpt::Dict d = ckpt::new_dict();
  d.insert("dynamic_loss_scale", scaler.value("dynamic", false));
  d.insert("cur_scale", scaler.value("cur_scale", 1.0));
  d.insert("cur_iter", scaler.value("cur_iter", int64_t{0}));
  if (scaler.value("dynamic", false)) {
    d.insert("last_overflow_iter", scaler.at("last_overflow_iter").get<int64_t>());
    d.insert("scale_factor", scaler.at("scale_factor").get<double>());
    d.insert("scale_window", scaler.at("scale_window").get<int64_t>());
  }
  d.insert("optimizer_state_dict", base);
  List flats(c10::AnyType::get());
  for (size_t g = 0; g < layout.size(); ++g) {
    flats.push_back(zero_->master_partition(g).narrow(0, 0, layout[g].numel));
  }
  d.insert("fp32_groups_flat", flats);
  d.insert("clip_grad", config_.gradient_clipping);
  d.insert("loss_scaler", ckpt::ivalue_from_json(scaler));
  return d;
}

ckpt::LossScalerState Engine::scaler_state() const {
  ckpt::LossScalerState s = scaler_state_from_json(
      loss_scaler_ ? loss_scaler_->state_dict()
                   : json{{"cur_scale", 1.0}, {"dynamic", false}, {"cur_iter", 0}});
  s.dtype = model_dtype_;
  return s;
}

ckpt::ZeroOptimizerFile Engine::zero_optimizer_file() {
  ckpt::ZeroOptimizerStates z;
  z.loss_scaler = scaler_state();
  z.dynamic_loss_scale = z.loss_scaler.dynamic;
  z.clip_grad = config_.gradient_clipping;
  z.base_optimizer_state = optim::optimizer_state_dict(*optimizer_);
  z.zero_stage = static_cast<int64_t>(config_.zero_optimization.stage);
  z.ds_version = kDeepSpeedCompatVersion;
  z.python_objects = python_objects();
  const auto layout = zero_->flat_layout();
  for (size_t g = 0; g < layout.size(); ++g) {
    const auto& l = layout[g];
    const int64_t real = real_partition_numel(l);
    z.single_partition_of_fp32_groups.push_back(zero_->master_partition(g).narrow(0, 0, real));
    z.group_paddings.push_back(l.partition_numel - real);
    z.partition_count.push_back(l.partitions);
    torch::OrderedDict<std::string, ckpt::FragmentAddress> mapping;
    const int64_t begin = static_cast<int64_t>(l.partition) * l.partition_numel;
    int64_t offset = 0;
    for (const auto& [name, shape] : l.params) {
      const int64_t n = numel_of(shape);
      const int64_t a = std::max(offset, begin);
      const int64_t b = std::min(offset + n, begin + real);
      if (a < b) mapping.insert(name, ckpt::FragmentAddress{b - a, a - begin});
      offset += n;
    }
    z.param_slice_mappings.push_back(std::move(mapping));
  }
  ckpt::ZeroOptimizerFile f;
  f.optimizer_state_dict = std::move(z);
  f.ds_config = config_.raw;
  f.ds_version = kDeepSpeedCompatVersion;
  return f;
}

ckpt::ModelStates Engine::model_states(const ClientState& client_state,
                                       bool exclude_frozen_parameters) {
  ckpt::ModelStates m;
  m.module = ckpt::module_state_dict(*module_);
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
  const int stage = static_cast<int>(config_.zero_optimization.stage);
  if (optimizer_ && stage == 0) m.optimizer = stage0_optimizer_state();
  if (auto* zero3 = dynamic_cast<runtime::Stage3ZeroOptimizer*>(zero_.get())) {
    m.shared_params = shared_params_;
    runtime::fill_zero3_model_states(*zero3, *module_, exclude_frozen_parameters, &m);
  } else if (zero_ && stage > 0) {
    std::vector<ckpt::ShapeDict> shapes;
    for (const auto& l : zero_->flat_layout()) {
      ckpt::ShapeDict s;
      for (const auto& [name, shape] : l.params) s.insert(name, shape);
      shapes.push_back(std::move(s));
    }
    m.param_shapes = std::move(shapes);
    m.shared_params = shared_params_;
    // Matches DeepSpeed: frozen parameters are recorded from stage 2 on (zero_to_fp32 needs
    // them there), unless excluded.
    if (stage >= 2 && !exclude_frozen_parameters) {
      ckpt::ShapeDict frozen_shapes;
      ckpt::TensorDict fragments;
      for (const auto& p : module_->named_parameters()) {
        if (p.value().requires_grad() || frozen_shapes.contains(p.key())) continue;
        frozen_shapes.insert(p.key(), p.value().sizes().vec());
        fragments.insert(p.key(), p.value().detach());
      }
      m.frozen_param_shapes = std::move(frozen_shapes);
      m.frozen_param_fragments = std::move(fragments);
    }
  }
  if (lr_scheduler_) m.lr_scheduler = ckpt::ivalue_from_json(lr_scheduler_->state_dict());
  m.skipped_steps = skipped_steps_;
  m.global_steps = global_steps_;
  m.global_samples = global_samples_;
  m.dp_world_size = config_.batch.dp_world_size;
  m.mp_world_size = mp_group_.size();
  m.ds_config = config_.raw;
  m.ds_version = kDeepSpeedCompatVersion;
  m.client_state = client_state;
  return m;
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
    DS_CHECK(key != kRngStateKey, UsageError, "save_checkpoint: client_state key '", key,
             "' is reserved for the engine's RNG states");
  }
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
  // The model-states file: the first data-parallel rank of each model-parallel rank writes it
  // (as DeepSpeed's save_non_zero_checkpoint); `latest` and the directory: global rank 0.
  const bool rank0 = comm::get_rank() == 0;
  const bool dp_rank0 = dp_group_.rank() == 0;
  const int dp_rank = dp_group_.rank();
  const auto barrier = [] {
    if (comm::get_world_size() > 1) comm::barrier();
  };
  all_ranks_or_none("save_checkpoint(" + tag_dir + ") creating the directory", [&] {
    if (rank0) ckpt::create_directories(tag_dir);
  });
  // Gathered on every rank (a collective), written by rank 0.
  at::Tensor rng = gather_rng_states();
  auto* zero3 = dynamic_cast<runtime::Stage3ZeroOptimizer*>(zero_.get());
  SwappedIn swapped(zero3);
  all_ranks_or_none("save_checkpoint(" + tag_dir + ")", [&] {
    // ZeRO-3: every rank writes its own model states (its frozen shards, placeholders for the
    // partitioned parameters); otherwise data-parallel rank 0 writes the one file (one per
    // model-parallel rank).
    if (dp_rank0 || zero3) {
      ckpt::ModelStates m = model_states(client_state, exclude_frozen_parameters);
      List states(c10::AnyType::get());
      for (int64_t r = 0; r < rng.size(0); ++r) {
        ckpt::Dict d = ckpt::new_dict();
        d.insert("torch_rng_state", rng[r]);
        states.push_back(d);
      }
      m.client_state.emplace_back(kRngStateKey, IValue(states));
      ckpt::save(m.to_ivalue(),
                 tag_dir + "/" + (zero3 ? ckpt::zero3_model_states_file_name(dp_rank, mp_rank_)
                                        : ckpt::model_states_file_name(mp_rank_)));
    }
    if (optimizer_ && zero3) {
      const std::string file = ckpt::zero_optim_states_file_name(
          dp_rank, mp_rank_, config_.bf16.enabled);
      ckpt::save(runtime::zero3_optimizer_file(*zero3, *optimizer_, scaler_state(),
                                               python_objects(), config_.raw),
                 tag_dir + "/" + file);
    } else if (optimizer_ && config_.zero_optimization.stage > 0) {
      const std::string file = ckpt::zero_optim_states_file_name(
          dp_rank, mp_rank_, config_.bf16.enabled);
      ckpt::save(zero_optimizer_file().to_ivalue(), tag_dir + "/" + file);
    }
    // 1-bit optimizers: each rank's error-feedback buffers (no-op for other optimizers).
    if (optimizer_) onebit::save_rank_local_state(*optimizer_, tag_dir, dp_rank, mp_rank_);
  });
  ckpt::commit_checkpoint(save_dir, name, rank0, save_latest, barrier);
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
      ckpt::save(ckpt::ivalue_from_tensors(unique), path);
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
  std::optional<std::string> name = tag;
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
  const int world = dp_group_.size();  // the partition count this engine trains with
  const bool want_optimizer =
      optimizer_ && options.load_optimizer_states && !options.load_module_only;
  const bool want_scheduler =
      lr_scheduler_ && options.load_lr_scheduler_states && !options.load_module_only;

  auto* zero3 = dynamic_cast<runtime::Stage3ZeroOptimizer*>(zero_.get());
  SwappedIn swapped(zero3);
  LoadPlan plan;
  all_ranks_or_none("load_checkpoint(" + tag_dir + ")", [&] {
    DS_CHECK(is_directory(load_dir), CheckpointError, "load_checkpoint: checkpoint directory ",
             load_dir, " does not exist");
    DS_CHECK(is_directory(tag_dir), CheckpointError, "load_checkpoint: no checkpoint with tag '",
             *name, "' in ", load_dir, " (no directory ", tag_dir, ")");
    if (zero3) {
      // The weights come from the fp32 shards (re-laid for this world size when needed).
      plan.zero3 = runtime::read_zero3_checkpoint(*zero3, tag_dir, config_.bf16.enabled,
                                                  want_optimizer, mp_rank_);
      plan.model_file = plan.zero3->model_file;
      plan.raw_states = ckpt::load(plan.model_file);
      plan.states = plan.zero3->states;
      std::set<std::string> partitioned;
      for (const auto& p : module_->named_parameters()) partitioned.insert(p.key());
      check_module_state(*module_, plan.states.module, options.load_module_strict,
                         plan.model_file, &partitioned);
      plan.masters_note = plan.zero3->saved_world == world
                              ? "fp32 master shards"
                              : "fp32 master shards re-partitioned from " +
                                    std::to_string(plan.zero3->saved_world) + " to " +
                                    std::to_string(world) + " ranks";
      if (want_optimizer) {
        plan.load_optimizer = true;
        plan.optimizer_state = plan.zero3->optimizer_state;
        plan.loss_scaler = scaler_state_to_json(plan.zero3->loss_scaler);
      }
    } else {
      plan.model_file = tag_dir + "/" + ckpt::model_states_file_name(mp_rank_);
      plan.raw_states = ckpt::load(plan.model_file);
      plan.states = ckpt::ModelStates::from_ivalue(plan.raw_states, plan.model_file);
      check_module_state(*module_, plan.states.module, options.load_module_strict,
                         plan.model_file);
    }

    const int saved_stage = saved_zero_stage(plan.states);
    if (want_optimizer && !zero3) {
      DS_CHECK(saved_stage == stage, CheckpointError, plan.model_file,
               ": the checkpoint was written with zero_optimization.stage ", saved_stage,
               ", this engine runs stage ", stage,
               "; its optimizer state cannot be loaded: load with load_optimizer_states=false "
               "(weights only) or run the saving stage");
      plan.load_optimizer = true;
    }
    if (want_scheduler) {
      DS_CHECK(!plan.states.lr_scheduler.isNone(), CheckpointError, plan.model_file,
               ": has no lr_scheduler state (part 'lr_scheduler') but this engine has a "
               "scheduler; load with load_lr_scheduler_states=false to keep it fresh");
      plan.lr_scheduler = ckpt::json_from_ivalue(plan.states.lr_scheduler, plan.model_file +
                                                                         ": lr_scheduler");
    }
    for (const auto& [key, value] : plan.states.client_state) {
      if (key != kRngStateKey || options.load_module_only) continue;
      const auto list = value.toListRef();
      // Indexed by global rank: every process has its own generator.
      if (static_cast<int>(list.size()) == comm::get_world_size()) {
        plan.rng_state = list[static_cast<size_t>(comm::get_rank())]
                             .toGenericDict().at("torch_rng_state").toTensor();
      }
    }
    if (!plan.load_optimizer || zero3) return;

    const auto layout = zero_ ? zero_->flat_layout() : std::vector<runtime::FlatGroupLayout>{};
    if (stage == 0) {
      DS_CHECK(!plan.states.optimizer.isNone(), CheckpointError, plan.model_file,
               ": has no optimizer state (part 'optimizer'); load with "
               "load_optimizer_states=false");
      if (layout.empty()) {
        plan.optimizer_state = plan.states.optimizer;
        return;
      }
      // 16-bit stage 0: FP16_Optimizer's dict with replicated fp32 masters.
      ckpt::Dict d = plan.states.optimizer.toGenericDict();
      DS_CHECK(d.contains("fp32_groups_flat") && d.contains("optimizer_state_dict"),
               CheckpointError, plan.model_file,
               ": 'optimizer' has no fp32_groups_flat/optimizer_state_dict (part 'fp32 master "
               "weights'): written without fp16/bf16?");
      auto flats = d.at("fp32_groups_flat").toListRef();
      DS_CHECK(flats.size() == layout.size(), CheckpointError, plan.model_file, ": ",
               flats.size(), " fp32 master groups, this engine has ", layout.size());
      for (size_t g = 0; g < layout.size(); ++g) {
        const at::Tensor t = flats[g].toTensor();
        DS_CHECK(t.numel() == layout[g].numel, CheckpointError, plan.model_file,
                 ": fp32_groups_flat[", g, "] has ", t.numel(), " elements, the model's group ",
                 layout[g].numel);
        plan.masters.push_back(padded_to(t, layout[g].partition_numel, plan.model_file));
      }
      plan.optimizer_state = d.at("optimizer_state_dict");
      if (d.contains("loss_scaler")) {
        plan.loss_scaler = ckpt::json_from_ivalue(d.at("loss_scaler"), plan.model_file);
      }
      plan.masters_note = "fp32 master weights";
      return;
    }

    // ZeRO 1/2: this rank's file when the layout is the same, else every saved rank's.
    DS_CHECK(plan.states.param_shapes.has_value(), CheckpointError, plan.model_file,
             ": has no param_shapes, so it is not a ZeRO checkpoint");
    const auto& shapes = *plan.states.param_shapes;
    const bool bf16 = config_.bf16.enabled;
    const auto read = [&](int r, std::string* path) {
      *path = ckpt::find_zero_optim_states_file(tag_dir, r, mp_rank_, bf16);
      return ckpt::ZeroOptimizerFile::from_ivalue(ckpt::load(*path), *path);
    };
    std::string path0;
    ckpt::ZeroOptimizerFile file0 = read(0, &path0);
    int64_t saved_world = 0;
    for (int64_t c : file0.optimizer_state_dict.partition_count) saved_world = std::max(saved_world, c);
    bool same = saved_world == world && shapes.size() == layout.size();
    for (size_t g = 0; same && g < layout.size(); ++g) {
      same = runtime::same_layout(layout[g], shapes[g], saved_world);
    }
    ckpt::ZeroOptimizerStates z;
    if (same) {
      std::string path = path0;
      const int dp_rank = dp_group_.rank();
      ckpt::ZeroOptimizerFile own = dp_rank == 0 ? file0 : read(dp_rank, &path);
      own.optimizer_state_dict.check_partition_count(world, path);
      const auto& parts = own.optimizer_state_dict.single_partition_of_fp32_groups;
      DS_CHECK(parts.size() == layout.size(), CheckpointError, path, ": ", parts.size(),
               " fp32 partition groups, the model has ", layout.size());
      for (size_t g = 0; g < layout.size(); ++g) {
        DS_CHECK(parts[g].numel() == real_partition_numel(layout[g]), CheckpointError, path,
                 ": fp32 partition ", g, " has ", parts[g].numel(), " elements, expected ",
                 real_partition_numel(layout[g]));
        plan.masters.push_back(padded_to(parts[g], layout[g].partition_numel, path));
      }
      plan.optimizer_state = own.optimizer_state_dict.base_optimizer_state;
      z = own.optimizer_state_dict;
      plan.masters_note = "fp32 master partitions";
    } else {
      // Re-partition: as many files as the checkpoint's ranks, no more (an old save's extra
      // rank files in the same tag directory would be a different checkpoint).
      char mp_suffix[64];  // this model-parallel rank's files only
      std::snprintf(mp_suffix, sizeof mp_suffix, "mp_rank_%02d_optim_states.pt", mp_rank_);
      const auto present = ckpt::list_files_with_suffix(tag_dir, mp_suffix);
      DS_CHECK(static_cast<int64_t>(present.size()) == saved_world, CheckpointError, tag_dir,
               ": expected ", saved_world, " '*_optim_states.pt' files (partition_count) but "
               "found ", present.size(), "; possibly an overwrite of an old checkpoint");
      std::vector<ckpt::ZeroOptimizerFile> files{file0};
      std::vector<std::string> paths{path0};
      for (int r = 1; r < saved_world; ++r) {
        std::string p;
        files.push_back(read(r, &p));
        paths.push_back(p);
      }
      auto re = repartition(files, paths, shapes, layout);
      plan.masters = std::move(re.masters);
      plan.optimizer_state = re.optimizer_state;
      z = file0.optimizer_state_dict;
      plan.masters_note = "fp32 master partitions re-partitioned from " +
                          std::to_string(saved_world) + " to " + std::to_string(world) + " ranks";
    }
    plan.loss_scaler = scaler_state_to_json(z.loss_scaler);
  });

  // Apply. The optimizer first: its loader checks everything before it assigns anything.
  std::vector<std::string> restored;
  if (plan.load_optimizer) {
    optim::load_optimizer_state_dict(*optimizer_, plan.optimizer_state);
    restored.push_back("optimizer state");
  }
  if (zero3) {
    // Buffers from the module; the parameters from the fp32 shards (the file holds
    // placeholders for them).
    ckpt::TensorDict buffers;
    for (const auto& b : ckpt::module_buffer_names(*module_)) {
      if (const at::Tensor* t = plan.states.module.find(b)) buffers.insert(b, *t);
    }
    ckpt::load_module_state_dict(*module_, buffers, /*strict=*/false, plan.model_file);
    runtime::apply_zero3_restore(*zero3, *plan.zero3);
    restored.insert(restored.begin(), {"module", plan.masters_note});
  } else {
    ckpt::load_module_state_dict(*module_, plan.states.module, options.load_module_strict,
                                 plan.model_file);
    restored.insert(restored.begin(), "module");
  }
  if (zero_ && !zero3) {
    at::NoGradGuard no_grad;
    if (!plan.masters.empty() && config_.zero_optimization.load_from_fp32_weights) {
      for (size_t g = 0; g < plan.masters.size(); ++g) {
        zero_->master_partition(g).copy_(plan.masters[g]);
      }
      restored.push_back(plan.masters_note);
    } else {
      // Matches DeepSpeed (_restore_from_bit16_weights / refresh_fp32_params).
      zero_->params_to_masters();
      if (!zero_->flat_layout().empty()) restored.push_back("fp32 masters from the weights");
    }
  }
  if (plan.load_optimizer) {
    // 1-bit optimizers: this rank's error feedback (and 0/1 Adam's local parameters), after
    // the module so that rank-local parameters win over data-parallel rank 0's.
    onebit::load_rank_local_state(*optimizer_, tag_dir, dp_group_.rank(), mp_rank_);
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
                                           plan.load_optimizer && stage == 0);
  (void)out.client_state.erase(kRngStateKey);
  std::ostringstream keys;
  size_t i = 0;
  for (const auto& [key, value] : plan.states.client_state) {
    if (key != kRngStateKey) keys << (i++ ? ", " : "") << key;
  }
  if (i) restored.push_back("client state [" + keys.str() + "]");
  std::ostringstream os;
  os << "loaded checkpoint " << tag_dir << ": ";
  for (size_t k = 0; k < restored.size(); ++k) os << (k ? ", " : "") << restored[k];
  log::info_rank0(os.str());
  return out;
}

}  // namespace deepspeed
