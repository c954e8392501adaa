// PipelineModule: which layers this rank's stage builds, the tied-layer groups and the process
// groups of the pipe x data topology. Partitioning lives in partition.cpp, execution in
// pipeline_engine.cpp.
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include <torch/torch.h>

#include "deepspeed/checkpointing.h"
#include "deepspeed/errors.h"
#include "deepspeed/pipe.h"
#include "runtime/pipe/pipe_engine_mpu.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::pipe {

LayerSpec LayerSpec::function(std::string type_name,
                              std::function<at::Tensor(const at::Tensor&)> fn) {
  LayerSpec s;
  s.type_name = std::move(type_name);
  s.build = [fn]() { return Layer{nullptr, fn, {}}; };
  return s;
}

LayerSpec TiedLayerSpec(std::string key, LayerSpec spec,
                        std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> forward_fn,
                        std::vector<std::string> tied_weight_attr) {
  DS_CHECK(!key.empty(), UsageError, "TiedLayerSpec: the key must not be empty");
  spec.tied_key = std::move(key);
  spec.tied_forward = std::move(forward_fn);
  spec.tied_weight_attr = std::move(tied_weight_attr);
  return spec;
}

PipelineModule::PipelineModule(std::vector<LayerSpec> layers, PipelineModuleOptions options)
    : specs_(std::move(layers)), options_(std::move(options)) {
  if (!comm::is_initialized()) comm::init_distributed();
  const int world = comm::get_world_size();
  DS_CHECK(!specs_.empty(), ConfigError, "PipelineModule: the layer list is empty");
  if (options_.topology) {
    num_stages_ = options_.topology->get_dim("pipe");
    DS_CHECK(options_.num_stages == 0 || options_.num_stages == num_stages_, ConfigError,
             "PipelineModule: num_stages (", options_.num_stages,
             ") differs from the topology's pipe dimension (", num_stages_, ")");
  } else {
    num_stages_ = options_.num_stages;
    DS_CHECK(num_stages_ >= 1, ConfigError, "PipelineModule: num_stages is ", num_stages_,
             "; give num_stages >= 1 or a topology");
    DS_CHECK(world % num_stages_ == 0, ConfigError, "PipelineModule: num_stages (", num_stages_,
             ") must divide the world size (", world, "); the data-parallel size is world / "
             "num_stages, so launch a multiple of ", num_stages_, " ranks");
    options_.topology = PipeDataParallelTopology(num_stages_, world / num_stages_);
  }
  DS_CHECK(options_.activation_checkpoint_interval >= 0, ConfigError,
           "PipelineModule: activation_checkpoint_interval is ",
           options_.activation_checkpoint_interval, "; expected >= 0 (0 disables)");
  // Every check that can fail on one rank alone comes before the first collective.
  parts_ = partition_layers(specs_, options_.partition_method, num_stages_);
  for (const auto& line : describe_partition(specs_, parts_, options_.partition_method)) {
    log::info_rank0(line);
  }
  mpu_ = std::make_shared<TopologyMpu>(*options_.topology);
  engine_mpu_ = std::make_shared<PipeEngineMpu>(mpu_->groups());
  stage_id_ = mpu_->groups().coord("pipe");
  build_local_layers();
  index_tied_modules();
  synchronize_tied_weights();
}

void PipelineModule::build_local_layers() {
  // DeepSpeed registers its tied_modules container before any layer, so a stage's parameters
  // (and the optimizer state saved by position) list the tied modules first.
  std::shared_ptr<torch::nn::Module> tied_parent;
  for (int idx = local_start(); idx < local_stop(); ++idx) {
    if (!specs_[idx].tied_key.empty()) {
      tied_parent = register_module("tied_modules", std::make_shared<torch::nn::Module>());
      break;
    }
  }
  for (int idx = local_start(); idx < local_stop(); ++idx) {
    const LayerSpec& spec = specs_[idx];
    if (options_.seed_layers) torch::manual_seed(static_cast<uint64_t>(options_.base_seed + idx));
    if (!spec.tied_key.empty()) {
      auto it = std::find_if(tied_modules_.begin(), tied_modules_.end(),
                             [&](const auto& kv) { return kv.first == spec.tied_key; });
      std::function<at::Tensor(const at::Tensor&)> owner_forward;
      std::shared_ptr<torch::nn::Module> module;
      if (it == tied_modules_.end()) {
        Layer built = spec.build();
        DS_CHECK(built.module != nullptr, UsageError, "TiedLayerSpec '", spec.tied_key,
                 "' (layer ", idx, ") built no module; a tied layer must hold parameters");
        tied_parent->register_module(spec.tied_key, built.module);
        tied_modules_.emplace_back(spec.tied_key, built.module);
        module = built.module;
        owner_forward = built.forward;
        tied_forwards_.emplace_back(spec.tied_key, built.forward);
      } else {
        module = it->second;
        for (const auto& kv : tied_forwards_) {
          if (kv.first == spec.tied_key) owner_forward = kv.second;
        }
      }
      if (spec.tied_forward) {
        auto fn = spec.tied_forward;
        forward_funcs_.push_back([fn, module](const at::Tensor& x) { return fn(*module, x); });
      } else {
        forward_funcs_.push_back(owner_forward);
      }
      // Matches DeepSpeed: a tied layer without forward_fn is the shared module itself, and
      // its state is saved as this layer's; with forward_fn it is a function and has none.
      local_modules_.push_back(spec.tied_forward ? nullptr : module);
      local_has_parameters_.push_back(!module->parameters().empty());
      local_aux_losses_.emplace_back();
      continue;
    }
    Layer built = spec.build();
    DS_CHECK(built.forward != nullptr, UsageError, "LayerSpec '", spec.type_name, "' (layer ", idx,
             ") built a layer without a forward");
    if (built.module) register_module(std::to_string(idx), built.module);
    forward_funcs_.push_back(built.forward);
    local_modules_.push_back(built.module);
    local_has_parameters_.push_back(built.module && !built.module->parameters().empty());
    local_aux_losses_.push_back(built.aux_loss);
  }
}

at::Tensor PipelineModule::tied_weight(torch::nn::Module& m, const std::string& attr) {
  auto params = m.named_parameters(true);
  const at::Tensor* found = params.find(attr);
  DS_CHECK(found != nullptr, UsageError, "TiedLayerSpec: the tied module has no parameter '",
           attr, "' (tied_weight_attr)");
  return *found;
}

void PipelineModule::index_tied_modules() {
  if (num_stages_ == 1) return;
  std::set<std::string> keys;
  for (const auto& s : specs_) {
    if (!s.tied_key.empty()) keys.insert(s.tied_key);
  }
  const ProcessTopology& topo = *options_.topology;
  const int me = comm::get_rank();
  // Matches DeepSpeed: keys in sorted order, one group per data-parallel index (and, with
  // tensor parallelism, per tensor-parallel index), made on every rank in the same order.
  const bool model_axis = topo.has_axis("model");
  for (const auto& key : keys) {
    std::set<int> stages;
    for (int idx = 0; idx < num_layers(); ++idx) {
      if (specs_[idx].tied_key == key) stages.insert(stage_owner(idx));
    }
    for (int dp = 0; dp < topo.get_dim("data"); ++dp) {
      for (int mp = 0; mp < topo.get_dim("model"); ++mp) {
        std::vector<int> ranks;
        for (int s : stages) {
          std::map<std::string, int> coord = {{"pipe", s}, {"data", dp}};
          if (model_axis) coord["model"] = mp;
          ranks.push_back(topo.get_rank(coord));
        }
        comm::Group group = comm::new_group(ranks, "tied_" + key);
        if (std::find(ranks.begin(), ranks.end(), me) == ranks.end()) continue;
        for (const auto& kv : tied_modules_) {
          if (kv.first == key) tied_comms_.push_back({key, ranks, group, kv.second});
        }
      }
    }
  }
}

void PipelineModule::synchronize_tied_weights() {
  torch::NoGradGuard no_grad;
  for (auto& tc : tied_comms_) {
    if (tc.ranks.size() < 2) continue;
    const auto& attrs = [&]() -> const std::vector<std::string>& {
      for (const auto& s : specs_) {
        if (s.tied_key == tc.key) return s.tied_weight_attr;
      }
      return specs_.front().tied_weight_attr;
    }();
    for (const auto& attr : attrs) {
      at::Tensor w = tied_weight(*tc.module, attr);
      at::Tensor flat = w.is_contiguous() ? w : w.contiguous();
      comm::broadcast(flat, tc.ranks.front(), false, tc.group);
      if (!flat.is_same(w)) w.copy_(flat);
    }
  }
}

void PipelineModule::allreduce_tied_weight_gradients(
    const std::function<at::Tensor(const at::Tensor&)>& grad_of) {
  for (auto& tc : tied_comms_) {
    if (tc.ranks.size() < 2) continue;
    for (const auto& s : specs_) {
      if (s.tied_key != tc.key) continue;
      for (const auto& attr : s.tied_weight_attr) {
        at::Tensor w = tied_weight(*tc.module, attr);
        at::Tensor g = grad_of ? grad_of(w) : at::Tensor();
        if (!g.defined()) {
          if (!w.grad().defined()) w.mutable_grad() = at::zeros_like(w);
          g = w.grad();
        }
        comm::all_reduce(g, comm::ReduceOp::kSum, false, tc.group);
      }
      break;
    }
  }
}

std::vector<at::Tensor> PipelineModule::replicated_tied_parameters() const {
  std::vector<at::Tensor> out;
  const int me = comm::get_rank();
  for (const auto& tc : tied_comms_) {
    if (tc.ranks.size() < 2 || tc.ranks.front() == me) continue;
    for (const auto& s : specs_) {
      if (s.tied_key != tc.key) continue;
      for (const auto& attr : s.tied_weight_attr) out.push_back(tied_weight(*tc.module, attr));
      break;
    }
  }
  return out;
}

int PipelineModule::stage_owner(int layer_idx) const {
  DS_CHECK(layer_idx >= 0 && layer_idx < num_layers(), UsageError, "PipelineModule: layer ",
           layer_idx, " is outside [0, ", num_layers(), ")");
  for (int s = 0; s < num_stages_; ++s) {
    if (parts_[s] <= layer_idx && layer_idx < parts_[s + 1]) return s;
  }
  DS_INTERNAL_ASSERT(false, "layer ", layer_idx, " has no owning stage");
  return -1;
}

std::shared_ptr<torch::nn::Module> PipelineModule::layer_module(int layer_idx) const {
  if (layer_idx < local_start() || layer_idx >= local_stop()) return nullptr;
  return local_modules_[static_cast<size_t>(layer_idx - local_start())];
}

std::vector<std::pair<int, std::shared_ptr<torch::nn::Module>>>
PipelineModule::tied_layers_elsewhere() const {
  std::vector<std::pair<int, std::shared_ptr<torch::nn::Module>>> out;
  for (const auto& [key, module] : tied_modules_) {
    int first = -1;
    bool local = false;
    for (int idx = 0; idx < num_layers(); ++idx) {
      if (specs_[idx].tied_key != key || specs_[idx].tied_forward) continue;
      if (first < 0) first = idx;
      local = local || (idx >= local_start() && idx < local_stop());
    }
    if (first >= 0 && !local) out.emplace_back(first, module);
  }
  return out;
}

void PipelineModule::set_activation_checkpoint_interval(int interval) {
  DS_CHECK(interval >= 0, ConfigError, "PipelineModule: activation_checkpoint_interval is ",
           interval, "; expected >= 0 (0 disables)");
  options_.activation_checkpoint_interval = interval;
}

bool PipelineModule::has_aux_loss() const {
  return std::any_of(local_aux_losses_.begin(), local_aux_losses_.end(),
                     [](const auto& f) { return f != nullptr; });
}

at::Tensor PipelineModule::run_layers(size_t begin, size_t end, const at::Tensor& input,
                                      at::Tensor* aux) {
  at::Tensor x = input;
  for (size_t i = begin; i < end; ++i) {
    x = forward_funcs_[i](x);
    if (!local_aux_losses_[i]) continue;
    at::Tensor a = local_aux_losses_[i]();
    const int layer = local_start() + static_cast<int>(i);
    DS_CHECK(a.defined(), UsageError, "PipelineModule: layer ", layer,
             "'s aux_loss gave no tensor; expected a scalar");
    DS_CHECK(a.numel() == 1, UsageError, "PipelineModule: layer ", layer,
             "'s aux_loss gave shape ", a.sizes(), "; expected a scalar");
    a = a.reshape({});
    *aux = aux->defined() ? *aux + a : a;
  }
  return x;
}

at::Tensor PipelineModule::forward(const at::Tensor& input) {
  aux_loss_ = at::Tensor();
  const auto interval = static_cast<size_t>(options_.activation_checkpoint_interval);
  if (interval == 0) return run_layers(0, forward_funcs_.size(), input, &aux_loss_);
  // As DeepSpeed's PipelineModule: each run of `interval` consecutive local layers is one
  // checkpoint() call, so only its input is kept and the run is recomputed in backward. A run
  // without parameters (say, a reshape) has nothing to recompute for and runs plainly.
  at::Tensor x = input;
  for (size_t begin = 0; begin < forward_funcs_.size(); begin += interval) {
    const size_t end = std::min(begin + interval, forward_funcs_.size());
    bool has_parameters = false;
    for (size_t i = begin; i < end; ++i) has_parameters = has_parameters || local_has_parameters_[i];
    if (!has_parameters || !at::GradMode::is_enabled()) {
      x = run_layers(begin, end, x, &aux_loss_);
      continue;
    }
    // The checkpointed run builds no graph: its auxiliary losses become outputs of the
    // checkpoint, connected to the layers through the recomputation.
    const bool with_aux = std::any_of(local_aux_losses_.begin() + static_cast<ptrdiff_t>(begin),
                                      local_aux_losses_.begin() + static_cast<ptrdiff_t>(end),
                                      [](const auto& f) { return f != nullptr; });
    auto out = checkpointing::checkpoint(
        [this, begin, end, with_aux](const std::vector<at::Tensor>& in) {
          at::Tensor aux;
          at::Tensor y = run_layers(begin, end, in[0], &aux);
          return with_aux ? std::vector<at::Tensor>{y, aux} : std::vector<at::Tensor>{y};
        },
        {x});
    x = out[0];
    if (with_aux) aux_loss_ = aux_loss_.defined() ? aux_loss_ + out[1] : out[1];
  }
  return x;
}

}  // namespace deepspeed::pipe
