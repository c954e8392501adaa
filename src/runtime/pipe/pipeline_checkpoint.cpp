// PipelineEngine's checkpoints: DeepSpeed's per-layer files beside the base engine's per-stage
// files, and loading the layer files onto another number of stages. The files' format and
// atomic writing are runtime/checkpoint's.
#include <cstdio>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/moe.h"
#include "deepspeed/pipe.h"
#include "runtime/checkpoint/shared_file_writers.h"
#include "runtime/tensor_parallel/engine_autotp.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::pipe {
namespace {

// DeepSpeed's ckpt_layer_path, with the rank's tensor-parallel coordinate in 3D.
std::string layer_file_name(int layer_idx, const std::optional<comm::Group>& tp) {
  return checkpoint::layer_file_name(layer_idx, tp && tp->size() > 1 ? tp->rank() : -1);
}

checkpoint::TensorDict layer_state(torch::nn::Module& m) {
  checkpoint::TensorDict sd;
  for (const auto& p : m.named_parameters(true)) sd.insert(p.key(), p.value().detach());
  for (const auto& b : m.named_buffers(true)) sd.insert(b.key(), b.value().detach());
  return sd;
}

int stages_in(const std::string& tag_dir) {
  int n = 0;
  for (const auto& path : checkpoint::list_files_with_suffix(tag_dir, "_model_states.pt")) {
    const std::string name = path.substr(path.find_last_of('/') + 1);
    if (name.rfind("mp_rank_", 0) == 0) ++n;
  }
  return n;
}

}  // namespace

std::pair<int, int> PipelineEngine::layers_to_write() const {
  // DeepSpeed's PipelineModule.save_state_dict: the stage's first data-parallel replica writes
  // its layer files, or with checkpoint.parallel_write.pipeline_stage the replicas split them
  // (partition_uniform). With checkpoint.use_node_local_storage, the replicas of each node do
  // (Note [Node-local checkpoint storage]).
  const auto& options = config().checkpoint;
  const int start = pipe_module_->local_start();
  const std::vector<int> writers = checkpoint::shared_file_writers(
      seq_data_parallel_group(), options.use_node_local_storage);
  const auto [first, last] =
      checkpoint::shared_files_to_write(pipe_module_->local_stop() - start, writers,
                                        comm::get_rank(), options.parallel_write_pipeline_stage);
  return {start + first, start + last};
}

bool PipelineEngine::save_checkpoint(const std::string& save_dir,
                                     const std::optional<std::string>& tag,
                                     const ClientState& client_state) {
  DS_CHECK(!save_dir.empty(), UsageError, "save_checkpoint: save_dir is empty");
  commit_decoupled_checkpoint();  // before this save's layer files join the writer's queue
  // 3D: the T tensor-parallel ranks of a stage write their own shards, named as DeepSpeed's
  // (layer_XX-model_YY-..., and mp_rank_<stage * T + tp rank> by the base engine).
  const auto tp = runtime::tensor_parallel_group_of(module().parameters());
  const std::string t = tag ? *tag : checkpoint::default_tag(global_steps());
  const std::string dir = checkpoint::tag_directory(save_dir, t);
  // Layer files first: `latest` moves at the end of the base engine's save, after every rank
  // wrote everything.
  const auto [start, stop] = layers_to_write();
  std::vector<std::pair<int, std::shared_ptr<torch::nn::Module>>> layers;
  for (int idx = start; idx < stop; ++idx) {
    if (auto m = pipe_module_->layer_module(idx)) layers.emplace_back(idx, m);
  }
  // Note [Node-local checkpoint storage]: a node's folder also needs the tied modules whose
  // layer file another stage writes (the last stage's head tied to the first's embedding);
  // their copies are equal, so a node holding both stages writes the same bytes twice.
  const auto& options = config().checkpoint;
  if (options.use_node_local_storage &&
      checkpoint::writes_shared_files(seq_data_parallel_group(), /*node_local=*/true)) {
    for (const auto& tied : pipe_module_->tied_layers_elsewhere()) layers.push_back(tied);
  }
  if (!layers.empty()) {
    comm::PhaseScope phase(comm::Phase::kCheckpoint);
    checkpoint::create_directories(dir);
    const checkpoint::FileSaver save_file = checkpoint_file_saver();
    for (const auto& [idx, m] : layers) {
      save_file(checkpoint::ivalue_from_tensors(layer_state(*m)),
                dir + "/" + layer_file_name(idx, tp));
    }
  }
  return Engine::save_checkpoint(save_dir, t, client_state);
}

checkpoint::TensorDict PipelineEngine::read_layer_files(const std::string& tag_dir,
                                                        const std::string& model_file) const {
  (void)model_file;  // the layer files name themselves in errors
  std::vector<std::string> names;
  for (const auto& item : checkpoint::module_state_dict(*pipe_module_)) names.push_back(item.key());
  const auto tp = runtime::tensor_parallel_group_of(pipe_module_->parameters());
  return checkpoint::module_from_layer_files(tag_dir, names,
                                             tp && tp->size() > 1 ? tp->rank() : -1);
}

LoadedCheckpoint PipelineEngine::load_checkpoint(const std::string& load_dir,
                                                 const std::optional<std::string>& tag,
                                                 const LoadCheckpointOptions& options) {
  // A universal checkpoint names every parameter by its global layer index, so each stage
  // reads its own layers' weights and optimizer state whatever the saving run's stage count.
  if (config().checkpoint.load_universal) return Engine::load_checkpoint(load_dir, tag, options);
  std::optional<std::string> t = tag ? tag : checkpoint::read_latest(load_dir);
  if (!t) return Engine::load_checkpoint(load_dir, tag, options);  // warns, loads nothing
  const std::string dir = checkpoint::tag_directory(load_dir, *t);
  // mp_rank_XX files: one per stage and tensor-parallel rank.
  const auto tp = runtime::tensor_parallel_group_of(module().parameters());
  const int tp_size = tp ? tp->size() : 1;
  const int saved_stages = stages_in(dir) / tp_size;
  // Note [Node-local checkpoint storage]: a node's folder holds the files of its own stages
  // only, so it cannot count the saving run's; such a checkpoint resumes on the same layout.
  if (saved_stages == num_stages() || config().checkpoint.use_node_local_storage) {
    return Engine::load_checkpoint(load_dir, t, options);
  }
  // Each expert lives on one data-parallel rank of its stage; the layer files have rank 0's.
  DS_CHECK(moe::moe_layers(module()).empty(), NotSupportedError, "checkpoint ", dir,
           ": written by ", saved_stages, " pipeline stages, this job has ", num_stages(),
           "; a pipeline with MoE layers resumes on the same number of stages, or onto another "
           "through a universal checkpoint (ds_to_universal, then checkpoint.load_universal)");
  DS_CHECK(tp_size == 1, NotSupportedError, "checkpoint ", dir, ": loading a pipeline with "
           "tensor parallelism inside its stages onto another number of stages takes a "
           "universal checkpoint (ds_to_universal, then checkpoint.load_universal)");

  DS_CHECK(saved_stages > 0, CheckpointError, "checkpoint ", dir,
           ": no mp_rank_XX_model_states.pt file; is this a checkpoint directory?");
  DS_CHECK(options.load_module_only, CheckpointError, "checkpoint ", dir, ": written by ",
           saved_stages, " pipeline stages, this job has ", num_stages(),
           "; optimizer states are per stage and cannot move, so load the weights alone from the "
           "layer files (LoadCheckpointOptions::load_module_only = true)");
  DS_CHECK(zero_optimization_stage() == 0 && model_dtype() == at::kFloat, NotSupportedError,
           "checkpoint ", dir, ": loading onto another number of stages (", saved_stages, " -> ",
           num_stages(), ") is implemented for ZeRO stage 0 in fp32 (the parameters are what the "
           "optimizer steps); this job uses ZeRO stage ", zero_optimization_stage());
  {
    torch::NoGradGuard no_grad;
    comm::PhaseScope phase(comm::Phase::kCheckpoint);
    for (int idx = pipe_module_->local_start(); idx < pipe_module_->local_stop(); ++idx) {
      auto m = pipe_module_->layer_module(idx);
      if (!m) continue;
      const std::string path = dir + "/" + layer_file_name(idx, tp);
      checkpoint::TensorDict saved =
          checkpoint::tensors_from_ivalue(checkpoint::load(path), path);
      checkpoint::TensorDict mine = layer_state(*m);
      for (const auto& item : mine) {
        const at::Tensor* s = saved.find(item.key());
        DS_CHECK(s != nullptr, CheckpointError, "checkpoint ", path, ": no entry '", item.key(),
                 "' for layer ", idx);
        DS_CHECK(s->sizes() == item.value().sizes(), CheckpointError, "checkpoint ", path, ": '",
                 item.key(), "' has shape ", s->sizes(), ", layer ", idx, " has ",
                 item.value().sizes());
        item.value().copy_(*s);
      }
      DS_CHECK(saved.size() == mine.size() || !options.load_module_strict, CheckpointError,
               "checkpoint ", path, ": ", saved.size(), " entries, layer ", idx, " has ",
               mine.size(), " (load_module_strict)");
    }
  }
  pipe_module_->synchronize_tied_weights();
  log::info_rank0("loaded the layer files of " + dir + " (" + std::to_string(saved_stages) +
                  " stages) onto " + std::to_string(num_stages()) + " stages (weights only)");
  LoadedCheckpoint out;
  out.load_path = dir;
  return out;
}

}  // namespace deepspeed::pipe
