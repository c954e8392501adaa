// DeepSpeed's elasticity: one global batch size that many GPU counts can train with unchanged, so a
// job can be rescheduled onto more or fewer ranks without changing its convergence. The batch is
// micro-batch x gradient accumulation x data-parallel size, and every valid size gets a micro-batch
// from `micro_batch_sizes` and an accumulation that keep the product. Computed as DeepSpeed's
// deepspeed/elasticity/elasticity.py computes it (versions 0.1 and 0.2), so a scheduler that asks
// DeepSpeed (or `ds_elastic`) for the valid counts gets the same answer from this build.
//
// With `elasticity.enabled`, DeepSpeedConfig takes the batch triad from here for its data-parallel
// size (docs/elasticity.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"

namespace deepspeed::elasticity {

/// DeepSpeed's ElasticityError and ElasticityConfigError: a config elasticity cannot work with.
class ElasticityError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

/// The data-parallel size is not one of the config's valid GPU counts.
class ElasticityIncompatibleWorldSize : public ElasticityError {
 public:
  using ElasticityError::ElasticityError;
};

/// The newest `elasticity.version` this build (and DeepSpeed) computes.
inline constexpr double kLatestVersion = 0.2;

/// The environment variable through which a resource scheduler passes the elasticity section it
/// planned with; the runtime refuses to train with a different one.
inline constexpr const char* kSchedulerConfigEnv = "DEEPSPEED_ELASTICITY_CONFIG";

struct ElasticBatch {
  int64_t final_batch_size = 0;
  /// The data-parallel sizes (GPUs / model-parallel size) that can train with final_batch_size.
  std::vector<int64_t> valid_gpus;
  /// The largest of `micro_batch_sizes` that divides final_batch_size / world size; present when a
  /// world size was given (and always with version 0.2, which needs one).
  std::optional<int64_t> micro_batch_size;
};

/// `values` as Python prints a list ("[1, 2, 3]"): how DeepSpeed's messages and ds_elastic show
/// micro-batch sizes and GPU counts.
std::string python_list(const std::vector<int64_t>& values);

/// DeepSpeed's compute_elastic_config. `world_size` is the data-parallel size, 0 for none: then
/// version 0.1 lists the valid sizes only, and version 0.2 reads WORLD_SIZE from the environment
/// (an error without it, as in DeepSpeed). Throws ElasticityError for a disabled section, a version
/// past kLatestVersion, model parallelism with version 0.1, or num_gpus_per_node not a multiple of
/// model_parallel_size; ElasticityIncompatibleWorldSize when world_size is not valid. `source`
/// (the config file) begins each message.
ElasticBatch compute_elastic_config(const ElasticityConfig& config, int64_t world_size,
                                    const std::string& source);

/// The `elasticity` section `section` (its value in ds_config.json), read as DeepSpeedConfig reads
/// it; `source` names it in errors (ElasticityError naming the key).
ElasticityConfig read_elasticity_config(const json& section, const std::string& source);

/// DeepSpeed's ensure_immutable_elastic_config: when kSchedulerConfigEnv is set, its
/// max_train_batch_size, micro_batch_sizes and version must equal `runtime`'s (ElasticityError
/// naming the key and both values). Unset, a warning is appended to `warnings`: nothing then
/// guarantees the scheduler picks a valid GPU count.
void ensure_immutable_elastic_config(const ElasticityConfig& runtime, const std::string& source,
                                     std::vector<std::string>* warnings);

}  // namespace deepspeed::elasticity
