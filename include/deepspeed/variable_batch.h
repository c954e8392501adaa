// DeepSpeed's dynamic batching (data_efficiency.data_sampling.dynamic_batching; its
// variable_batch_size_and_lr.py): micro-batches packed with whole sequences up to max_tokens of
// summed length, so that a batch holds as many sequences as fit rather than a fixed count, and
// the learning rate of each optimizer step scaled by that step's number of sequences.
//
//   auto engine = deepspeed::initialize(...);           // dynamic_batching.enabled in the config
//   auto loader = make_variable_batch_loader(*engine, seqlens);
//   while (auto mb = loader->next()) {                  // this rank's part of one micro-step
//     auto batch = collate(mb->samples, mb->max_seqlen); // your data, padded as you need
//     engine->backward(engine->forward(batch)); engine->step();
//   }
//
// The engine scales its learning rate by itself once the loader exists (the config's scheduler
// or the optimizer's constant rate, as DeepSpeed's VariableBatchSizeLR wraps either).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "deepspeed/dynamic_batching_config.h"

namespace deepspeed {
class Engine;
}

namespace deepspeed::data_sampling {

/// batch_by_seqlens's arguments beyond the lengths (DeepSpeed's, same defaults).
struct BatchBySeqlensOptions {
  int64_t max_tokens = 0;     // a micro-batch's summed lengths stay at or below this
  int64_t min_batch_size = 1;  // sequences per micro-batch; 0: no minimum
  std::optional<int64_t> max_batch_size;
  std::string sequence_picking_order = "dataloader";  // "dataloader" | "random" | "seqlen"
  /// Micro-batches per batch (the engine's train_batch_size: micro-batch size x gradient
  /// accumulation x data-parallel size, counted in micro-batches as DeepSpeed does).
  int64_t effective_batch_size = 1;
  /// All micro-batches of a batch get the same number of sequences (pipelines).
  bool required_microbatches_of_same_size = false;
  /// The "random" order's seed: Python's random.Random(seed).shuffle, draw for draw.
  std::optional<int64_t> seed;
  bool verbose = false;
};

/// What batch_by_seqlens returns (DeepSpeed's three lists).
struct VariableBatches {
  /// (batch id, sample ids) per micro-batch, batch after batch, effective_batch_size per batch.
  std::vector<std::pair<int64_t, std::vector<int64_t>>> microbatch_ids;
  std::vector<int64_t> batch_sizes;        // sequences per batch (all its micro-batches)
  std::vector<int64_t> batch_max_seqlens;  // the longest sequence per batch
};

/// DeepSpeed's batch_by_seqlens: samples taken in the picking order (dataset order, a seeded
/// shuffle, or ascending (length, id)), those longer than max_tokens dropped with a warning,
/// then packed greedily: each step takes the longest run of samples whose micro-batches (the
/// run dealt round-robin over required_microbatches_of_same_size ? effective_batch_size : 1 of
/// them) are all valid. The micro-batches are trimmed to a multiple of effective_batch_size and
/// grouped into batches. Equal to DeepSpeed's output, including its last sample, which its
/// packing loop never takes. `sequence_ids`: only these samples (dataset_filter_ids).
/// Throws UsageError for a negative length, max_tokens < 1, an unknown picking order, or fewer
/// micro-batches than effective_batch_size.
VariableBatches batch_by_seqlens(const std::vector<int64_t>& seqlens,
                                 const BatchBySeqlensOptions& options,
                                 const std::vector<int64_t>* sequence_ids = nullptr);

/// DeepSpeed's scale_lr: base_lr x batch_size / base_batch_size ("linear"), x its square root
/// ("sqrt"), or base_lr ("none"). Throws UsageError for another method.
double scale_lr(int64_t base_batch_size, int64_t batch_size, double base_lr,
                const std::string& method);

/// One rank's share of one micro-step.
struct VariableMicroBatch {
  int64_t batch_id = 0;          // the optimizer step (within the epoch) it belongs to
  std::vector<int64_t> samples;  // the sample ids of its micro-batches, in order
  int64_t max_seqlen = 0;        // the batch's longest sequence: pad to it for equal shapes
};

/// DeepSpeed's dataloader_for_variable_batch_size: the micro-batches dealt over the
/// data-parallel ranks as a DistributedSampler without shuffling deals them (rank r takes
/// r, r + R, ...), train_micro_batch_size_per_gpu of them per micro-step. Each epoch yields
/// the same micro-batches in the same order.
class VariableBatchLoader {
 public:
  VariableBatchLoader(VariableBatches batches, int64_t micro_batch_size, int64_t dp_rank,
                      int64_t dp_size);

  /// The next micro-step of this epoch, or nullopt after its last; then reset() starts the
  /// next epoch.
  std::optional<VariableMicroBatch> next();
  void reset() { position_ = 0; }
  /// Micro-steps per epoch on this rank (gradient_accumulation_steps per optimizer step).
  int64_t size() const;
  /// Micro-steps taken this epoch; seek(k) resumes after k of them (e.g. from global_steps).
  int64_t position() const { return position_; }
  void seek(int64_t micro_steps);
  const VariableBatches& batches() const { return batches_; }

 private:
  VariableBatches batches_;
  int64_t micro_batch_size_;
  int64_t dp_rank_;
  int64_t dp_size_;
  int64_t position_ = 0;
};

/// DeepSpeed's get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed: the engine's
/// config section dynamic_batching (enabled) packs `seqlens` (one per sample; empty: read from
/// metrics_path's seqlen/seqlen_sample_to_metric, which DataAnalyzer writes for a metric named
/// "seqlen") into this rank's loader, with the engine's train_batch_size, micro-batch size and
/// data-parallel group, same-size micro-batches for a PipelineEngine, and data_efficiency.seed.
/// From then on the engine's learning rate at optimizer step n is its schedule's value for
/// step n (DeepSpeed's wrapper steps the schedule once at construction) scaled by batch
/// n's number of sequences against train_batch_size (lr_scaling_method), cycling through the
/// batches as DeepSpeed does; the current rate is rewritten at once, so a loader made after
/// load_checkpoint resumes the schedule where it was. Throws UsageError when dynamic batching
/// is disabled, when the engine's scheduler came from a factory (its schedule cannot be
/// rescaled; use the config's scheduler section), or when the lengths are missing or do not
/// match the metric file.
std::unique_ptr<VariableBatchLoader> make_variable_batch_loader(
    Engine& engine, std::vector<int64_t> seqlens = {},
    const std::vector<int64_t>* sequence_ids = nullptr);

}  // namespace deepspeed::data_sampling
