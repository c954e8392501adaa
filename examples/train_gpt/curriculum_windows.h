// train_gpt's windows under DeepSpeed's data_sampling curriculum (data_efficiency.data_sampling.
// curriculum_learning): easy windows first, by the metric vocab_rarity, the only one train_gpt
// computes. A window's vocab_rarity is round(100 * mean over its input tokens of -ln p(token)),
// p the token's frequency in the training split: windows of common words are "easy" (Li et al.,
// "DeepSpeed Data Efficiency", use the same measure for GPT pre-training).
//
// When the index files the config names do not exist yet, every rank analyzes its share of the
// windows and rank 0 writes them there (DataAnalyzer; the folder two levels above
// index_to_sample_path, DeepSpeed's layout SAVE_PATH/vocab_rarity/vocab_rarity_*). The engine's
// DataSampler then draws the windows and its checkpoints keep the sampler's state.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deepspeed/data_sampling.h"
#include "deepspeed/engine.h"

namespace deepspeed::examples {

/// The vocab_rarity of each window of seq_len inputs in `train` (num_windows of them).
std::vector<int64_t> vocab_rarity(const std::vector<uint16_t>& train, int64_t seq_len);

class CurriculumWindows {
 public:
  /// null when the engine's config has no data_sampling curriculum. Collective over the world
  /// (the analysis, when it runs).
  static std::unique_ptr<CurriculumWindows> create(Engine& engine,
                                                   const std::vector<uint16_t>& train,
                                                   int64_t seq_len);

  /// This rank's next micro-batch of window indices.
  std::vector<int64_t> next_micro_batch();
  const std::map<std::string, int64_t>& difficulties() const {
    return sampler_->current_difficulties();
  }

 private:
  explicit CurriculumWindows(std::shared_ptr<data_sampling::DataSampler> sampler)
      : sampler_(std::move(sampler)) {}
  std::shared_ptr<data_sampling::DataSampler> sampler_;
};

}  // namespace deepspeed::examples
