// DistributedDataAnalyzer: each rank maps its share of the samples; the shares meet on every
// rank by one all-gather per metric (padded to the largest share), the accumulated vectors by
// an all-reduce, and the group's first rank writes the files.
#include <algorithm>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include "deepspeed/data_sampling.h"
#include "runtime/data_efficiency/analyzer_outputs.h"
#include "util/check.h"

namespace deepspeed::data_sampling {

DistributedDataAnalyzer::DistributedDataAnalyzer(int64_t num_samples, std::string save_path,
                                                 comm::Group group)
    : num_samples_(num_samples),
      save_path_(std::move(save_path)),
      group_(group.valid() ? std::move(group) : comm::world()) {
  DS_CHECK(num_samples_ > 0, UsageError, "DistributedDataAnalyzer: the dataset has no sample");
}

void DistributedDataAnalyzer::add_metric(std::string name, DataAnalyzer::Metric metric) {
  std::vector<std::string> taken;
  for (const auto& entry : metrics_) taken.push_back(entry.first);
  for (const auto& entry : accumulated_) taken.push_back(entry.first);
  detail::check_metric_name(name, taken);
  metrics_.emplace_back(std::move(name), std::move(metric));
}

void DistributedDataAnalyzer::add_accumulated_metric(std::string name,
                                                     DataAnalyzer::AccumulatedMetric metric) {
  std::vector<std::string> taken;
  for (const auto& entry : metrics_) taken.push_back(entry.first);
  for (const auto& entry : accumulated_) taken.push_back(entry.first);
  detail::check_metric_name(name, taken);
  accumulated_.emplace_back(std::move(name), std::move(metric));
}

void DistributedDataAnalyzer::run_map_reduce() {
  DS_CHECK(!metrics_.empty() || !accumulated_.empty(), UsageError,
           "DistributedDataAnalyzer: no metric; call add_metric or add_accumulated_metric first");
  const int workers = group_.size();
  const int me = group_.rank();
  const auto [begin, end] = detail::split_range(num_samples_, workers, me);
  const bool writer = me == 0;

  int64_t widest = 0;  // the largest share: every rank's padded length in the all-gather
  for (int w = 0; w < workers; ++w) {
    const auto [b, e] = detail::split_range(num_samples_, workers, w);
    widest = std::max(widest, e - b);
  }
  for (const auto& [name, metric] : metrics_) {
    at::Tensor mine = at::zeros({widest}, at::kLong);
    auto* out = mine.data_ptr<int64_t>();
    for (int64_t s = begin; s < end; ++s) out[s - begin] = metric(s);
    at::Tensor all = at::empty({widest * workers}, at::kLong);
    comm::all_gather(all, mine, false, group_);
    if (!writer) continue;
    std::vector<int64_t> values;
    values.reserve(static_cast<size_t>(num_samples_));
    const auto* gathered = all.data_ptr<int64_t>();
    for (int w = 0; w < workers; ++w) {
      const auto [b, e] = detail::split_range(num_samples_, workers, w);
      values.insert(values.end(), gathered + w * widest, gathered + w * widest + (e - b));
    }
    detail::write_single_value_outputs(save_path_, name, values, /*doubled_end=*/false);
  }
  for (const auto& [name, metric] : accumulated_) {
    std::vector<int64_t> sum;
    for (int64_t s = begin; s < end; ++s) {
      const std::vector<int64_t> value = metric(s);
      if (s == begin) sum.assign(value.size(), 0);
      DS_CHECK(value.size() == sum.size(), UsageError, "DistributedDataAnalyzer: metric ", name,
               " gave ", value.size(), " values for sample ", s, " and ", sum.size(),
               " for sample ", begin, "; an accumulated metric has one length");
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += value[i];
    }
    // The vectors' length first: a rank without samples has none of its own.
    at::Tensor length = at::full({1}, static_cast<int64_t>(sum.size()), at::kLong);
    comm::all_reduce(length, comm::ReduceOp::kMax, false, group_);
    const int64_t n = length.item<int64_t>();
    DS_CHECK(sum.empty() || static_cast<int64_t>(sum.size()) == n, UsageError,
             "DistributedDataAnalyzer: metric ", name, " has ", sum.size(),
             " values on group rank ", me, " and ", n, " on another");
    at::Tensor total = at::zeros({n}, at::kLong);
    std::copy(sum.begin(), sum.end(), total.data_ptr<int64_t>());
    comm::all_reduce(total, comm::ReduceOp::kSum, false, group_);
    if (!writer) continue;
    const auto* t = total.data_ptr<int64_t>();
    detail::write_accumulated_output(save_path_, name, std::vector<int64_t>(t, t + n));
  }
  comm::barrier(group_);
}

}  // namespace deepspeed::data_sampling
