#include "curriculum_windows.h"

#include <cmath>
#include <filesystem>
#include <string>

#include <ATen/ops/full.h>

#include "deepspeed/comm.h"
#include "deepspeed/errors.h"
#include "token_dataset.h"

namespace deepspeed::examples {
namespace {

constexpr const char* kMetric = "vocab_rarity";

// Where the analysis goes: SAVE_PATH of SAVE_PATH/vocab_rarity/vocab_rarity_<file>.
std::string analysis_root(const data_sampling::CurriculumMetricConfig& m) {
  const std::filesystem::path p(m.index_to_sample_path);
  const std::string file = p.filename().string();
  if (p.parent_path().filename() != kMetric || file.rfind(std::string(kMetric) + "_", 0) != 0) {
    throw UsageError(
        "train_gpt: data_efficiency.data_sampling.curriculum_learning.curriculum_metrics."
        "vocab_rarity.index_to_sample_path is " + m.index_to_sample_path +
        "; train_gpt writes its analysis as DeepSpeed's DataAnalyzer lays it out, "
        "DIR/vocab_rarity/vocab_rarity_index_to_sample(_percentile_merged)");
  }
  return p.parent_path().parent_path().string();
}

}  // namespace

std::vector<int64_t> vocab_rarity(const std::vector<uint16_t>& train, int64_t seq_len) {
  std::vector<double> count(65536, 0.0);
  for (uint16_t t : train) count[t] += 1;
  std::vector<double> surprise(65536, 0.0);
  const auto total = static_cast<double>(train.size());
  for (size_t t = 0; t < count.size(); ++t) {
    if (count[t] > 0) surprise[t] = -std::log(count[t] / total);
  }
  const int64_t windows = num_windows(train.size(), seq_len);
  std::vector<int64_t> out(static_cast<size_t>(windows));
  for (int64_t w = 0; w < windows; ++w) {
    double sum = 0;
    for (int64_t i = 0; i < seq_len; ++i) {
      sum += surprise[train[static_cast<size_t>(w * seq_len + i)]];
    }
    out[static_cast<size_t>(w)] = std::llround(100.0 * sum / static_cast<double>(seq_len));
  }
  return out;
}

std::unique_ptr<CurriculumWindows> CurriculumWindows::create(Engine& engine,
                                                             const std::vector<uint16_t>& train,
                                                             int64_t seq_len) {
  const auto config = data_sampling::data_sampling_config(engine.config());
  if (!config.curriculum_enabled) return nullptr;
  const data_sampling::CurriculumMetricConfig* metric = nullptr;
  for (const auto& m : config.metrics) {
    if (m.name != kMetric) {
      throw UsageError("train_gpt: data_efficiency.data_sampling.curriculum_learning."
                       "curriculum_metrics." + m.name + ": train_gpt computes the metric "
                       "vocab_rarity only");
    }
    metric = &m;
  }
  if (metric->clustering_type != "single_cluster") {
    // Rank 0 decides, so that every rank takes the analysis' collectives or none does.
    at::Tensor missing = at::full(
        {1}, static_cast<int64_t>(!std::filesystem::exists(metric->index_to_sample_path + ".idx")),
        at::kLong);
    comm::broadcast(missing, 0);
    if (missing.item<int64_t>() != 0) {
      const auto rarity = vocab_rarity(train, seq_len);
      data_sampling::DataAnalyzer analyzer(static_cast<int64_t>(rarity.size()),
                                           analysis_root(*metric));
      analyzer.add_metric(kMetric, [&rarity](int64_t w) { return rarity[static_cast<size_t>(w)]; });
      analyzer.run_map_reduce();
    }
  }
  return std::unique_ptr<CurriculumWindows>(new CurriculumWindows(
      data_sampling::make_engine_data_sampler(engine, num_windows(train.size(), seq_len))));
}

std::vector<int64_t> CurriculumWindows::next_micro_batch() {
  auto batch = sampler_->next();
  if (!batch) {
    throw UsageError("train_gpt: the data sampler has consumed data_sampling.num_epochs epochs; "
                     "raise num_epochs or train fewer steps");
  }
  return *batch;
}

}  // namespace deepspeed::examples
