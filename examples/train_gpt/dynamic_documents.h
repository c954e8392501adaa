// train_gpt's samples under DeepSpeed's dynamic batching (data_efficiency.data_sampling.
// dynamic_batching): instead of windows of --seq_len tokens, the training split cut at line
// ends into documents of 8 to --seq_len tokens (a longer line goes on in the next document), so
// that they differ in length as real documents do. The engine's VariableBatchLoader packs them
// into micro-batches of at most max_tokens tokens and scales the learning rate per batch; each
// micro-batch is padded to its batch's longest document, the padding's targets ignored (-100,
// cross_entropy's ignore_index; attention is causal, so padding at the end changes nothing
// before it).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "deepspeed/engine.h"
#include "deepspeed/variable_batch.h"

namespace deepspeed::examples {

/// Documents of a token stream: each ends after a token that ends a line (`ends_line[t]` for
/// the stream's token t) or at max_len tokens, and is at least min_len long except where the
/// stream ends. One more token follows every document (its last target), so the stream's last
/// token starts none.
struct Documents {
  std::vector<int64_t> starts;
  std::vector<int64_t> lengths;
};
Documents line_documents(const std::vector<bool>& ends_line, int64_t min_len, int64_t max_len);

class DynamicDocuments {
 public:
  /// null when the engine's config does not enable dynamic batching. `ends_line[t]`: whether
  /// train's token t holds a line break.
  static std::unique_ptr<DynamicDocuments> create(Engine& engine,
                                                  const std::vector<uint16_t>& train,
                                                  const std::vector<bool>& ends_line,
                                                  int64_t seq_len);

  struct MicroBatch {
    torch::Tensor inputs, targets;  // [documents, longest of the batch]
  };
  /// This rank's next micro-batch; after the last of an epoch the next epoch starts.
  MicroBatch next_micro_batch();
  /// Goes on after `micro_steps` micro-steps from the start (a resumed run's).
  void skip(int64_t micro_steps);
  /// Documents and tokens (their lengths) of optimizer step `step` (1-based), all ranks.
  int64_t sequences_of_step(int64_t step) const;
  int64_t tokens_of_step(int64_t step) const;
  int64_t num_documents() const { return static_cast<int64_t>(docs_.lengths.size()); }

 private:
  DynamicDocuments(const std::vector<uint16_t>& train, Documents docs,
                   std::unique_ptr<data_sampling::VariableBatchLoader> loader);
  const data_sampling::VariableBatches& batches() const { return loader_->batches(); }

  const std::vector<uint16_t>& train_;
  Documents docs_;
  std::unique_ptr<data_sampling::VariableBatchLoader> loader_;
  std::vector<int64_t> batch_tokens_;  // per batch, its documents' lengths summed
};

}  // namespace deepspeed::examples
