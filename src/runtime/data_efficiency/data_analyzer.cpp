// DataAnalyzer: DeepSpeed's map-reduce over the dataset. For single_value_per_sample metrics the
// map writes each worker's values in sample order; the reduce (worker 0) writes the four files
// DeepSpeed's reduce leaves, byte-for-byte, for the same values: sample_to_metric (one item per
// sample), index_to_sample and index_to_metric (one item per distinct value, ascending; the
// samples of a value ascending), and index_to_sample_percentile_merged (the index_to_sample rows
// merged in groups of max(1, values / 100)). DeepSpeed builds the first three by merging one
// reduce thread's chunk into a fresh builder, which ends the document twice; so do these.
// For accumulate_value_over_samples metrics each worker writes the sum of its samples' vectors
// (int64) and the reduce their sum, in the narrowest type that holds its values.
#include <algorithm>
#include <filesystem>
#include <map>
#include <utility>

#include "deepspeed/data_sampling.h"
#include "runtime/data_efficiency/analyzer_outputs.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::data_sampling {
namespace {

std::string metric_dir(const std::string& save_path, const std::string& metric) {
  return save_path + "/" + metric;
}

std::string map_prefix(const std::string& save_path, const std::string& metric, int worker) {
  return metric_dir(save_path, metric) + "/worker" + std::to_string(worker) + "_thread0/" +
         metric + "_sample_to_metric";
}

// A fresh builder of `items`; with `doubled_end`, DataAnalyzer's doubled document end (see the
// file comment).
void write_items(const std::string& prefix, IndexDtype dtype,
                 const std::vector<std::vector<int64_t>>& items, bool doubled_end) {
  MMapIndexedDatasetBuilder builder(prefix, dtype);
  for (const auto& item : items) builder.add_item(item);
  if (doubled_end) builder.end_document();  // the merged chunk's own document end
  builder.finalize();
}

}  // namespace

namespace detail {

std::pair<int64_t, int64_t> split_range(int64_t num_samples, int workers, int w) {
  // numpy.linspace(0, N, num_workers + 1, dtype=int): i * (N / num_workers), truncated, and N
  // exactly at the end.
  const double step = static_cast<double>(num_samples) / workers;
  auto bound = [&](int i) {
    return i == workers ? num_samples : static_cast<int64_t>(static_cast<double>(i) * step);
  };
  return {bound(w), bound(w + 1)};
}

void check_metric_name(const std::string& name, const std::vector<std::string>& taken) {
  DS_CHECK(!name.empty() && name.find('/') == std::string::npos, UsageError,
           "DataAnalyzer: metric name \"", name, "\" (it names a folder)");
  DS_CHECK(std::find(taken.begin(), taken.end(), name) == taken.end(), UsageError,
           "DataAnalyzer: metric \"", name, "\" was added already");
}

void write_single_value_outputs(const std::string& save_path, const std::string& name,
                                const std::vector<int64_t>& values, bool doubled_end) {
  const auto num_samples = static_cast<int64_t>(values.size());
  const IndexDtype sample_dtype = fit_int_dtype(0, num_samples - 1);
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  const IndexDtype value_dtype = fit_int_dtype(*lo, *hi);
  std::filesystem::create_directories(metric_dir(save_path, name));
  const std::string dir = metric_dir(save_path, name) + "/" + name;

  std::vector<std::vector<int64_t>> per_sample;
  per_sample.reserve(values.size());
  for (int64_t v : values) per_sample.push_back({v});
  write_items(dir + "_sample_to_metric", value_dtype, per_sample, doubled_end);

  std::map<int64_t, std::vector<int64_t>> by_value;
  for (size_t s = 0; s < values.size(); ++s) by_value[values[s]].push_back(static_cast<int64_t>(s));
  std::vector<std::vector<int64_t>> index_to_sample;
  std::vector<std::vector<int64_t>> index_to_metric;
  for (auto& [value, samples] : by_value) {
    index_to_sample.push_back(std::move(samples));
    index_to_metric.push_back({value});
  }
  write_items(dir + "_index_to_sample", sample_dtype, index_to_sample, doubled_end);
  write_items(dir + "_index_to_metric", value_dtype, index_to_metric, doubled_end);

  const size_t step = std::max<size_t>(1, index_to_sample.size() / 100);
  std::vector<std::vector<int64_t>> merged;
  for (size_t v = 0; v < index_to_sample.size(); v += step) {
    std::vector<int64_t> row;
    for (size_t k = v; k < std::min(index_to_sample.size(), v + step); ++k) {
      row.insert(row.end(), index_to_sample[k].begin(), index_to_sample[k].end());
    }
    merged.push_back(std::move(row));
  }
  write_indexed_dataset(dir + "_index_to_sample_percentile_merged", sample_dtype, merged);
  log::info_rank0("DataAnalyzer: metric " + name + ": " + std::to_string(values.size()) +
                  " samples, " + std::to_string(by_value.size()) + " distinct values in [" +
                  std::to_string(*lo) + ", " + std::to_string(*hi) + "], stored as " +
                  dtype_name(value_dtype));
}

void write_accumulated_output(const std::string& save_path, const std::string& name,
                              const std::vector<int64_t>& sum) {
  DS_CHECK(!sum.empty(), UsageError, "DataAnalyzer: metric ", name, " accumulated no value");
  const auto [lo, hi] = std::minmax_element(sum.begin(), sum.end());
  const IndexDtype dtype = fit_int_dtype(*lo, *hi);
  std::filesystem::create_directories(metric_dir(save_path, name));
  write_indexed_dataset(metric_dir(save_path, name) + "/" + name + "_metric_value", dtype, {sum});
  log::info_rank0("DataAnalyzer: metric " + name + ": " + std::to_string(sum.size()) +
                  " accumulated values in [" + std::to_string(*lo) + ", " + std::to_string(*hi) +
                  "], stored as " + dtype_name(dtype));
}

}  // namespace detail

DataAnalyzer::DataAnalyzer(int64_t num_samples, std::string save_path, int num_workers,
                           int worker_id)
    : num_samples_(num_samples),
      save_path_(std::move(save_path)),
      num_workers_(num_workers > 0 ? num_workers
                                   : (comm::is_initialized() ? comm::get_world_size() : 1)),
      worker_id_(worker_id >= 0 ? worker_id : (comm::is_initialized() ? comm::get_rank() : 0)) {
  DS_CHECK(num_samples_ > 0, UsageError, "DataAnalyzer: the dataset has no sample");
  DS_CHECK(worker_id_ < num_workers_, UsageError, "DataAnalyzer: worker_id ", worker_id_,
           " is not below num_workers ", num_workers_);
}

void DataAnalyzer::check_new_name(const std::string& name) const {
  std::vector<std::string> taken;
  for (const auto& entry : metrics_) taken.push_back(entry.first);
  for (const auto& entry : accumulated_) taken.push_back(entry.first);
  detail::check_metric_name(name, taken);
}

void DataAnalyzer::add_metric(std::string name, Metric metric) {
  check_new_name(name);
  metrics_.emplace_back(std::move(name), std::move(metric));
}

void DataAnalyzer::add_accumulated_metric(std::string name, AccumulatedMetric metric) {
  check_new_name(name);
  accumulated_.emplace_back(std::move(name), std::move(metric));
}

void DataAnalyzer::map_accumulated(const std::string& name,
                                   const AccumulatedMetric& metric) const {
  const auto [begin, end] = worker_range(worker_id_);
  std::vector<int64_t> sum;
  for (int64_t s = begin; s < end; ++s) {
    const std::vector<int64_t> value = metric(s);
    if (s == begin) sum.assign(value.size(), 0);
    DS_CHECK(value.size() == sum.size(), UsageError, "DataAnalyzer: metric ", name, " gave ",
             value.size(), " values for sample ", s, " and ", sum.size(), " for sample ", begin,
             "; an accumulated metric has one length");
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += value[i];
  }
  const std::string prefix = metric_dir(save_path_, name) + "/worker" +
                             std::to_string(worker_id_) + "_thread0/" + name + "_metric_value";
  std::filesystem::create_directories(std::filesystem::path(prefix).parent_path());
  // DeepSpeed writes nothing for a worker without samples; neither does this.
  if (begin < end) write_indexed_dataset(prefix, IndexDtype::kInt64, {sum});
}

void DataAnalyzer::reduce_accumulated(const std::string& name) const {
  std::vector<int64_t> sum;
  bool any = false;
  for (int w = 0; w < num_workers_; ++w) {
    const auto [begin, end] = worker_range(w);
    if (begin == end) continue;
    const MMapIndexedDataset part(metric_dir(save_path_, name) + "/worker" + std::to_string(w) +
                                  "_thread0/" + name + "_metric_value");
    DS_CHECK(part.size() == 1, UsageError, part.prefix(), ": ", part.size(),
             " items; a worker's accumulated value is one");
    const std::vector<int64_t> value = part.item(0);
    if (!any) sum.assign(value.size(), 0);
    DS_CHECK(value.size() == sum.size(), UsageError, part.prefix(), ": ", value.size(),
             " values, where worker 0 has ", sum.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += value[i];
    any = true;
  }
  detail::write_accumulated_output(save_path_, name, sum);
}

std::pair<int64_t, int64_t> DataAnalyzer::worker_range(int w) const {
  return detail::split_range(num_samples_, num_workers_, w);
}

void DataAnalyzer::run_map() {
  DS_CHECK(!metrics_.empty() || !accumulated_.empty(), UsageError,
           "DataAnalyzer: no metric; call add_metric or add_accumulated_metric first");
  for (const auto& [name, metric] : accumulated_) map_accumulated(name, metric);
  const auto [begin, end] = worker_range(worker_id_);
  for (const auto& [name, metric] : metrics_) {
    const std::string prefix = map_prefix(save_path_, name, worker_id_);
    std::filesystem::create_directories(std::filesystem::path(prefix).parent_path());
    MMapIndexedDatasetBuilder builder(prefix, IndexDtype::kInt64);
    for (int64_t s = begin; s < end; ++s) builder.add_item({metric(s)});
    builder.finalize();
  }
}

void DataAnalyzer::run_reduce() {
  DS_CHECK(!metrics_.empty() || !accumulated_.empty(), UsageError,
           "DataAnalyzer: no metric; call add_metric or add_accumulated_metric first");
  for (const auto& entry : accumulated_) reduce_accumulated(entry.first);
  for (const auto& entry : metrics_) {
    const std::string& name = entry.first;
    std::vector<int64_t> values;
    values.reserve(static_cast<size_t>(num_samples_));
    for (int w = 0; w < num_workers_; ++w) {
      const MMapIndexedDataset part(map_prefix(save_path_, name, w));
      const auto [begin, end] = worker_range(w);
      DS_CHECK(static_cast<int64_t>(part.size()) == end - begin, UsageError, part.prefix(),
               ": ", part.size(), " samples, but worker ", w, " maps ", end - begin,
               " (did its map finish?)");
      for (size_t i = 0; i < part.size(); ++i) values.push_back(part.item(i).at(0));
    }
    detail::write_single_value_outputs(save_path_, name, values, /*doubled_end=*/true);
  }
}

void DataAnalyzer::run_map_reduce() {
  run_map();
  if (comm::is_initialized()) comm::barrier();
  if (worker_id_ == 0) run_reduce();
  if (comm::is_initialized()) comm::barrier();
}

}  // namespace deepspeed::data_sampling
