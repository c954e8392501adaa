// Checkpoint files of the 1-bit optimizers' rank-local state (the error-feedback buffers), which
// the replicated stage-0 optimizer state written by rank 0 cannot hold.
#include <cstdio>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/onebit.h"
#include "util/check.h"

namespace deepspeed::onebit {
namespace {

// The optimizer's rank-local tensors by "<parameter index>.<state name>", indices counting
// parameters across groups (as in state dicts).
std::vector<std::pair<std::string, at::Tensor*>> rank_local_tensors(torch::optim::Optimizer& o) {
  std::vector<std::pair<std::string, at::Tensor*>> out;
  auto* ds = dynamic_cast<optim::DsOptimizer*>(&o);
  auto* cc = dynamic_cast<CompressedCommunication*>(&o);
  if (ds == nullptr || cc == nullptr) return out;
  const auto names = cc->rank_local_state_names();
  int64_t index = 0;
  for (auto& group : ds->param_groups()) {
    for (auto& p : group.params()) {
      if (cc->rank_local_parameters()) out.emplace_back(std::to_string(index) + ".param", &p);
      if (auto* s = ds->find_state(p)) {
        for (const auto& name : names) {
          // OnebitLamb keeps its flat error buffers with its first parameter only.
          if (!s->tensor(name).defined()) continue;
          out.emplace_back(std::to_string(index) + "." + name, &s->tensor(name));
        }
      }
      ++index;
    }
  }
  return out;
}

}  // namespace

std::string rank_local_state_file_name(int dp_rank, int mp_rank) {
  char mp[16];
  std::snprintf(mp, sizeof(mp), "%02d", mp_rank);
  return "onebit_error_feedback_dp_rank_" + std::to_string(dp_rank) + "_mp_rank_" + mp + ".pt";
}

void save_rank_local_state(torch::optim::Optimizer& optimizer, const std::string& tag_dir,
                           int dp_rank, int mp_rank, const checkpoint::FileSaver& save_file) {
  if (dynamic_cast<CompressedCommunication*>(&optimizer) == nullptr) return;
  checkpoint::TensorDict d;
  for (auto& [key, t] : rank_local_tensors(optimizer)) d.insert(key, t->detach());
  const std::string path = tag_dir + "/" + rank_local_state_file_name(dp_rank, mp_rank);
  if (save_file) {
    save_file(checkpoint::ivalue_from_tensors(d), path);
  } else {
    checkpoint::save(checkpoint::ivalue_from_tensors(d), path);
  }
}

void load_rank_local_state(torch::optim::Optimizer& optimizer, const std::string& tag_dir,
                           int dp_rank, int mp_rank) {
  if (dynamic_cast<CompressedCommunication*>(&optimizer) == nullptr) return;
  const std::string path = tag_dir + "/" + rank_local_state_file_name(dp_rank, mp_rank);
  checkpoint::TensorDict d = checkpoint::tensors_from_ivalue(checkpoint::load(path), path);
  for (auto& [key, t] : rank_local_tensors(optimizer)) {
    const at::Tensor* saved = d.find(key);
    DS_CHECK(saved != nullptr, CheckpointError, path, ": has no '", key,
             "' (the error-feedback buffer of a 1-bit optimizer); was it saved by another model?");
    DS_CHECK(saved->sizes() == t->sizes(), CheckpointError, path, ": '", key, "' has shape ",
             saved->sizes(), ", this job's is ", t->sizes(),
             "; 1-bit optimizer checkpoints resume with the same data-parallel size");
    at::NoGradGuard no_grad;  // parameters are leaves that require grad
    t->detach().copy_(*saved);
  }
}

}  // namespace deepspeed::onebit
