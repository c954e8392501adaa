// train_gpt's tensor-parallel setup (see gpt_tensor_parallel.h).
#include "gpt_tensor_parallel.h"

#include <string>

#include "deepspeed/comm.h"
#include "deepspeed/errors.h"
#include "deepspeed/topology.h"

namespace deepspeed::examples {

void check_gpt_tensor_parallel(const GptConfig& cfg, int tp) {
  if (tp <= 1) return;
  if (cfg.n_embd % tp != 0) {
    throw ConfigError("--tensor_parallel_size " + std::to_string(tp) + ": the hidden size n_embd (" +
                      std::to_string(cfg.n_embd) + ") is not divisible by " + std::to_string(tp));
  }
  if (cfg.n_head % tp != 0) {
    throw ConfigError("--tensor_parallel_size " + std::to_string(tp) +
                      ": the number of attention heads n_head (" + std::to_string(cfg.n_head) +
                      ") is not divisible by " + std::to_string(tp) +
                      " (each rank keeps whole heads)");
  }
}

ProcessTopology gpt_parallel_topology(int pipe, int tp) {
  const int world = comm::get_world_size();
  if (world % (pipe * tp) != 0) {
    throw ConfigError("--pipeline_parallel_size " + std::to_string(pipe) +
                      " x --tensor_parallel_size " + std::to_string(tp) +
                      " does not divide the world size (" + std::to_string(world) +
                      "); launch a multiple of " + std::to_string(pipe * tp) + " ranks");
  }
  return PipeModelDataParallelTopology(pipe, tp, world / (pipe * tp));
}

std::shared_ptr<TopologyMpu> gpt_parallel_mpu(int pipe, int tp) {
  return std::make_shared<TopologyMpu>(gpt_parallel_topology(pipe, tp));
}

void request_autotp(DeepSpeedConfig* config, int tp) {
  json& section = config->raw["tensor_parallel"];
  if (section.is_null()) section = json::object();
  const auto given = section.find("autotp_size");
  if (given != section.end() && given->is_number_integer() && given->get<int64_t>() > 1 &&
      given->get<int64_t>() != tp) {
    throw ConfigError(config->source + ": tensor_parallel.autotp_size is " +
                      std::to_string(given->get<int64_t>()) + " but --tensor_parallel_size is " +
                      std::to_string(tp));
  }
  section["autotp_size"] = tp;
}

}  // namespace deepspeed::examples
