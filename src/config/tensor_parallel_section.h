// The `tensor_parallel` section (DeepSpeed's TPTrainingConfig: AutoTP training). Read strictly at
// config load (unknown keys are errors, as DeepSpeed's pydantic model forbids them; what this
// build lacks is refused by name) and again by the engine from DeepSpeedConfig::raw.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/json_reader.h"
#include "deepspeed/config.h"

namespace deepspeed::config_detail {

struct TensorParallelSection {
  int64_t autotp_size = 0;    // > 1: AutoTP over groups of this many consecutive ranks
  int64_t tp_size = 1;        // tensor_parallel.tp_size (alias tp.tp_size)
  int64_t tp_grain_size = 1;  // tensor_parallel.tp_grain_size; only 1 (even splits)
  bool tp_overlap_comm = false;
  bool keep_module_on_host = false;
  std::string dtype;          // as given; the engine's precision comes from fp16/bf16
};

/// Reads `top`'s tensor_parallel section; the features this build lacks go to `unimplemented`.
TensorParallelSection read_tensor_parallel_section(ConfigReader& top,
                                                   std::vector<std::string>* unimplemented);

/// The section of a loaded config (from c.raw).
TensorParallelSection tensor_parallel_section(const DeepSpeedConfig& c);

}  // namespace deepspeed::config_detail
