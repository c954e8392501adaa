// The autotuner's search space and memory prediction: see autotuning_space.h.
#include "autotuning_space.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "deepspeed/config.h"
#include "runtime/memory_formula.h"

namespace deepspeed::launcher {
namespace {

using nlohmann::json;

// Every combination of the list-valued keys of `space` (keys in the object's order).
std::vector<json> combinations(const json& space) {
  std::vector<json> out{json::object()};
  for (auto it = space.begin(); it != space.end(); ++it) {
    std::vector<json> next;
    const json values = it.value().is_array() ? it.value() : json::array({it.value()});
    for (const json& partial : out) {
      for (const json& v : values) {
        json c = partial;
        c[it.key()] = v;
        next.push_back(c);
      }
    }
    out = std::move(next);
  }
  return out;
}

// The features of a config for the model_based cost model: one indicator per "key=value".
std::vector<std::string> features_of(const json& config) {
  std::vector<std::string> out;
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (it.value().is_object()) {
      for (const auto& f : features_of(it.value())) out.push_back(it.key() + "." + f);
    } else {
      out.push_back(it.key() + "=" + it.value().dump());
    }
  }
  return out;
}

// Ridge regression y ~ X w (normal equations, Gaussian elimination): small, dense, exact enough.
std::vector<double> ridge_fit(const std::vector<std::vector<double>>& x, const std::vector<double>& y, double lambda) {
  const size_t d = x.empty() ? 0 : x[0].size();
  std::vector<std::vector<double>> a(d, std::vector<double>(d + 1, 0.0));
  for (size_t r = 0; r < x.size(); ++r) {
    for (size_t i = 0; i < d; ++i) {
      for (size_t j = 0; j < d; ++j) a[i][j] += x[r][i] * x[r][j];
      a[i][d] += x[r][i] * y[r];
    }
  }
  for (size_t i = 0; i < d; ++i) a[i][i] += lambda;
  for (size_t c = 0; c < d; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < d; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    std::swap(a[c], a[pivot]);
    if (std::abs(a[c][c]) < 1e-12) continue;
    for (size_t r = 0; r < d; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (size_t k = c; k <= d; ++k) a[r][k] -= f * a[c][k];
    }
  }
  std::vector<double> w(d, 0.0);
  for (size_t i = 0; i < d; ++i) w[i] = std::abs(a[i][i]) < 1e-12 ? 0.0 : a[i][d] / a[i][i];
  return w;
}

}  // namespace

std::vector<int64_t> tuning_micro_batch_sizes(int64_t min_mbs, int64_t max_mbs, int64_t num,
                                              int64_t max_train_batch_size_per_gpu) {
  std::vector<int64_t> out;
  if (min_mbs <= 0 || max_mbs <= 0) return out;
  if (min_mbs < max_mbs / 2) min_mbs = max_mbs / 2;
  int64_t stride = (max_mbs - min_mbs) / std::max<int64_t>(num, 1);
  if (stride == 0) stride = 1;
  const int64_t min_gas = max_train_batch_size_per_gpu / max_mbs;
  for (int64_t mbs = min_mbs; mbs < max_mbs; mbs += stride) {
    if (max_train_batch_size_per_gpu / mbs != min_gas) out.push_back(mbs);
  }
  out.push_back(max_mbs);
  return out;
}

json default_zero_tuning_space(int64_t stage) {
  // Matches DeepSpeed's DEFAULT_TUNING_SPACE_ZERO_<stage> (autotuning/constants.py).
  const json buckets = json::array({50000000, 500000000, 1000000000});
  switch (stage) {
    case 0: return json::object();
    case 1: return {{"reduce_bucket_size", buckets}, {"allgather_bucket_size", buckets}};
    case 2:
      return {{"overlap_comm", {true, false}},         {"reduce_scatter", {false, true}},
              {"reduce_bucket_size", buckets},         {"allgather_bucket_size", buckets},
              {"contiguous_gradients", {false, true}}};
    default:
      return {{"overlap_comm", {true, false}},         {"reduce_scatter", {false, true}},
              {"reduce_bucket_size", buckets},         {"allgather_partitions", {true, false}},
              {"allgather_bucket_size", buckets},      {"contiguous_gradients", {false, true}}};
  }
}

std::vector<json> zero_knob_configs(int64_t stage, const json& user_zero, int64_t num_params) {
  json space = default_zero_tuning_space(stage);
  json tuned = json::object();
  for (auto it = space.begin(); it != space.end(); ++it) {
    const std::string& key = it.key();
    if (user_zero.is_object() && user_zero.contains(key)) continue;  // the user's value is fixed
    // Stage 3 gathers parameters with its own prefetch; these two are read by stages 1-2 only.
    if (stage == 3 && (key == "allgather_partitions" || key == "allgather_bucket_size")) continue;
    json values = json::array();
    std::set<int64_t> effective_sizes;
    for (const json& v : it.value()) {
      if (key.find("bucket_size") != std::string::npos && num_params > 0) {
        // A bucket holding every element behaves the same at any larger size.
        const int64_t effective = std::min<int64_t>(v.get<int64_t>(), num_params);
        if (!effective_sizes.insert(effective).second) continue;
      }
      values.push_back(v);
    }
    tuned[key] = values;
  }
  return combinations(tuned);
}

ModelInfo ModelInfo::from_json(const json& info, const json& profile_config) {
  ModelInfo m;
  m.num_params = info.at("num_params").get<int64_t>();
  m.largest_param_numel = info.value("largest_param_numel", int64_t{0});
  m.activation_bytes_per_sample = info.value("activation_mem_per_sample", int64_t{0});
  m.peak_bytes = info.value("peak_memory_bytes", int64_t{0});
  m.on_cpu = info.value("device", std::string("cpu")) == "cpu";
  m.profile_config = profile_config;
  return m;
}

MemoryPredictor::MemoryPredictor(ModelInfo info, int64_t dp_world_size)
    : info_(std::move(info)), dp_world_size_(dp_world_size) {
  const int64_t mbs = info_.profile_config.value("train_micro_batch_size_per_gpu", int64_t{1});
  overhead_ = info_.peak_bytes - model_state_bytes(info_.profile_config) - info_.activation_bytes_per_sample * mbs;
}

int64_t MemoryPredictor::model_state_bytes(const json& ds_config) const {
  json c = ds_config;
  c.erase("autotuning");  // only the states matter here
  const DeepSpeedConfig parsed = DeepSpeedConfig::from_json(c, dp_world_size_, "autotuning experiment");
  const ModelStateInputs in =
      model_state_inputs(parsed, info_.num_params, info_.largest_param_numel, info_.on_cpu);
  // On a CPU-only machine offloaded states live in the same process memory as the rest.
  return estimate_model_state_bytes(in).total_peak();
}

int64_t MemoryPredictor::predict(const json& ds_config) const {
  const int64_t mbs = ds_config.value("train_micro_batch_size_per_gpu", int64_t{1});
  return overhead_ + model_state_bytes(ds_config) + info_.activation_bytes_per_sample * mbs;
}

int64_t MemoryPredictor::max_micro_batch(const json& ds_config, int64_t budget) const {
  const int64_t fixed = overhead_ + model_state_bytes(ds_config);
  if (fixed + info_.activation_bytes_per_sample > budget) return 0;
  if (info_.activation_bytes_per_sample <= 0) return INT64_MAX;
  return (budget - fixed) / info_.activation_bytes_per_sample;
}

TunerOrder::TunerOrder(std::string type, std::vector<json> configs, uint64_t seed)
    : type_(std::move(type)), configs_(std::move(configs)), done_(configs_.size(), false) {
  order_.resize(configs_.size());
  std::iota(order_.begin(), order_.end(), 0);
  if (type_ != "gridsearch") {
    std::mt19937_64 rng(seed);
    std::shuffle(order_.begin(), order_.end(), rng);
  }
}

std::optional<size_t> TunerOrder::next(const std::vector<std::pair<size_t, double>>& measured) {
  for (const auto& [i, v] : measured) {
    if (i < done_.size()) done_[i] = true;
  }
  // model_based: after a few random trials, the configuration a ridge regression on one-hot
  // features of the measured ones predicts best (DeepSpeed fits XGBoost the same way).
  constexpr size_t kRandomInit = 3;
  if (type_ == "model_based" && measured.size() >= kRandomInit) {
    std::map<std::string, size_t> index;
    for (const auto& c : configs_) {
      for (const auto& f : features_of(c)) index.emplace(f, index.size());
    }
    auto row = [&](const json& c) {
      std::vector<double> x(index.size() + 1, 0.0);
      x.back() = 1.0;  // intercept
      for (const auto& f : features_of(c)) x[index[f]] = 1.0;
      return x;
    };
    std::vector<std::vector<double>> xs;
    std::vector<double> ys;
    for (const auto& [i, v] : measured) {
      xs.push_back(row(configs_[i]));
      ys.push_back(v);
    }
    const std::vector<double> w = ridge_fit(xs, ys, 1e-3);
    std::optional<size_t> best;
    double best_y = -INFINITY;
    for (size_t i = 0; i < configs_.size(); ++i) {
      if (done_[i]) continue;
      const std::vector<double> x = row(configs_[i]);
      const double y = std::inner_product(x.begin(), x.end(), w.begin(), 0.0);
      if (y > best_y) {
        best_y = y;
        best = i;
      }
    }
    return best;
  }
  for (size_t i : order_) {
    if (!done_[i]) return i;
  }
  return std::nullopt;
}

}  // namespace deepspeed::launcher
