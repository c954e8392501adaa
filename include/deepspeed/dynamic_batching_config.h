// data_efficiency.data_sampling.dynamic_batching as read from ds_config.json (torch-free: the
// launcher's config reader compiles it too). What uses it: variable_batch.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "deepspeed/config.h"

namespace deepspeed::data_sampling {

/// DeepSpeed's dynamic batching: micro-batches packed up to max_tokens of sequence length, and
/// the learning rate scaled by each batch's number of sequences. DeepSpeed's defaults.
struct DynamicBatchingConfig {
  bool enabled = false;
  /// DataAnalyzer output holding a "seqlen" metric (seqlen/seqlen_sample_to_metric), read when
  /// the caller gives no sequence lengths. Empty: none configured.
  std::string metrics_path;
  std::string lr_scaling_method = "linear";  // "linear" | "sqrt" | "none"
  int64_t min_batch_size = 1;                 // sequences per micro-batch
  std::optional<int64_t> max_batch_size;
  std::string sequence_picking_order = "dataloader";  // "dataloader" | "random" | "seqlen"
  int64_t max_tokens = 0;  // the cap on a micro-batch's summed lengths; required when enabled
  bool verbose = false;
  int64_t seed = 1234;  // data_efficiency.seed: the "random" order's shuffle
};

/// The section as DeepSpeedConfig validated it at load (read again from its raw JSON).
DynamicBatchingConfig dynamic_batching_config(const DeepSpeedConfig& config);

}  // namespace deepspeed::data_sampling
