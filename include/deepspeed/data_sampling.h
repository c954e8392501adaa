// DeepSpeed's data sampling (data_efficiency.data_sampling): curriculum learning by difficulty
// metrics of the training samples (Li et al., "DeepSpeed Data Efficiency", 2022).
//
// Offline, DataAnalyzer computes each metric for every sample and writes DeepSpeed's index files
// (metric value -> samples; MMapIndexedDataset format, byte-for-byte DeepSpeed's). In training,
// DataSampler (DeepSpeed's DeepSpeedDataSampler) draws each global batch from the samples whose
// difficulty the curriculum has reached: a CurriculumScheduler per metric raises the difficulty
// over the steps, each rise adds a cluster of newly admitted samples (written under
// data_cluster_path), and a batch draws from the clusters in proportion to their sizes. The
// first rank of each data-parallel group draws and broadcasts; every rank gets its slice of each
// micro-batch. The sampler yields sample indices; the model's own data code loads them.
//
// Not DeepSpeed's: the random draws. DeepSpeed uses numpy's generator; here a 64-bit Mersenne
// Twister seeded with data_efficiency.seed, saved in checkpoints, so that resume continues the
// same draws (DeepSpeed's checkpoint saves numpy's global generator, not the sampler's). The
// clusters hold the same samples, the difficulties follow the same schedule.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/curriculum_scheduler.h"
#include "deepspeed/data_sampling_config.h"
#include "deepspeed/indexed_dataset.h"

namespace deepspeed {
class Engine;
}

namespace deepspeed::data_sampling {

/// DeepSpeed's DataAnalyzer. Each worker (by default each rank of the world) maps its contiguous
/// share of the samples; worker 0 then reduces into the files DeepSpeed's reduce writes:
/// - metrics of type single_value_per_sample (add_metric: one integer per sample):
///   SAVE_PATH/METRIC/METRIC_{sample_to_metric, index_to_sample, index_to_metric,
///   index_to_sample_percentile_merged};
/// - metrics of type accumulate_value_over_samples (add_accumulated_metric: a vector per
///   sample, summed over the dataset, e.g. a vocabulary histogram): SAVE_PATH/METRIC/
///   METRIC_metric_value, one item.
class DataAnalyzer {
 public:
  using Metric = std::function<int64_t(int64_t sample)>;
  using AccumulatedMetric = std::function<std::vector<int64_t>(int64_t sample)>;

  /// `num_workers`/`worker_id`: DeepSpeed's; 0 and -1 take the world's size and this rank.
  DataAnalyzer(int64_t num_samples, std::string save_path, int num_workers = 0,
               int worker_id = -1);

  void add_metric(std::string name, Metric metric);
  /// `metric` returns vectors of one length for every sample (UsageError otherwise).
  void add_accumulated_metric(std::string name, AccumulatedMetric metric);

  /// This worker's samples -> SAVE_PATH/METRIC/worker<W>_thread0/METRIC_sample_to_metric.
  void run_map();
  /// Worker 0's merge of every worker's map output into the final files (all workers' maps must
  /// have finished).
  void run_reduce();
  /// run_map, a barrier, run_reduce on worker 0, a barrier (DeepSpeed's run_map_reduce).
  void run_map_reduce();

  /// The half-open sample range worker `w` maps (DeepSpeed's split_index over the dataset).
  std::pair<int64_t, int64_t> worker_range(int w) const;

 private:
  void check_new_name(const std::string& name) const;
  void map_accumulated(const std::string& name, const AccumulatedMetric& metric) const;
  void reduce_accumulated(const std::string& name) const;

  int64_t num_samples_;
  std::string save_path_;
  int num_workers_;
  int worker_id_;
  std::vector<std::pair<std::string, Metric>> metrics_;
  std::vector<std::pair<std::string, AccumulatedMetric>> accumulated_;
};

/// DeepSpeed's DistributedDataAnalyzer: DataAnalyzer's analysis with collectives instead of a
/// folder every worker shares. Each rank of `group` (the world by default) computes its share
/// of the samples; the values travel to the group's first rank (all-gather; accumulated
/// vectors summed by all-reduce), which writes the output files under SAVE_PATH/METRIC.
/// Their contents equal DataAnalyzer's, and each file holds one document, as DeepSpeed's
/// file_write_ordered writes it (DataAnalyzer's merge ends some twice): the .bin files are
/// byte-equal, as DeepSpeed's own test asserts of its two analyzers. Unlike DeepSpeed's,
/// which needs all_to_all (Gloo lacks it), it runs on Gloo too.
class DistributedDataAnalyzer {
 public:
  DistributedDataAnalyzer(int64_t num_samples, std::string save_path,
                          comm::Group group = comm::Group());
  void add_metric(std::string name, DataAnalyzer::Metric metric);
  void add_accumulated_metric(std::string name, DataAnalyzer::AccumulatedMetric metric);
  /// Collective over the group.
  void run_map_reduce();

 private:
  int64_t num_samples_;
  std::string save_path_;
  comm::Group group_;
  std::vector<std::pair<std::string, DataAnalyzer::Metric>> metrics_;
  std::vector<std::pair<std::string, DataAnalyzer::AccumulatedMetric>> accumulated_;
};

// ---------------------------------------------------------------------------------------------

/// DeepSpeed's DeepSpeedDataSampler with curriculum learning on.
class DataSampler {
 public:
  struct Options {
    int64_t one_epoch_total_samples = 0;
    int64_t micro_batch_size = 1;
    int64_t gradient_accumulation_steps = 1;
    comm::Group data_parallel_group;  // the batch's ranks; its first draws and broadcasts (none:
                                      // a single process)
    bool drop_last = true;
  };

  DataSampler(DataSamplingConfig config, Options options);
  ~DataSampler();
  DataSampler(const DataSampler&) = delete;
  DataSampler& operator=(const DataSampler&) = delete;

  /// The sample indices of this rank's next micro-batch; nullopt once num_epochs epochs of
  /// samples are consumed. Collective over the data-parallel group at each new global batch.
  std::optional<std::vector<int64_t>> next();

  /// schedule_type "custom": metric name -> (curriculum step -> difficulty). Required before
  /// the first next() for each custom metric (DeepSpeed's set_custom_curriculum_learning_schedule).
  void set_custom_curriculum_learning_schedule(
      const std::map<std::string, std::function<int64_t(int64_t)>>& schedules);

  /// Each metric's difficulty for the current global batch.
  const std::map<std::string, int64_t>& current_difficulties() const { return difficulties_; }
  int64_t curriculum_step() const { return curriculum_step_; }
  int64_t consumed_samples() const { return consumed_samples_; }
  /// The cluster files so far (names under data_cluster_path) and their sizes (first rank). A
  /// cluster read to its end is reshuffled into a file of its own (NAME_shuffleK), so that a
  /// checkpoint's read positions keep pointing into the order they were taken from.
  const std::vector<std::string>& data_cluster_paths() const { return cluster_names_; }
  const std::vector<int64_t>& data_cluster_sizes() const { return cluster_sizes_; }

  /// DeepSpeed's keys (batch, consumed_samples, curriculum_step, current_difficulties,
  /// data_cluster_paths, data_cluster_current_position) and this sampler's generator state
  /// (rng_state): what checkpoints keep under 'data_sampler'.
  nlohmann::json state_dict() const;
  /// Restores it and reopens the clusters it names under data_cluster_path; a missing key or
  /// cluster file is an error naming `source`. Without rng_state (DeepSpeed's own checkpoint)
  /// the generator restarts from the seed.
  void load_state_dict(const nlohmann::json& state, const std::string& source);

  const DataSamplingConfig& config() const { return config_; }

 private:
  // Without a valid group (no process group initialized) the sampler is the only rank.
  int dp_size() const {
    return options_.data_parallel_group.valid() ? options_.data_parallel_group.size() : 1;
  }
  int dp_rank() const {
    return options_.data_parallel_group.valid() ? options_.data_parallel_group.rank() : 0;
  }
  bool leader() const { return dp_rank() == 0; }
  void next_global_batch();
  void add_cluster(const std::map<std::string, double>& previous);
  std::vector<int64_t> cluster_candidates(const std::map<std::string, double>& previous);
  std::vector<int64_t> samples_by_value(const CurriculumMetricConfig& m, double start,
                                        double end) const;
  std::vector<int64_t> samples_by_percentile(const CurriculumMetricConfig& m, int64_t start,
                                             int64_t end);
  std::vector<int64_t> take_from_cluster(size_t c, int64_t count);
  void write_cluster(size_t c);
  std::string cluster_prefix(const std::string& name) const;
  void shuffle(std::vector<int64_t>& v);
  uint64_t bounded(uint64_t n);

  DataSamplingConfig config_;
  Options options_;
  int64_t total_samples_ = 0;
  int64_t global_batch_size_ = 0;
  IndexDtype index_dtype_ = IndexDtype::kInt64;
  std::mt19937_64 rng_;
  std::map<std::string, CurriculumScheduler> schedulers_;
  std::map<std::string, int64_t> difficulties_;
  int64_t curriculum_step_ = 0;
  int64_t consumed_samples_ = 0;
  std::vector<int64_t> batch_;  // the rest of the current global batch
  std::vector<std::string> cluster_names_;
  std::vector<int64_t> cluster_positions_;
  std::vector<int64_t> cluster_sizes_;
  std::vector<std::vector<int64_t>> clusters_;  // first rank only: each cluster's order
  std::map<std::string, std::unique_ptr<MMapIndexedDataset>> index_to_sample_;
  std::map<std::string, std::vector<int64_t>> index_to_metric_;  // each row's value
  std::set<std::string> custom_set_;  // metrics given their custom schedule
  int64_t one_epoch_indexed_ = -1;  // percentile metrics: samples in index_to_sample
};

/// The engine's sampler (DeepSpeed's deepspeed_io(training_data) with curriculum learning on):
/// built from its config, batch sizes and data-parallel group, and saved in its checkpoints
/// under 'data_sampler' (load_checkpoint restores it). `one_epoch_total_samples`: the dataset's
/// size. The engine must outlive it; a second call replaces the first.
std::shared_ptr<DataSampler> make_engine_data_sampler(Engine& engine,
                                                      int64_t one_epoch_total_samples);

/// The sampler make_engine_data_sampler attached to `engine`, or null (checkpoints ask).
DataSampler* engine_data_sampler(const Engine& engine);

}  // namespace deepspeed::data_sampling
