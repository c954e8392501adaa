// batch_by_seqlens, scale_lr and the loader of variable_batch.h. DeepSpeed's packing tries every
// run length up to the end of the dataset for each micro-batch (quadratic in the dataset); the
// valid run lengths form one interval (with non-negative lengths each constraint only ever
// turns true or only ever turns false as the run grows), so this one stops at the first run
// past it and takes the same last valid run in linear time.
#include "deepspeed/variable_batch.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "deepspeed/errors.h"
#include "util/python_random.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::data_sampling {
namespace {

using Metric = std::pair<int64_t, int64_t>;  // (length, sample id), as DeepSpeed's tuples

std::vector<Metric> picked_in_order(const std::vector<int64_t>& seqlens,
                                    const BatchBySeqlensOptions& options,
                                    const std::vector<int64_t>* sequence_ids) {
  std::vector<Metric> metrics;
  auto add = [&](int64_t id) {
    DS_CHECK(id >= 0 && id < static_cast<int64_t>(seqlens.size()), UsageError,
             "batch_by_seqlens: sequence id ", id, " is outside the ", seqlens.size(),
             " samples");
    DS_CHECK(seqlens[static_cast<size_t>(id)] >= 0, UsageError, "batch_by_seqlens: sample ",
             id, " has a negative length ", seqlens[static_cast<size_t>(id)]);
    metrics.emplace_back(seqlens[static_cast<size_t>(id)], id);
  };
  if (sequence_ids != nullptr) {
    for (int64_t id : *sequence_ids) add(id);
  } else {
    for (int64_t id = 0; id < static_cast<int64_t>(seqlens.size()); ++id) add(id);
  }
  const std::string& order = options.sequence_picking_order;
  if (order == "random") {
    std::mt19937 gen = options.seed ? util::python_random(*options.seed)
                                    : std::mt19937(std::random_device{}());
    util::python_shuffle(metrics, gen);
  } else if (order == "seqlen") {
    std::sort(metrics.begin(), metrics.end());
  } else {
    DS_CHECK(order == "dataloader", UsageError, "batch_by_seqlens: sequence_picking_order is \"",
             order, "\"; expected \"dataloader\", \"random\" or \"seqlen\"");
  }
  return metrics;
}

void drop_too_long(std::vector<Metric>& metrics, int64_t max_tokens) {
  std::vector<int64_t> dropped;
  std::vector<Metric> kept;
  for (const auto& m : metrics) {
    if (m.first > max_tokens) {
      dropped.push_back(m.second);
    } else {
      kept.push_back(m);
    }
  }
  if (dropped.empty()) return;
  std::ostringstream ids;
  for (size_t i = 0; i < dropped.size() && i < 20; ++i) ids << (i ? ", " : "") << dropped[i];
  if (dropped.size() > 20) ids << ", ... (" << dropped.size() << " in all)";
  log::warn_rank0("dynamic batching: samples " + ids.str() + " are left out: each alone is " +
                  "longer than max_tokens " + std::to_string(max_tokens));
  metrics = std::move(kept);
}

// The micro-batches of the packing: runs of `metrics` dealt round-robin over `m` micro-batches.
std::vector<std::vector<Metric>> pack(const std::vector<Metric>& metrics,
                                      const BatchBySeqlensOptions& options, size_t m) {
  const size_t n = metrics.size();
  std::vector<std::vector<Metric>> microbatches;
  size_t init = 0;
  while (init < n) {
    std::vector<int64_t> sums(m, 0);
    size_t valid_end = init;
    // DeepSpeed's range(init + m, n, m): a run never reaches the last sample.
    for (size_t end = init + m; end < n; end += m) {
      for (size_t at = end - m; at < end; ++at) sums[(at - init) % m] += metrics[at].first;
      const auto count = static_cast<int64_t>((end - init) / m);
      const bool too_big =
          (options.max_batch_size && *options.max_batch_size > 0 &&
           count > *options.max_batch_size) ||
          std::any_of(sums.begin(), sums.end(), [&](int64_t s) { return s > options.max_tokens; });
      if (too_big) break;  // so is every longer run
      if (options.min_batch_size <= 0 || count >= options.min_batch_size) valid_end = end;
    }
    if (valid_end == init) break;  // no valid run: DeepSpeed stops here too
    for (size_t b = 0; b < m; ++b) {
      std::vector<Metric> mb;
      for (size_t at = init + b; at < valid_end; at += m) mb.push_back(metrics[at]);
      microbatches.push_back(std::move(mb));
    }
    init = valid_end;
  }
  return microbatches;
}

}  // namespace

VariableBatches batch_by_seqlens(const std::vector<int64_t>& seqlens,
                                 const BatchBySeqlensOptions& options,
                                 const std::vector<int64_t>* sequence_ids) {
  DS_CHECK(options.max_tokens >= 1, UsageError, "batch_by_seqlens: max_tokens is ",
           options.max_tokens, "; it must be positive");
  DS_CHECK(options.effective_batch_size >= 1, UsageError,
           "batch_by_seqlens: effective_batch_size is ", options.effective_batch_size);
  std::vector<Metric> metrics = picked_in_order(seqlens, options, sequence_ids);
  drop_too_long(metrics, options.max_tokens);
  const auto per_batch = static_cast<size_t>(options.effective_batch_size);
  auto microbatches =
      pack(metrics, options, options.required_microbatches_of_same_size ? per_batch : 1);
  DS_CHECK(microbatches.size() >= per_batch, UsageError, "dynamic batching: ",
           microbatches.size(), " micro-batches fit in max_tokens ", options.max_tokens,
           ", fewer than one batch of ", per_batch,
           " (train_batch_size): not enough data for every rank");
  microbatches.resize(microbatches.size() - microbatches.size() % per_batch);

  VariableBatches out;
  for (size_t first = 0; first < microbatches.size(); first += per_batch) {
    const auto batch_id = static_cast<int64_t>(first / per_batch);
    int64_t sequences = 0;
    int64_t longest = 0;
    for (size_t k = first; k < first + per_batch; ++k) {
      std::vector<int64_t> ids;
      for (const auto& [length, id] : microbatches[k]) {
        ids.push_back(id);
        longest = std::max(longest, length);
      }
      sequences += static_cast<int64_t>(ids.size());
      out.microbatch_ids.emplace_back(batch_id, std::move(ids));
    }
    out.batch_sizes.push_back(sequences);
    out.batch_max_seqlens.push_back(longest);
    if (options.verbose) {
      log::info_rank0("dynamic batching: batch " + std::to_string(batch_id) + " holds " +
                      std::to_string(sequences) + " sequences in " + std::to_string(per_batch) +
                      " micro-batches, the longest " + std::to_string(longest) + " tokens");
    }
  }
  return out;
}

double scale_lr(int64_t base_batch_size, int64_t batch_size, double base_lr,
                const std::string& method) {
  const double ratio = static_cast<double>(batch_size) / static_cast<double>(base_batch_size);
  if (method == "linear") return base_lr * ratio;
  if (method == "sqrt") return base_lr * std::sqrt(ratio);
  DS_CHECK(method == "none", UsageError, "scale_lr: unknown scaling method \"", method,
           "\"; expected \"linear\", \"sqrt\" or \"none\"");
  return base_lr;
}

VariableBatchLoader::VariableBatchLoader(VariableBatches batches, int64_t micro_batch_size,
                                         int64_t dp_rank, int64_t dp_size)
    : batches_(std::move(batches)),
      micro_batch_size_(micro_batch_size),
      dp_rank_(dp_rank),
      dp_size_(dp_size) {
  DS_CHECK(micro_batch_size >= 1 && dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size,
           UsageError, "VariableBatchLoader: micro-batch size ", micro_batch_size, ", rank ",
           dp_rank, " of ", dp_size);
}

int64_t VariableBatchLoader::size() const {
  // DistributedSampler pads the list to a multiple of the ranks; DataLoader keeps a last
  // partial group (drop_last false).
  const auto total = static_cast<int64_t>(batches_.microbatch_ids.size());
  const int64_t per_rank = (total + dp_size_ - 1) / dp_size_;
  return (per_rank + micro_batch_size_ - 1) / micro_batch_size_;
}

void VariableBatchLoader::seek(int64_t micro_steps) {
  DS_CHECK(micro_steps >= 0 && micro_steps <= size(), UsageError, "VariableBatchLoader::seek(",
           micro_steps, "): an epoch has ", size(), " micro-steps");
  position_ = micro_steps;
}

std::optional<VariableMicroBatch> VariableBatchLoader::next() {
  if (position_ >= size()) return std::nullopt;
  const auto total = static_cast<int64_t>(batches_.microbatch_ids.size());
  const int64_t per_rank = (total + dp_size_ - 1) / dp_size_;
  VariableMicroBatch out;
  bool first = true;
  for (int64_t p = position_ * micro_batch_size_;
       p < std::min(per_rank, (position_ + 1) * micro_batch_size_); ++p) {
    const int64_t index = (dp_rank_ + p * dp_size_) % total;  // the sampler's padding wraps
    const auto& [batch_id, ids] = batches_.microbatch_ids[static_cast<size_t>(index)];
    if (first) out.batch_id = batch_id;
    first = false;
    out.samples.insert(out.samples.end(), ids.begin(), ids.end());
  }
  out.max_seqlen = batches_.batch_max_seqlens[static_cast<size_t>(out.batch_id)];
  ++position_;
  return out;
}

}  // namespace deepspeed::data_sampling
