#include "step_metrics.h"

#include <torch/torch.h>

#include "deepspeed/comm.h"

namespace deepspeed::examples {

std::vector<std::pair<std::string, int64_t>> memory_figures(const MemoryStats& m) {
  return {{"rss", m.rss_bytes},
          {"peak_rss", m.peak_rss_bytes},
          {"parameters", m.param_bytes},
          {"master_weights", m.master_param_bytes},
          {"gradients", m.grad_bytes},
          {"optimizer_states", m.optimizer_state_bytes},
          {"reduction_buffers", m.comm_buffer_bytes},
          {"offloaded_optimizer", m.offloaded_optimizer_bytes},
          {"offloaded_params", m.offloaded_param_bytes},
          {"swap_buffers", m.swap_buffer_bytes},
          {"nvme_optimizer", m.nvme_optimizer_bytes},
          {"nvme_params", m.nvme_param_bytes},
          {"device", m.device_bytes()},
          {"host_offload", m.host_offload_bytes()}};
}

json gather_memory_figures(const MemoryStats& mine) {
  const auto figures = memory_figures(mine);
  std::vector<double> values;
  for (const auto& f : figures) values.push_back(static_cast<double>(f.second));
  const int world = comm::get_world_size();
  const auto n = static_cast<int64_t>(figures.size());
  auto all = torch::empty({n * world}, torch::kDouble);
  comm::all_gather(all, torch::tensor(values, torch::kDouble));
  auto gathered = all.accessor<double, 1>();
  json out = json::object();
  for (int64_t f = 0; f < n; ++f) {
    json per_rank = json::array();
    for (int r = 0; r < world; ++r) per_rank.push_back(static_cast<int64_t>(gathered[r * n + f]));
    out[figures[static_cast<size_t>(f)].first] = per_rank;
  }
  return out;
}

}  // namespace deepspeed::examples
