// The engine's tensor-parallel steps (see engine_autotp.h).
#include "runtime/tensor_parallel/engine_autotp.h"

#include <torch/torch.h>

#include "config/tensor_parallel_section.h"
#include "deepspeed/tensor_parallel.h"
#include "deepspeed/topology.h"
#include "runtime/pipe/pipe_engine_mpu.h"
#include "runtime/zero/zero_optimizer.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::runtime {

int autotp_size(const DeepSpeedConfig& c) {
  return static_cast<int>(config_detail::tensor_parallel_section(c).autotp_size);
}

std::shared_ptr<Mpu> autotp_mpu(const DeepSpeedConfig& c, std::shared_ptr<Mpu> mpu) {
  const int T = autotp_size(c);
  if (T <= 1) return mpu;
  if (mpu) {
    const int have = tensor_parallel_group(*mpu).size();
    DS_CHECK(have == T, ConfigError, c.source, ": tensor_parallel.autotp_size is ", T,
             " but the mpu's tensor-parallel group has ", have, " rank(s)");
    return mpu;
  }
  const int world = comm::get_world_size();
  DS_CHECK(world % T == 0, ConfigError, c.source, ": tensor_parallel.autotp_size (", T,
           ") does not divide the world size (", world, ")");
  return std::make_shared<TopologyMpu>(PipeModelDataParallelTopology(1, T, world / T));
}

comm::Group tensor_parallel_group(const Mpu& mpu) {
  if (const auto* t = dynamic_cast<const TopologyMpu*>(&mpu)) return t->groups().model();
  if (const auto* p = dynamic_cast<const pipe::PipeEngineMpu*>(&mpu)) return p->tensor_group();
  return mpu.get_model_parallel_group();
}

void apply_autotp(const DeepSpeedConfig& c, torch::nn::Module& module, const Mpu& mpu) {
  const int T = autotp_size(c);
  if (T <= 1) return;
  // Matches DeepSpeed: AutoTP training runs with ZeRO 0-2 ("the compatibility between 'autotp'
  // and 'zero_stage = 3' has not been validated").
  DS_CHECK(c.zero_optimization.stage != 3, NotSupportedError, c.source,
           ": tensor_parallel.autotp_size ", T,
           " with zero_optimization.stage 3: AutoTP runs with ZeRO stages 0, 1 and 2");
  const comm::Group group = tensor_parallel_group(mpu);
  tensor_parallel::AutoTpPlan plan = tensor_parallel::auto_tp(module, group);
  DS_CHECK(!plan.column.empty() || !plan.fused_qkv.empty() || !plan.row.empty(), ConfigError,
           c.source, ": tensor_parallel.autotp_size ", T,
           ": AutoTP found no linear layer to shard (it looks for output projections named "
           "c_proj, o_proj, out_proj, down_proj, fc2, dense_4h_to_h or wo, their sibling "
           "linears, and fused q|k|v projections named c_attn, qkv_proj, query_key_value or Wqkv)");
  log::info_rank0("AutoTP over " + group.describe() + ": " + plan.describe());
}

std::optional<comm::Group> tensor_parallel_group_of(const std::vector<at::Tensor>& params) {
  std::optional<comm::Group> group;
  for (const auto& p : params) {
    if (!tensor_parallel::is_tensor_parallel(p)) continue;
    comm::Group g = tensor_parallel::shard_info(p).group;
    if (!group) {
      group = g;
    } else {
      DS_CHECK(group->impl() == g.impl(), UsageError,
               "tensor-parallel parameters split over different groups (", group->describe(),
               " and ", g.describe(), "); one engine trains one tensor-parallel group");
    }
  }
  return group;
}

void exclude_replicated_from_norm(ZeroOptimizer& zero, const std::vector<at::Tensor>& params) {
  std::optional<comm::Group> group = tensor_parallel_group_of(params);
  if (!group || group->size() == 1 || group->rank() == 0) return;
  std::vector<at::Tensor> replicated;
  for (const auto& p : params) {
    if (!tensor_parallel::is_tensor_parallel(p)) replicated.push_back(p);
  }
  zero.exclude_from_norm(replicated);
}

}  // namespace deepspeed::runtime
