// Batch triad inference and checks, in DeepSpeed's order (runtime/config.py).
#include "config/batch_config.h"

#include "util/check.h"

namespace deepspeed::config_detail {
namespace {

// micro * accumulation * world, refusing a product past int64 (which no job can have).
int64_t batch_product(int64_t mb, int64_t gas, int64_t w, const std::string& source) {
  int64_t out = 0;
  DS_CHECK(!__builtin_mul_overflow(mb, gas, &out) && !__builtin_mul_overflow(out, w, &out),
           ConfigError, source, ": train_micro_batch_size_per_gpu (", mb,
           ") * gradient_accumulation_steps (", gas, ") * data-parallel size (", w,
           ") does not fit in 64 bits; expected a real batch size");
  return out;
}

}  // namespace

BatchConfig resolve_batch_triad(std::optional<int64_t> tb, std::optional<int64_t> mb,
                                std::optional<int64_t> gas, int64_t w, const std::string& source) {
  const bool mb_given = mb.has_value(), gas_given = gas.has_value();
  DS_CHECK(w > 0, ConfigError, source, ": data-parallel world size is ", w,
           "; expected a positive number of ranks");
  // The divisors below must be positive (DeepSpeed would stop with ZeroDivisionError); given
  // values get the message their derived counterparts get further down.
  for (auto [value, key] : {std::pair{tb, "train_batch_size"},
                            std::pair{mb, "train_micro_batch_size_per_gpu"},
                            std::pair{gas, "gradient_accumulation_steps"}}) {
    DS_CHECK(!value || *value > 0, ConfigError, source, ": ", key, " is ", *value,
             "; it has to be greater than 0");
  }
  // Matches DeepSpeed: floor divisions, so a bad combination shows up in the checks below.
  if (tb && mb && gas) {
    // nothing to infer
  } else if (tb && mb) {
    gas = (*tb / *mb) / w;
  } else if (tb && gas) {
    mb = (*tb / w) / *gas;
  } else if (mb && gas) {
    tb = batch_product(*mb, *gas, w, source);
  } else if (tb) {
    gas = 1;
    mb = *tb / w;
  } else if (mb) {
    gas = 1;
    tb = batch_product(*mb, 1, w, source);
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
  const int64_t product = batch_product(*mb, *gas, w, source);
  DS_CHECK(*tb == product, ConfigError, source, ": train_batch_size (", *tb,
           ") != train_micro_batch_size_per_gpu (", *mb, ") * gradient_accumulation_steps (",
           *gas, ") * data-parallel size (", w, ") = ", product,
           "; set two of them and the third is derived");
  BatchConfig out;
  out.train_batch_size = *tb;
  out.train_micro_batch_size_per_gpu = *mb;
  out.gradient_accumulation_steps = *gas;
  out.dp_world_size = w;
  return out;
}

namespace {

constexpr const char* kTrainBatch = "train_batch_size";
constexpr const char* kMicroBatch = "train_micro_batch_size_per_gpu";
constexpr const char* kGradAccum = "gradient_accumulation_steps";

// Why the single "auto" key `key` cannot be derived from the numbers given; "" when it can.
// The micro-batch and the total need the other one of the two (accumulation absent means 1, as
// DeepSpeed reads it); the accumulation needs both, since it has no default once "auto" is written.
std::string underdetermined(const std::string& key, bool tb, bool mb) {
  if (key == kTrainBatch && !mb) return "train_micro_batch_size_per_gpu is not a number";
  if (key == kMicroBatch && !tb) return "train_batch_size is not a number";
  if (key == kGradAccum && !(tb && mb)) {
    return "it is derived from train_batch_size and train_micro_batch_size_per_gpu, and " +
           std::string(tb ? kMicroBatch : kTrainBatch) + " is not a number";
  }
  return "";
}

}  // namespace

BatchConfig read_batch_triad(ConfigReader& top, int64_t w, const std::string& source,
                             std::vector<std::string>* notes) {
  std::vector<std::string> autos;
  auto read = [&](const char* key) -> std::optional<int64_t> {
    if (top.take_auto(key)) {
      autos.emplace_back(key);
      return std::nullopt;
    }
    return top.get_opt_int(key);
  };
  const auto tb = read(kTrainBatch), mb = read(kMicroBatch), gas = read(kGradAccum);
  if (autos.empty()) return resolve_batch_triad(tb, mb, gas, w, source);

  if (autos.size() > 1) {
    std::string list;
    for (size_t i = 0; i < autos.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == autos.size() ? " and " : ", ") + autos[i];
    }
    throw ConfigError(source + ": " + list + " are \"auto\"; " + auto_placeholder_reason() +
                      ": give integers (two of the three batch keys determine the third)");
  }
  const std::string& key = autos[0];
  if (std::string why = underdetermined(key, tb.has_value(), mb.has_value()); !why.empty()) {
    throw ConfigError(source + ": " + key + " " + auto_placeholder_message("an integer") +
                      " (it cannot be derived: " + why + ")");
  }
  BatchConfig b = resolve_batch_triad(tb, mb, gas, w, source);
  const std::string accum = std::to_string(b.gradient_accumulation_steps) +
                            (gas ? "" : " (the default when it is not given)");
  std::string formula;
  if (key == kTrainBatch) {
    formula = std::to_string(b.train_batch_size) + " = micro " +
              std::to_string(b.train_micro_batch_size_per_gpu) + " x accum " + accum +
              " x world " + std::to_string(w);
  } else if (key == kMicroBatch) {
    formula = std::to_string(b.train_micro_batch_size_per_gpu) + " = train_batch_size " +
              std::to_string(b.train_batch_size) + " / (accum " + accum + " x world " +
              std::to_string(w) + ")";
  } else {
    formula = std::to_string(b.gradient_accumulation_steps) + " = train_batch_size " +
              std::to_string(b.train_batch_size) + " / (micro " +
              std::to_string(b.train_micro_batch_size_per_gpu) + " x world " + std::to_string(w) +
              ")";
  }
  notes->push_back(source + ": " + key + ": \"auto\" resolved to " + formula +
                   " (the batch triad determines it)");
  return b;
}

}  // namespace deepspeed::config_detail
