// Our side of bench/data_sampling: the data analyzer over N samples of one integer metric (one
// worker), then the curriculum sampler drawing B global batches of G samples from its files.
// Prints `analyze_s=.. sample_ms_per_batch=..` for run.sh.
// Usage: data_sampling_bench WORK_DIR N G B
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "deepspeed/data_sampling.h"

namespace ds = deepspeed::data_sampling;

namespace {

// The metric both sides compute: 1000 distinct values scattered over the samples.
int64_t metric(int64_t s) { return (s * 2654435761LL) % 1000; }

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s WORK_DIR N G B\n", argv[0]);
    return 2;
  }
  const std::string work = argv[1];
  const int64_t n = std::atoll(argv[2]), g = std::atoll(argv[3]), b = std::atoll(argv[4]);
  auto t0 = std::chrono::steady_clock::now();
  ds::DataAnalyzer analyzer(n, work + "/ours", 1, 0);
  analyzer.add_metric("m", metric);
  analyzer.run_map_reduce();
  const double analyze_s = seconds_since(t0);

  std::ifstream in(work + "/config.json");
  nlohmann::json de = nlohmann::json::parse(in);
  de["data_sampling"]["curriculum_learning"]["data_cluster_path"] = work + "/our_clusters";
  for (auto& [name, m] : de["data_sampling"]["curriculum_learning"]["curriculum_metrics"].items()) {
    m["index_to_sample_path"] = work + "/ours/m/m_index_to_sample";
    m["index_to_metric_path"] = work + "/ours/m/m_index_to_metric";
  }
  const auto config = deepspeed::DeepSpeedConfig::from_json(
      {{"train_batch_size", g}, {"data_efficiency", de}}, 1);
  ds::DataSampler::Options options;
  options.one_epoch_total_samples = n;
  options.micro_batch_size = g;
  ds::DataSampler sampler(ds::data_sampling_config(config), options);
  t0 = std::chrono::steady_clock::now();
  int64_t checksum = 0;
  for (int64_t k = 0; k < b; ++k) checksum += sampler.next()->front();
  const double sample_s = seconds_since(t0);
  std::printf("analyze_s=%.4f sample_ms_per_batch=%.4f checksum=%lld\n", analyze_s,
              1000.0 * sample_s / static_cast<double>(b), static_cast<long long>(checksum));
  return 0;
}
