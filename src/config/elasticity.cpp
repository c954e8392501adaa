// compute_elastic_config, step for step as DeepSpeed's elasticity.py: the same candidates, the
// same tie-breaks, and Python's float arithmetic where DeepSpeed divides with `/` (version 0.2),
// so that both give the same batch and GPU counts for every config.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <set>

#include "deepspeed/elasticity.h"
#include "util/check.h"

namespace deepspeed::elasticity {
namespace {

// Highly composite numbers: a batch that is one of them times a micro-batch divides by many GPU
// counts.
constexpr int64_t kHighlyComposite[] = {
    1,      2,      4,      6,      12,     24,     36,     48,     60,     120,
    180,    240,    360,    720,    840,    1260,   1680,   2520,   5040,   7560,
    10080,  15120,  20160,  25200,  27720,  45360,  50400,  55440,  83160,  110880,
    166320, 221760, 277200, 332640, 498960, 554400, 665280, 720720};

// Each base scaled by the largest highly composite number that keeps it within the maximum.
std::set<int64_t> candidate_batch_sizes(const std::vector<int64_t>& bases, int64_t max_batch) {
  std::set<int64_t> out;
  for (int64_t base : bases) {
    if (base > max_batch) continue;
    if (base == max_batch) {
      out.insert(base);
      continue;
    }
    const int64_t value = max_batch / base;
    // DeepSpeed takes the entry before the first one above `value` with numpy's argmax, which
    // answers 0 when none is above: the index -1 is then the last entry.
    const auto* first_above =
        std::find_if(std::begin(kHighlyComposite), std::end(kHighlyComposite),
                     [&](int64_t h) { return h > value; });
    const int64_t scale = first_above == std::begin(kHighlyComposite) ||
                                  first_above == std::end(kHighlyComposite)
                              ? kHighlyComposite[std::size(kHighlyComposite) - 1]
                              : *(first_above - 1);
    out.insert(scale * base);
  }
  return out;
}

std::vector<int64_t> valid_gpus_for(int64_t batch, const std::vector<int64_t>& micro_batches,
                                    int64_t min_gpus, int64_t max_gpus) {
  std::set<int64_t> valid;
  for (int64_t micro : micro_batches) {
    if (batch % micro != 0) continue;
    const int64_t most = batch / micro;
    if (min_gpus <= most && most <= max_gpus) valid.insert(most);
    for (int64_t i = 1; i <= most / 2; ++i) {
      if (i > max_gpus) break;
      if (i < min_gpus) continue;
      if (most % i == 0) valid.insert(i);
    }
  }
  return {valid.begin(), valid.end()};
}

struct Candidate {
  int64_t batch;
  std::optional<std::vector<int64_t>> valid;  // DeepSpeed's None when no candidate won
};

// The candidate with the most valid GPU counts; ties go to the larger (or smaller) batch.
Candidate best_candidate(const std::set<int64_t>& candidates,
                         const std::vector<int64_t>& micro_batches, int64_t min_gpus,
                         int64_t max_gpus, bool prefer_larger) {
  size_t most_valid = 0;
  Candidate best{*std::min_element(micro_batches.begin(), micro_batches.end()), std::nullopt};
  for (int64_t batch : candidates) {
    auto valid = valid_gpus_for(batch, micro_batches, min_gpus, max_gpus);
    const bool tie_wins = valid.size() == most_valid &&
                          (prefer_larger ? batch > best.batch : batch < best.batch);
    if (valid.size() > most_valid || tie_wins) {
      most_valid = valid.size();
      best = {batch, std::move(valid)};
    }
  }
  return best;
}

// Version 0.1: the micro-batches and their least common multiple, each scaled by a highly
// composite number, and the one with the most valid counts in [min_gpus, max_gpus].
Candidate compatible_gpus_v01(const std::vector<int64_t>& micro_batches, int64_t max_batch,
                              int64_t min_gpus, int64_t max_gpus, bool prefer_larger,
                              const std::string& source) {
  const int64_t smallest = *std::min_element(micro_batches.begin(), micro_batches.end());
  // DeepSpeed's `min_gpus or 1`, `max_gpus or ...`: version 0.2 passes node counts, which can be 0.
  if (min_gpus == 0) min_gpus = 1;
  if (max_gpus == 0) max_gpus = max_batch / smallest;
  for (int64_t micro : micro_batches) {
    DS_CHECK(micro <= max_batch, ElasticityError, source, ": elasticity.micro_batch_sizes ",
             python_list(micro_batches), " must all be at most the maximum batch size ", max_batch,
             " (max_train_batch_size, per node with version 0.2)");
  }
  int64_t lcm = 1;
  for (int64_t micro : micro_batches) lcm = std::lcm(lcm, micro);
  std::vector<int64_t> bases = micro_batches;
  bases.push_back(lcm);
  return best_candidate(candidate_batch_sizes(bases, max_batch), micro_batches, min_gpus, max_gpus,
                        prefer_larger);
}

// Python's floor division and modulo of floats, as version 0.2 applies them.
double py_floordiv(double a, double b) { return std::floor(a / b); }
double py_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// DeepSpeed's get_microbatch: the first (or, preferring larger, the largest) micro-batch that
// divides final_batch // current_gpus.
std::optional<int64_t> microbatch_for(double final_batch, int64_t current_gpus,
                                      const std::vector<int64_t>& micro_batches,
                                      bool prefer_larger) {
  std::optional<int64_t> chosen;
  for (int64_t micro : micro_batches) {
    if (py_mod(py_floordiv(final_batch, static_cast<double>(current_gpus)),
               static_cast<double>(micro)) == 0) {
      if (!chosen) chosen = micro;
      if (prefer_larger && *chosen < micro) chosen = micro;
    }
  }
  return chosen;
}

struct V02Result {
  double final_batch;
  std::vector<int64_t> valid_dp_sizes;
  std::optional<int64_t> micro_batch;
};

// Version 0.2 works per node: version 0.1 on node counts with the batch per node's data-parallel
// ranks, scaled back; a current size outside the result gets the largest (or smallest) batch
// within the maximum that it can train.
V02Result compatible_gpus_v02(const ElasticityConfig& e, int64_t current_gpus,
                              const std::string& source) {
  const int64_t gpn = e.num_gpus_per_node, mp = e.model_parallel_size;
  DS_CHECK(gpn % mp == 0, ElasticityError, source,
           ": elasticity version 0.2 needs num_gpus_per_node (", gpn,
           ") divisible by model_parallel_size (", mp, ")");
  const int64_t dp_per_node = gpn / mp;
  // DeepSpeed's int(a / b) on positive integers.
  const Candidate nodes = compatible_gpus_v01(
      e.micro_batch_sizes, static_cast<int64_t>(static_cast<double>(e.max_train_batch_size) /
                                                static_cast<double>(dp_per_node)),
      static_cast<int64_t>(static_cast<double>(e.min_gpus) / static_cast<double>(gpn)),
      static_cast<int64_t>(static_cast<double>(e.max_gpus) / static_cast<double>(gpn)),
      e.prefer_larger_batch, source);
  V02Result out;
  out.final_batch = static_cast<double>(nodes.batch * dp_per_node);
  // DeepSpeed would stop on None here (a TypeError); no candidate means no valid size.
  for (int64_t n : nodes.valid.value_or(std::vector<int64_t>{})) {
    out.valid_dp_sizes.push_back(n * dp_per_node);
  }
  const int64_t current_dp = current_gpus / mp;
  if (std::find(out.valid_dp_sizes.begin(), out.valid_dp_sizes.end(), current_dp) !=
      out.valid_dp_sizes.end()) {
    out.micro_batch =
        microbatch_for(out.final_batch, current_gpus, e.micro_batch_sizes, e.prefer_larger_batch);
    return out;
  }
  const double current_dp_size =
      (static_cast<double>(current_gpus) / static_cast<double>(gpn)) * dp_per_node;
  std::vector<double> candidates;
  for (int64_t micro : e.micro_batch_sizes) {
    const double min_batch = static_cast<double>(micro) * current_dp_size;
    const double factor = std::floor(static_cast<double>(e.max_train_batch_size) / min_batch);
    candidates.push_back(factor * min_batch);
  }
  out.final_batch = e.prefer_larger_batch ? *std::max_element(candidates.begin(), candidates.end())
                                          : *std::min_element(candidates.begin(), candidates.end());
  out.valid_dp_sizes = {static_cast<int64_t>(current_dp_size)};
  out.micro_batch =
      microbatch_for(out.final_batch, current_gpus, e.micro_batch_sizes, e.prefer_larger_batch);
  return out;
}

int64_t world_size_from_env(const std::string& source) {
  const char* env = std::getenv("WORLD_SIZE");
  const std::string value = env ? env : "";
  const bool numeric = !value.empty() && std::all_of(value.begin(), value.end(), [](char ch) {
    return ch >= '0' && ch <= '9';
  });
  DS_CHECK(numeric, ElasticityError, source,
           ": elasticity version 0.2 needs the world size to compute a valid batch size: pass it, "
           "or set WORLD_SIZE (it is ",
           env ? "\"" + value + "\"" : std::string("unset"), ")");
  return std::stoll(value);
}

}  // namespace

std::string python_list(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(values[i]);
  }
  return out + "]";
}

ElasticBatch compute_elastic_config(const ElasticityConfig& e, int64_t world_size,
                                    const std::string& source) {
  DS_CHECK(e.enabled, ElasticityError, source,
           ": elasticity is disabled; enable it (elasticity.enabled: true) for an elastic job");
  DS_CHECK(e.model_parallel_size == 1 || e.version == 0.2, ElasticityError, source,
           ": elasticity version ", e.version,
           " does not support model parallelism (elasticity.model_parallel_size is ",
           e.model_parallel_size, "); use version 0.2");
  DS_CHECK(e.version <= kLatestVersion, ElasticityError, source, ": elasticity.version is ",
           e.version, "; this build computes up to version ", kLatestVersion);
  DS_CHECK(!e.micro_batch_sizes.empty(), ElasticityError, source,
           ": elasticity.micro_batch_sizes is empty; expected at least one micro-batch size");
  ElasticBatch out;
  if (e.version == 0.1) {
    Candidate c = compatible_gpus_v01(e.micro_batch_sizes, e.max_train_batch_size, e.min_gpus,
                                      e.max_gpus, e.prefer_larger_batch, source);
    out.final_batch_size = c.batch;
    out.valid_gpus = c.valid.value_or(std::vector<int64_t>{});
  } else if (e.version == 0.2) {
    const int64_t current = world_size != 0 ? world_size : world_size_from_env(source);
    V02Result r = compatible_gpus_v02(e, current, source);
    out.final_batch_size = static_cast<int64_t>(r.final_batch);
    out.valid_gpus = std::move(r.valid_dp_sizes);
    out.micro_batch_size = r.micro_batch;
  } else {
    throw ElasticityError(source + ": elasticity.version " + std::to_string(e.version) +
                          " is not one this build computes (0.1 or 0.2)");
  }

  // Without a world size, version 0.1 lists the valid sizes only; version 0.2 keeps the
  // micro-batch it picked for WORLD_SIZE.
  if (world_size == 0) return out;
  DS_CHECK(std::find(out.valid_gpus.begin(), out.valid_gpus.end(), world_size) !=
               out.valid_gpus.end(),
           ElasticityIncompatibleWorldSize, source, ": elasticity: data-parallel size ",
           world_size, " is not one of the valid GPU counts ", python_list(out.valid_gpus),
           " for batch size ", out.final_batch_size);
  std::vector<int64_t> sizes = e.micro_batch_sizes;
  std::sort(sizes.rbegin(), sizes.rend());
  out.micro_batch_size.reset();
  for (int64_t micro : sizes) {
    if (out.final_batch_size / world_size % micro == 0) {
      out.micro_batch_size = micro;
      break;
    }
  }
  DS_CHECK(out.micro_batch_size.has_value(), ElasticityError, source,
           ": elasticity: no micro-batch size in ", python_list(e.micro_batch_sizes),
           " divides batch size ", out.final_batch_size, " / data-parallel size ", world_size);
  return out;
}

}  // namespace deepspeed::elasticity
