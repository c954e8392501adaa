// Batch triad inference and checks, in DeepSpeed's order (runtime/config.py).
#include "config/batch_config.h"

#include "util/check.h"

namespace deepspeed::config_detail {

BatchConfig resolve_batch_triad(std::optional<int64_t> tb, std::optional<int64_t> mb,
                                std::optional<int64_t> gas, int64_t w, const std::string& source) {
  const bool mb_given = mb.has_value(), gas_given = gas.has_value();
  DS_CHECK(w > 0, ConfigError, source, ": data-parallel world size is ", w,
           "; expected a positive number of ranks");
  // Matches DeepSpeed: floor divisions, so a bad combination shows up in the checks below.
  if (tb && mb && gas) {
    // nothing to infer
  } else if (tb && mb) {
    gas = (*tb / *mb) / w;
  } else if (tb && gas) {
    mb = (*tb / w) / *gas;
  } else if (mb && gas) {
    tb = *mb * *gas * w;
  } else if (tb) {
    gas = 1;
    mb = *tb / w;
  } else if (mb) {
    gas = 1;
    tb = *mb * w;
  } else {
    throw ConfigError(source +
                      ": either train_batch_size or train_micro_batch_size_per_gpu needs to be "
                      "provided (gradient_accumulation_steps alone cannot size a batch)");
  }
  DS_CHECK(*tb > 0, ConfigError, source, ": train_batch_size is ", *tb,
           "; it has to be greater than 0");
  DS_CHECK(*mb > 0, ConfigError, source, ": train_micro_batch_size_per_gpu is ", *mb,
           mb_given ? std::string()
                    : detail::str_cat(" (derived as train_batch_size (", *tb,
                                      ") // data-parallel size (", w,
                                      ") // gradient_accumulation_steps (", *gas, "))"),
           "; it has to be greater than 0");
  DS_CHECK(*gas > 0, ConfigError, source, ": gradient_accumulation_steps is ", *gas,
           gas_given ? std::string()
                     : detail::str_cat(" (derived as train_batch_size (", *tb,
                                       ") // train_micro_batch_size_per_gpu (", *mb,
                                       ") // data-parallel size (", w, "))"),
           "; it has to be greater than 0");
  DS_CHECK(*tb == *mb * *gas * w, ConfigError, source, ": train_batch_size (", *tb,
           ") != train_micro_batch_size_per_gpu (", *mb, ") * gradient_accumulation_steps (",
           *gas, ") * data-parallel size (", w, ") = ", *mb * *gas * w,
           "; set two of them and the third is derived");
  BatchConfig out;
  out.train_batch_size = *tb;
  out.train_micro_batch_size_per_gpu = *mb;
  out.gradient_accumulation_steps = *gas;
  out.dp_world_size = w;
  return out;
}

}  // namespace deepspeed::config_detail
