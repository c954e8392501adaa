// What DataAnalyzer and DistributedDataAnalyzer share: the split of the samples over workers,
// the metric names' rules and the output files of the reduce.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace deepspeed::data_sampling::detail {

/// numpy.linspace(0, N, workers + 1, dtype=int)'s part w: [w * N / workers, (w + 1) * ...),
/// truncated, N exactly at the end (DeepSpeed's split_index).
std::pair<int64_t, int64_t> split_range(int64_t num_samples, int workers, int w);

/// Throws UsageError for a name that is empty, holds '/' or is in `taken`.
void check_metric_name(const std::string& name, const std::vector<std::string>& taken);

/// SAVE/NAME/NAME_{sample_to_metric, index_to_sample, index_to_metric,
/// index_to_sample_percentile_merged} for `values` (one per sample, in sample order). With
/// `doubled_end` the first three end their document twice, as DataAnalyzer's merge does;
/// without, once, as DistributedDataAnalyzer's ordered write does.
void write_single_value_outputs(const std::string& save_path, const std::string& name,
                                const std::vector<int64_t>& values, bool doubled_end);

/// SAVE/NAME/NAME_metric_value: `sum` as one item in the narrowest type holding it.
void write_accumulated_output(const std::string& save_path, const std::string& name,
                              const std::vector<int64_t>& sum);

}  // namespace deepspeed::data_sampling::detail
