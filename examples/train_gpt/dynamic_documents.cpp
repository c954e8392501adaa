#include "dynamic_documents.h"

#include <algorithm>

#include "deepspeed/dynamic_batching_config.h"
#include "deepspeed/errors.h"

namespace deepspeed::examples {

Documents line_documents(const std::vector<bool>& ends_line, int64_t min_len, int64_t max_len) {
  Documents out;
  const auto n = static_cast<int64_t>(ends_line.size()) - 1;  // the last token only as a target
  int64_t start = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t length = t + 1 - start;
    if (length == max_len || (ends_line[static_cast<size_t>(t)] && length >= min_len)) {
      out.starts.push_back(start);
      out.lengths.push_back(length);
      start = t + 1;
    }
  }
  if (start < n) {
    out.starts.push_back(start);
    out.lengths.push_back(n - start);
  }
  return out;
}

DynamicDocuments::DynamicDocuments(const std::vector<uint16_t>& train, Documents docs,
                                   std::unique_ptr<data_sampling::VariableBatchLoader> loader)
    : train_(train), docs_(std::move(docs)), loader_(std::move(loader)) {
  // Once here rather than per step: a step's tokens are its batch's documents' lengths.
  batch_tokens_.assign(batches().batch_sizes.size(), 0);
  for (const auto& [id, samples] : batches().microbatch_ids) {
    for (int64_t d : samples) {
      batch_tokens_[static_cast<size_t>(id)] += docs_.lengths[static_cast<size_t>(d)];
    }
  }
}

std::unique_ptr<DynamicDocuments> DynamicDocuments::create(Engine& engine,
                                                           const std::vector<uint16_t>& train,
                                                           const std::vector<bool>& ends_line,
                                                           int64_t seq_len) {
  if (!data_sampling::dynamic_batching_config(engine.config()).enabled) return nullptr;
  if (ends_line.size() != train.size()) {
    throw UsageError("train_gpt: one line-end flag per training token is needed");
  }
  Documents docs = line_documents(ends_line, std::min<int64_t>(8, seq_len), seq_len);
  auto loader = data_sampling::make_variable_batch_loader(engine, docs.lengths);
  return std::unique_ptr<DynamicDocuments>(
      new DynamicDocuments(train, std::move(docs), std::move(loader)));
}

DynamicDocuments::MicroBatch DynamicDocuments::next_micro_batch() {
  auto mb = loader_->next();
  if (!mb) {
    loader_->reset();  // the next epoch: DeepSpeed's loader yields the same batches again
    mb = loader_->next();
  }
  const auto rows = static_cast<int64_t>(mb->samples.size());
  MicroBatch out{torch::zeros({rows, mb->max_seqlen}, torch::kLong),
                 torch::full({rows, mb->max_seqlen}, -100, torch::kLong)};
  auto* inputs = out.inputs.data_ptr<int64_t>();
  auto* targets = out.targets.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const auto d = static_cast<size_t>(mb->samples[static_cast<size_t>(r)]);
    const int64_t start = docs_.starts[d];
    for (int64_t t = 0; t < docs_.lengths[d]; ++t) {
      inputs[r * mb->max_seqlen + t] = train_[static_cast<size_t>(start + t)];
      targets[r * mb->max_seqlen + t] = train_[static_cast<size_t>(start + t + 1)];
    }
  }
  return out;
}

void DynamicDocuments::skip(int64_t micro_steps) { loader_->seek(micro_steps % loader_->size()); }

int64_t DynamicDocuments::sequences_of_step(int64_t step) const {
  const auto& sizes = batches().batch_sizes;
  return sizes[static_cast<size_t>((step - 1) % static_cast<int64_t>(sizes.size()))];
}

int64_t DynamicDocuments::tokens_of_step(int64_t step) const {
  const auto n = static_cast<int64_t>(batch_tokens_.size());
  return batch_tokens_[static_cast<size_t>((step - 1) % n)];
}

}  // namespace deepspeed::examples
