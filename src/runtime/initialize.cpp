// load_config(): parses ds_config for the current job's data-parallel size.
#include "deepspeed/deepspeed.h"

namespace deepspeed {
namespace {

// DeepSpeed's batch triad counts data-parallel ranks: the mpu's, else every rank.
int data_parallel_size(const Mpu* mpu) {
  return mpu ? mpu->get_data_parallel_world_size() : comm::world().size();
}

}  // namespace

DeepSpeedConfig load_config(const std::string& config, const Mpu* mpu) {
  comm::init_distributed();
  return DeepSpeedConfig::from_string(config, data_parallel_size(mpu));
}

DeepSpeedConfig load_config(const json& config, const Mpu* mpu) {
  comm::init_distributed();
  return DeepSpeedConfig::from_json(config, data_parallel_size(mpu));
}

}  // namespace deepspeed
