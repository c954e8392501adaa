// make_variable_batch_loader: dynamic batching bound to an engine (its config section, batch
// sizes, data-parallel group and learning-rate schedule).
#include <string>

#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/indexed_dataset.h"
#include "deepspeed/pipe.h"
#include "deepspeed/variable_batch.h"
#include "runtime/data_efficiency/variable_batch_lr.h"
#include "util/check.h"

namespace deepspeed::data_sampling {
namespace {

constexpr const char* kSection = "data_efficiency.data_sampling.dynamic_batching";

// DataAnalyzer's output for a single-value metric named "seqlen", as DeepSpeed reads it.
std::vector<int64_t> seqlens_from_metrics(const DynamicBatchingConfig& config,
                                          const std::string& source) {
  DS_CHECK(!config.metrics_path.empty(), UsageError, source, ": ", kSection,
           ": no sequence lengths were given and metrics_path is not set (run DataAnalyzer "
           "with a metric named \"seqlen\" there, or pass the lengths)");
  const std::string prefix = config.metrics_path + "/seqlen/seqlen_sample_to_metric";
  const MMapIndexedDataset file(prefix);
  std::vector<int64_t> out;
  out.reserve(file.size());
  for (size_t i = 0; i < file.size(); ++i) {
    const auto item = file.item(i);
    DS_CHECK(item.size() == 1, UsageError, prefix, ": sample ", i, " has ", item.size(),
             " values; a seqlen metric has one per sample");
    out.push_back(item[0]);
  }
  return out;
}

}  // namespace

std::unique_ptr<VariableBatchLoader> make_variable_batch_loader(
    Engine& engine, std::vector<int64_t> seqlens, const std::vector<int64_t>* sequence_ids) {
  const DeepSpeedConfig& config = engine.config();
  const DynamicBatchingConfig dynamic = dynamic_batching_config(config);
  DS_CHECK(dynamic.enabled, UsageError, config.source, ": ", kSection,
           ".enabled is false; make_variable_batch_loader needs it");
  std::shared_ptr<VariableBatchLr> lr = engine_variable_batch_lr(engine);
  DS_CHECK(lr != nullptr, UsageError, config.source, ": ", kSection,
           ": the engine's learning-rate scheduler came from an LRSchedulerFactory, whose "
           "schedule cannot be rescaled per batch; configure the scheduler section instead");
  if (seqlens.empty()) seqlens = seqlens_from_metrics(dynamic, config.source);

  BatchBySeqlensOptions options;
  options.max_tokens = dynamic.max_tokens;
  options.min_batch_size = dynamic.min_batch_size;
  options.max_batch_size = dynamic.max_batch_size;
  options.sequence_picking_order = dynamic.sequence_picking_order;
  options.effective_batch_size = engine.train_batch_size();
  // Pipeline stages exchange activations of one shape per batch.
  options.required_microbatches_of_same_size =
      dynamic_cast<pipe::PipelineEngine*>(&engine) != nullptr;
  options.seed = dynamic.seed;
  options.verbose = dynamic.verbose;
  VariableBatches batches = batch_by_seqlens(seqlens, options, sequence_ids);

  lr->base_batch_size = engine.train_batch_size();
  lr->method = dynamic.lr_scaling_method;
  lr->batch_sizes = batches.batch_sizes;
  // Rewrites the current rate with the scaling: the schedule resumes where it is.
  if (optim::LRScheduler* scheduler = engine.lr_scheduler()) {
    scheduler->load_state_dict(scheduler->state_dict());
  }
  const comm::Group& dp = engine.data_parallel_group();
  return std::make_unique<VariableBatchLoader>(std::move(batches),
                                               engine.train_micro_batch_size_per_gpu(),
                                               dp.rank(), dp.size());
}

}  // namespace deepspeed::data_sampling
