#include "runtime/data_efficiency/sampler_checkpoint.h"

#include <vector>

#include "deepspeed/checkpoint.h"

namespace deepspeed::data_sampling {

nlohmann::json data_sampler_state_from_checkpoint(const c10::IValue& entry,
                                                  const std::string& where) {
  c10::IValue state = entry;
  if (entry.isGenericDict() && entry.toGenericDict().contains("np_rng_state")) {
    auto copy = entry.toGenericDict().copy();
    (void)copy.erase("np_rng_state");
    state = copy;
  }
  return checkpoint::json_from_ivalue(state, where);
}

nlohmann::json numpy_seeded_state(uint32_t seed) {
  // MT19937's init_genrand, which numpy's legacy seeding runs (std::mt19937's seeding too).
  std::vector<uint32_t> key(624);
  key[0] = seed;
  for (uint32_t i = 1; i < key.size(); ++i) {
    key[i] = 1812433253u * (key[i - 1] ^ (key[i - 1] >> 30)) + i;
  }
  return nlohmann::json::array({"MT19937", key, 624, 0, 0.0});
}

}  // namespace deepspeed::data_sampling
