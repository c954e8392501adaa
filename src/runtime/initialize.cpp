// load_config(): parses ds_config for the current job's data-parallel world size.
#include "deepspeed/deepspeed.h"

namespace deepspeed {

DeepSpeedConfig load_config(const std::string& config) {
  comm::init_distributed();
  return DeepSpeedConfig::from_string(config, comm::get_world_size());
}

DeepSpeedConfig load_config(const json& config) {
  comm::init_distributed();
  return DeepSpeedConfig::from_json(config, comm::get_world_size());
}

}  // namespace deepspeed
