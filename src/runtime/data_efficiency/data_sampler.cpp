// DataSampler: DeepSpeed's DeepSpeedDataSampler with curriculum learning on. Each global batch:
// the curriculum step advances, every metric's scheduler gives its difficulty, a change of any
// difficulty admits a new cluster of samples, and the data-parallel group's first rank draws the
// batch from the clusters (in proportion to their sizes, each cluster read in its shuffled order
// and reshuffled when exhausted), shuffles it and broadcasts it.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <mutex>
#include <numeric>
#include <sstream>
#include <utility>

#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>

#include "deepspeed/data_sampling.h"
#include "deepspeed/engine.h"
#include "runtime/data_efficiency/sampler_checkpoint.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::data_sampling {
namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

std::vector<int64_t> arange(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// numpy's intersect1d / setdiff1d of unique arrays: sorted results.
std::vector<int64_t> intersect(std::vector<int64_t> a, std::vector<int64_t> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<int64_t> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

std::vector<int64_t> difference(std::vector<int64_t> a, std::vector<int64_t> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<int64_t> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// "cluster_a3" -> "cluster_a3_shuffle1" -> "cluster_a3_shuffle2" ...
std::string reshuffled_name(const std::string& name) {
  static const std::string kTag = "_shuffle";
  const size_t at = name.rfind(kTag);
  if (at != std::string::npos && at + kTag.size() < name.size() &&
      name.find_first_not_of("0123456789", at + kTag.size()) == std::string::npos) {
    return name.substr(0, at) + kTag +
           std::to_string(std::stoll(name.substr(at + kTag.size())) + 1);
  }
  return name + kTag + "1";
}

template <typename T>
T state_get(const nlohmann::json& state, const char* key, const std::string& source) {
  DS_CHECK(state.is_object() && state.contains(key), CheckpointError, source,
           ": data_sampler has no '", key, "'");
  try {
    return state.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(source + ": data_sampler '" + key + "' has the wrong type: " +
                          e.what());
  }
}

}  // namespace

DataSampler::DataSampler(DataSamplingConfig config, Options options)
    : config_(std::move(config)), options_(std::move(options)) {
  DS_CHECK(config_.curriculum_enabled, UsageError,
           "DataSampler: data_efficiency.data_sampling.curriculum_learning.enabled is false; "
           "DeepSpeed's data sampler serves curriculum learning only");
  DS_CHECK(options_.one_epoch_total_samples > 0, UsageError,
           "DataSampler: one_epoch_total_samples is ", options_.one_epoch_total_samples,
           "; no sample to consume");
  DS_CHECK(options_.micro_batch_size > 0 && options_.gradient_accumulation_steps > 0,
           UsageError, "DataSampler: micro_batch_size ", options_.micro_batch_size,
           " and gradient_accumulation_steps ", options_.gradient_accumulation_steps,
           " must be positive");
  total_samples_ = options_.one_epoch_total_samples * config_.num_epochs;
  global_batch_size_ = options_.micro_batch_size * dp_size() *
                       options_.gradient_accumulation_steps;
  index_dtype_ = fit_int_dtype(0, options_.one_epoch_total_samples);
  rng_.seed(static_cast<uint64_t>(config_.seed));
  for (const auto& m : config_.metrics) {
    schedulers_.emplace(m.name, CurriculumScheduler(m.schedule));
  }
  if (!leader()) return;
  std::filesystem::create_directories(config_.data_cluster_path);
  for (const auto& m : config_.metrics) {
    if (m.clustering_type == "single_cluster") continue;
    index_to_sample_[m.name] = std::make_unique<MMapIndexedDataset>(m.index_to_sample_path);
    if (m.difficulty_type != "value") continue;
    const MMapIndexedDataset metric(m.index_to_metric_path);
    DS_CHECK(metric.size() == index_to_sample_[m.name]->size(), UsageError,
             m.index_to_metric_path, ": ", metric.size(), " rows, but ", m.index_to_sample_path,
             " has ", index_to_sample_[m.name]->size());
    auto& values = index_to_metric_[m.name];
    for (size_t row = 0; row < metric.size(); ++row) values.push_back(metric.item(row).at(0));
  }
}

DataSampler::~DataSampler() = default;

void DataSampler::set_custom_curriculum_learning_schedule(
    const std::map<std::string, std::function<int64_t(int64_t)>>& schedules) {
  for (const auto& [name, fn] : schedules) {
    auto it = schedulers_.find(name);
    if (it == schedulers_.end()) continue;  // as DeepSpeed: only the configured metrics
    it->second.set_custom_get_difficulty(fn);
    custom_set_.insert(name);
  }
}

std::string DataSampler::cluster_prefix(const std::string& name) const {
  return config_.data_cluster_path + "/" + name;
}

uint64_t DataSampler::bounded(uint64_t n) {
  // Uniform in [0, n) without modulo bias.
  const uint64_t limit = std::numeric_limits<uint64_t>::max() -
                         std::numeric_limits<uint64_t>::max() % n;
  uint64_t x;
  do {
    x = rng_();
  } while (x >= limit);
  return x % n;
}

void DataSampler::shuffle(std::vector<int64_t>& v) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[bounded(i)]);
}

std::vector<int64_t> DataSampler::samples_by_value(const CurriculumMetricConfig& m, double start,
                                                   double end) const {
  const auto& values = index_to_metric_.at(m.name);
  const MMapIndexedDataset& rows = *index_to_sample_.at(m.name);
  std::vector<int64_t> out;
  for (size_t row = 0; row < rows.size(); ++row) {
    const auto v = static_cast<double>(values[row]);
    if (v <= end && v > start) {
      const auto samples = rows.item(row);
      out.insert(out.end(), samples.begin(), samples.end());
    }
  }
  return out;
}

std::vector<int64_t> DataSampler::samples_by_percentile(const CurriculumMetricConfig& m,
                                                        int64_t start, int64_t end) {
  const MMapIndexedDataset& rows = *index_to_sample_.at(m.name);
  if (one_epoch_indexed_ < 0) {
    one_epoch_indexed_ = 0;
    for (int32_t s : rows.sizes()) one_epoch_indexed_ += s;
  }
  const int64_t max_percentile = m.schedule.max_difficulty;
  const int64_t per_percentile = one_epoch_indexed_ / max_percentile;
  const int64_t start_count = per_percentile * start;
  const int64_t end_count = end == max_percentile ? one_epoch_indexed_ : per_percentile * end;
  std::vector<int64_t> out;
  int64_t count = 0;
  for (size_t row = 0; row < rows.size() && count < end_count; ++row) {
    const int64_t size = rows.sizes()[row];
    if (count + size > start_count) {
      const int64_t row_start = std::max<int64_t>(0, start_count - count);
      const int64_t row_end = count + size <= end_count ? size : end_count - count;
      const auto part = rows.item_slice(row, static_cast<size_t>(row_start),
                                        static_cast<size_t>(row_end));
      out.insert(out.end(), part.begin(), part.end());
    }
    count += size;
  }
  return out;
}

std::vector<int64_t> DataSampler::cluster_candidates(
    const std::map<std::string, double>& previous) {
  int clustered = 0;
  for (const auto& m : config_.metrics) clustered += m.clustering_type != "single_cluster";
  if (clustered > 1) {
    // Several clustered metrics: the samples every metric admits now, less the clusters so far.
    std::optional<std::vector<int64_t>> out;
    for (const auto& m : config_.metrics) {
      std::vector<int64_t> admitted;
      const int64_t now = difficulties_.at(m.name);
      if (m.clustering_type == "single_cluster") {
        admitted = arange(options_.one_epoch_total_samples);
      } else if (m.difficulty_type == "value") {
        admitted = samples_by_value(m, kMinusInf, static_cast<double>(now));
      } else {
        admitted = samples_by_percentile(m, 0, now);
      }
      out = out ? intersect(std::move(*out), std::move(admitted)) : std::move(admitted);
    }
    for (const auto& cluster : clusters_) out = difference(std::move(*out), cluster);
    return *out;
  }
  // One clustered metric: the samples between the previous difficulty and this one.
  std::vector<int64_t> out;
  if (clusters_.empty()) out = arange(options_.one_epoch_total_samples);
  for (const auto& m : config_.metrics) {
    if (m.clustering_type == "single_cluster") continue;
    const int64_t now = difficulties_.at(m.name);
    if (m.difficulty_type == "value") {
      out = samples_by_value(m, previous.at(m.name), static_cast<double>(now));
    } else {
      out = samples_by_percentile(m, static_cast<int64_t>(previous.at(m.name)), now);
    }
  }
  return out;
}

void DataSampler::write_cluster(size_t c) {
  // One process writes (DeepSpeed's global rank 0); each group's first rank keeps its own copy.
  if (comm::is_initialized() && comm::get_rank() != 0) return;
  write_indexed_dataset(cluster_prefix(cluster_names_[c]), index_dtype_, {clusters_[c]});
}

void DataSampler::add_cluster(const std::map<std::string, double>& previous) {
  std::string name = "cluster";
  for (const auto& m : config_.metrics) {
    name += "_" + m.name + std::to_string(difficulties_.at(m.name));
  }
  int64_t size = 0;
  std::vector<int64_t> cluster;
  if (leader()) {
    cluster = cluster_candidates(previous);
    size = static_cast<int64_t>(cluster.size());
  }
  if (dp_size() > 1) {
    at::Tensor t = at::full({1}, size, at::kLong);
    comm::broadcast(t, options_.data_parallel_group.global_rank(0), false,
                    options_.data_parallel_group);
    size = t.item<int64_t>();
  }
  if (size == 0) {
    log::info_rank0("data sampler: no sample has the difficulties of " + name + "; skipped");
    return;
  }
  cluster_names_.push_back(name);
  cluster_positions_.push_back(0);
  cluster_sizes_.push_back(size);
  if (!leader()) return;
  shuffle(cluster);
  clusters_.push_back(std::move(cluster));
  write_cluster(clusters_.size() - 1);
  log::info_rank0("data sampler: new cluster " + name + " of " + std::to_string(size) +
                  " samples (curriculum step " + std::to_string(curriculum_step_) + ")");
}

std::vector<int64_t> DataSampler::take_from_cluster(size_t c, int64_t count) {
  std::vector<int64_t>& cluster = clusters_[c];
  const auto begin = static_cast<size_t>(cluster_positions_[c]);
  const size_t end = std::min(cluster.size(), begin + static_cast<size_t>(count));
  std::vector<int64_t> out(cluster.begin() + static_cast<std::ptrdiff_t>(std::min(begin, end)),
                           cluster.begin() + static_cast<std::ptrdiff_t>(end));
  cluster_positions_[c] += count;
  if (static_cast<int64_t>(out.size()) < count) {
    // Exhausted: reshuffled, then read from its start again. DeepSpeed rewrites the cluster's
    // file in place, which changes the order an earlier checkpoint's position refers to; here
    // the new order gets a file of its own, so that every checkpoint resumes exactly.
    const auto rest = static_cast<size_t>(count - static_cast<int64_t>(out.size()));
    shuffle(cluster);
    cluster_names_[c] = reshuffled_name(cluster_names_[c]);
    write_cluster(c);
    out.insert(out.end(), cluster.begin(),
               cluster.begin() + static_cast<std::ptrdiff_t>(std::min(rest, cluster.size())));
    cluster_positions_[c] = static_cast<int64_t>(rest);
  }
  return out;
}

void DataSampler::next_global_batch() {
  for (const auto& m : config_.metrics) {
    DS_CHECK(m.schedule.schedule_type != "custom" || custom_set_.count(m.name), UsageError,
             "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.", m.name,
             ".schedule_type is \"custom\" but no schedule was set: call "
             "set_custom_curriculum_learning_schedule({{\"", m.name, "\", fn}}) first");
  }
  ++curriculum_step_;
  bool changed = false;
  std::map<std::string, double> previous;
  for (const auto& m : config_.metrics) {
    const int64_t next = schedulers_.at(m.name).update_difficulty(curriculum_step_);
    auto it = difficulties_.find(m.name);
    changed = changed || it == difficulties_.end() || it->second != next;
    if (it != difficulties_.end()) {
      previous[m.name] = static_cast<double>(it->second);
    } else {
      previous[m.name] = m.difficulty_type == "value" ? kMinusInf : 0.0;
    }
    difficulties_[m.name] = next;
  }
  if (changed) add_cluster(previous);
  at::Tensor batch = at::full({global_batch_size_}, -1, at::kLong);
  if (leader()) {
    DS_CHECK(!cluster_sizes_.empty(), UsageError, "data sampler: no sample is admitted at "
             "curriculum step ", curriculum_step_, " (difficulties of every cluster empty); "
             "check min_difficulty against the metric's values");
    const double total = static_cast<double>(
        std::accumulate(cluster_sizes_.begin(), cluster_sizes_.end(), int64_t{0}));
    std::vector<double> cumulative;
    double acc = 0;
    for (int64_t s : cluster_sizes_) cumulative.push_back(acc += static_cast<double>(s) / total);
    std::vector<int64_t> counts(cluster_sizes_.size(), 0);
    for (int64_t k = 0; k < global_batch_size_; ++k) {
      const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
      const auto c = std::upper_bound(cumulative.begin(), cumulative.end() - 1, u) -
                     cumulative.begin();
      ++counts[static_cast<size_t>(c)];
    }
    std::vector<int64_t> drawn;
    for (size_t c = 0; c < counts.size(); ++c) {
      const auto part = take_from_cluster(c, counts[c]);
      drawn.insert(drawn.end(), part.begin(), part.end());
    }
    shuffle(drawn);
    std::copy(drawn.begin(), drawn.end(), batch.data_ptr<int64_t>());
  }
  if (dp_size() > 1) {
    comm::broadcast(batch, options_.data_parallel_group.global_rank(0), false,
                    options_.data_parallel_group);
  }
  batch_.clear();
  const int64_t* p = batch.data_ptr<int64_t>();
  for (int64_t k = 0; k < global_batch_size_; ++k) {
    if (p[k] != -1) batch_.push_back(p[k]);  // -1 pads a batch the clusters could not fill
  }
}

std::optional<std::vector<int64_t>> DataSampler::next() {
  const int64_t dp = dp_size();
  const int64_t per_step = options_.micro_batch_size * dp;
  while (consumed_samples_ <= total_samples_) {
    if (batch_.empty()) next_global_batch();
    DS_INTERNAL_ASSERT(!batch_.empty(), "global batch ", curriculum_step_, " is empty");
    const size_t take = std::min(batch_.size(), static_cast<size_t>(per_step));
    std::vector<int64_t> current(batch_.begin(), batch_.begin() + static_cast<ptrdiff_t>(take));
    batch_.erase(batch_.begin(), batch_.begin() + static_cast<ptrdiff_t>(take));
    if (static_cast<int64_t>(current.size()) == per_step ||
        (!current.empty() && !options_.drop_last)) {
      // DeepSpeed's get_start_end_idx: Python's round (half to even) of r * len / dp.
      const auto len = static_cast<double>(current.size());
      const int r = dp_rank();
      const auto start = static_cast<size_t>(std::nearbyint(r * len / static_cast<double>(dp)));
      const auto end =
          static_cast<size_t>(std::nearbyint((r + 1) * len / static_cast<double>(dp)));
      consumed_samples_ += static_cast<int64_t>(current.size());
      return std::vector<int64_t>(current.begin() + static_cast<ptrdiff_t>(start),
                                  current.begin() + static_cast<ptrdiff_t>(end));
    }
  }
  return std::nullopt;
}

nlohmann::json DataSampler::state_dict() const {
  std::ostringstream rng;
  rng << rng_;
  return {{"batch", batch_},
          {"consumed_samples", consumed_samples_},
          {"curriculum_step", curriculum_step_},
          {"current_difficulties", difficulties_},
          {"data_cluster_paths", cluster_names_},
          {"data_cluster_current_position", cluster_positions_},
          {"np_rng_state", numpy_seeded_state(static_cast<uint32_t>(config_.seed))},
          {"rng_state", rng.str()}};
}

void DataSampler::load_state_dict(const nlohmann::json& state, const std::string& source) {
  auto batch = state_get<std::vector<int64_t>>(state, "batch", source);
  const auto consumed = state_get<int64_t>(state, "consumed_samples", source);
  const auto step = state_get<int64_t>(state, "curriculum_step", source);
  auto difficulties =
      state_get<std::map<std::string, int64_t>>(state, "current_difficulties", source);
  auto names = state_get<std::vector<std::string>>(state, "data_cluster_paths", source);
  auto positions =
      state_get<std::vector<int64_t>>(state, "data_cluster_current_position", source);
  DS_CHECK(names.size() == positions.size(), CheckpointError, source, ": data_sampler names ",
           names.size(), " clusters but has ", positions.size(), " positions");
  for (auto& name : names) {
    // DeepSpeed's older checkpoints hold absolute paths; the folder is the config's now.
    if (const auto slash = name.rfind('/'); slash != std::string::npos) {
      name = name.substr(slash + 1);
    }
  }
  std::vector<std::vector<int64_t>> clusters;
  std::vector<int64_t> sizes;
  if (leader()) {
    for (const auto& name : names) {
      const std::string prefix = cluster_prefix(name);
      DS_CHECK(std::filesystem::exists(prefix + ".idx"), CheckpointError, source,
               ": data_sampler names cluster ", name, ", but ", prefix,
               ".idx is missing (data_cluster_path must be the saving run's)");
      const MMapIndexedDataset cluster(prefix);
      DS_CHECK(cluster.size() >= 1, CheckpointError, prefix, ": an empty cluster file");
      clusters.push_back(cluster.item(0));
      sizes.push_back(static_cast<int64_t>(clusters.back().size()));
    }
  }
  if (state.contains("rng_state")) {
    std::istringstream in(state_get<std::string>(state, "rng_state", source));
    in >> rng_;
    DS_CHECK(!in.fail(), CheckpointError, source, ": data_sampler 'rng_state' is unreadable");
  } else {
    rng_.seed(static_cast<uint64_t>(config_.seed));
    log::warn_rank0(source + ": data_sampler has no rng_state (a DeepSpeed checkpoint keeps "
                    "numpy's); the sampler's draws restart from data_efficiency.seed");
  }
  batch_ = std::move(batch);
  consumed_samples_ = consumed;
  curriculum_step_ = step;
  for (const auto& [name, difficulty] : difficulties) {
    auto it = schedulers_.find(name);
    DS_CHECK(it != schedulers_.end(), CheckpointError, source, ": data_sampler has metric ",
             name, ", which the config's curriculum_metrics lacks");
    it->second.set_current_difficulty(difficulty);
  }
  difficulties_ = std::move(difficulties);
  cluster_names_ = std::move(names);
  cluster_positions_ = std::move(positions);
  clusters_ = std::move(clusters);
  cluster_sizes_ = std::move(sizes);
}

// ---------------------------------------------------------------------------------------------
// the engine's sampler

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

// Engine -> its sampler. A side table rather than an Engine member: the engine's checkpoint code
// asks it, and the sampler stays a separate, optional part.
std::map<const Engine*, std::weak_ptr<DataSampler>>& registry() {
  static std::map<const Engine*, std::weak_ptr<DataSampler>> r;
  return r;
}

}  // namespace

std::shared_ptr<DataSampler> make_engine_data_sampler(Engine& engine,
                                                      int64_t one_epoch_total_samples) {
  DataSampler::Options options;
  options.one_epoch_total_samples = one_epoch_total_samples;
  options.micro_batch_size = engine.train_micro_batch_size_per_gpu();
  options.gradient_accumulation_steps = engine.gradient_accumulation_steps();
  options.data_parallel_group = engine.data_parallel_group();
  auto sampler = std::make_shared<DataSampler>(data_sampling_config(engine.config()), options);
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[&engine] = sampler;
  return sampler;
}

DataSampler* engine_data_sampler(const Engine& engine) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(&engine);
  if (it == registry().end()) return nullptr;
  return it->second.lock().get();  // the caller's shared_ptr keeps it alive
}

}  // namespace deepspeed::data_sampling
