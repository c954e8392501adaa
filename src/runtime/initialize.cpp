// load_config(): parses ds_config for the current job's data-parallel size.
#include "deepspeed/deepspeed.h"

#include "config/config_source.h"
#include "util/check.h"

namespace deepspeed {
namespace {

// DeepSpeed's batch triad counts data-parallel ranks: the mpu's, else every rank, less the
// sequence-parallel ones (world / sequence_parallel_size), or less the tensor-parallel ones
// when tensor_parallel.autotp_size asks for AutoTP without an mpu.
int data_parallel_size(const Mpu* mpu, const json& doc, const std::string& source) {
  if (mpu) return mpu->get_data_parallel_world_size();
  const int world = comm::world().size();
  const auto sp = doc.find("sequence_parallel_size");
  if (sp != doc.end() && sp->is_number_integer() && sp->get<int64_t>() > 1) {
    const int64_t s = sp->get<int64_t>();
    DS_CHECK(world % s == 0, ConfigError, source, ": sequence_parallel_size (", s,
             ") does not divide the world size (", world, ")");
    return static_cast<int>(world / s);
  }
  const auto section = doc.find("tensor_parallel");
  if (section == doc.end() || !section->is_object()) return world;
  const auto tp = section->find("autotp_size");
  if (tp == section->end() || !tp->is_number_integer()) return world;
  const int64_t t = tp->get<int64_t>();
  return t > 1 && world % t == 0 ? static_cast<int>(world / t) : world;
}

}  // namespace

DeepSpeedConfig load_config(const std::string& config, const Mpu* mpu) {
  comm::init_distributed();
  const auto loaded = mpu ? config_detail::LoadedConfig{} : config_detail::load_config_text(config);
  return DeepSpeedConfig::from_string(config, data_parallel_size(mpu, loaded.doc, loaded.source));
}

DeepSpeedConfig load_config(const json& config, const Mpu* mpu) {
  comm::init_distributed();
  return DeepSpeedConfig::from_json(config, data_parallel_size(mpu, config, "ds_config"));
}

}  // namespace deepspeed
