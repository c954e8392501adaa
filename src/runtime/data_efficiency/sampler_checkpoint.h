// The data sampler's state in a checkpoint, under DeepSpeed's key `data_sampler`: DeepSpeed's
// keys (batch, consumed_samples, curriculum_step, current_difficulties, data_cluster_paths,
// data_cluster_current_position, np_rng_state) and ours, `rng_state`. Either side resumes the
// other's: DeepSpeed reads the keys it knows; here the sampler restores all but np_rng_state.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>

namespace deepspeed::data_sampling {

/// The JSON state DataSampler::load_state_dict takes, from a checkpoint's `data_sampler` entry.
/// DeepSpeed's np_rng_state (numpy's global generator, holding an array) is dropped: neither
/// sampler draws from it. Throws CheckpointError naming `where` for a value JSON cannot hold.
nlohmann::json data_sampler_state_from_checkpoint(const c10::IValue& entry,
                                                  const std::string& where);

/// numpy's legacy global generator as np.random.seed(seed) leaves it, in the form
/// np.random.get_state() has and np.random.set_state() takes:
/// ["MT19937", the 624 key words, 624, 0, 0.0]. DeepSpeed's load_state_dict requires the key.
nlohmann::json numpy_seeded_state(uint32_t seed);

}  // namespace deepspeed::data_sampling
