// PartitionedGradReducer implementation (see the header; the launch order is the Bucketer's).
#include "runtime/zero/partitioned_reducer.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "util/check.h"

namespace deepspeed::runtime {

PartitionedGradReducer::PartitionedGradReducer(std::vector<FlatGroup>* groups,
                                               std::vector<at::Tensor>* grad_partitions,
                                               PartitionedReducerOptions options)
    : groups_(groups), grad_partitions_(grad_partitions), options_(options),
      divisor_(options_.average_divisor > 0 ? options_.average_divisor : options_.group.size()) {
  DS_INTERNAL_ASSERT(options_.group.is_member(),
                     "PartitionedGradReducer needs this rank's data-parallel group");
  DS_CHECK(options_.bucket_numel > 0, ConfigError,
           "zero_optimization.reduce_bucket_size must be positive");
  std::vector<size_t> served = options_.flat_groups;
  if (served.empty()) {
    for (size_t g = 0; g < groups_->size(); ++g) served.push_back(g);
  }
  for (size_t g : served) {
    DS_INTERNAL_ASSERT(g < groups_->size(), "PartitionedGradReducer: no flat group ", g);
    for (size_t s = 0; s < (*groups_)[g].slots().size(); ++s) param_at_.emplace_back(g, s);
  }
  DS_INTERNAL_ASSERT(!param_at_.empty(), "PartitionedGradReducer: no parameters to reduce");
  BucketPlan plan = build_buckets();

  BucketerOptions bucketing;
  bucketing.buffers = options_.overlap_comm ? 2 : 1;
  // Without overlap_comm the reduction completes before backward goes on (DeepSpeed reduces on
  // the compute stream then).
  bucketing.complete_on_launch = !options_.overlap_comm;
  // contiguous_gradients: the bucket being filled takes the gradient now and param.grad is freed.
  bucketing.fill_on_ready = options_.contiguous_gradients;
  BucketOps ops;
  ops.fill = [this](size_t b, size_t slot, size_t buffer, bool) {
    fill(buckets_[b], slot, buffer);
  };
  ops.launch = [this](size_t b, size_t buffer) { return launch(buckets_[b], buffer); };
  ops.complete = [this](size_t b, size_t buffer) { complete(buckets_[b], buffer); };
  bucketer_ = std::make_unique<Bucketer>(std::move(plan), bucketing, std::move(ops));

  std::map<at::ScalarType, int64_t> largest;
  for (const auto& b : buckets_) largest[b.dtype] = std::max(largest[b.dtype], b.numel);
  const at::TensorOptions o = (*groups_)[param_at_.front().first].flat().options();
  for (const auto& [dtype, numel] : largest) {
    for (size_t i = 0; i < bucketer_->num_buffers(); ++i) {
      buffers_[dtype].push_back(at::empty({numel}, o.dtype(dtype)));
    }
  }

  std::vector<at::Tensor> params;
  for (const auto& [g, s] : param_at_) params.push_back((*groups_)[g].slots()[s].param);
  hooks_ = std::make_unique<GradReadyHooks>(params, [this](size_t i) { on_grad_ready(i); });
}

PartitionedGradReducer::~PartitionedGradReducer() = default;

BucketPlan PartitionedGradReducer::build_buckets() {
  // Matches DeepSpeed: a gradient that would overflow the bucket closes it first.
  std::vector<int64_t> sizes;
  std::vector<int> dtypes;  // each parameter's reduction dtype: buckets never mix them
  for (const auto& [g, s] : param_at_) {
    const FlatSlot& slot = (*groups_)[g].slots()[s];
    sizes.push_back(slot.numel);
    dtypes.push_back(static_cast<int>(
        comm_dtype_of(options_.comm_dtypes, slot.param, options_.bucket_dtype)));
  }
  BucketPlan plan = plan_buckets(sizes, options_.bucket_numel, dtypes);
  for (const auto& items : plan.items) {
    Bucket b;
    b.dtype = static_cast<at::ScalarType>(dtypes[items.front()]);
    for (size_t k : items) {
      b.entries.push_back(Entry{param_at_[k].first, param_at_[k].second, b.numel});
      b.numel += sizes[k];
    }
    b.params = items;
    buckets_.push_back(std::move(b));
  }

  // Owner ranges: a parameter spanning two partitions is split; adjacent ranges of one owner
  // (in bucket order) merge, so a bucket costs at most one reduce per owner boundary.
  for (auto& b : buckets_) {
    for (const auto& e : b.entries) {
      const FlatGroup& fg = (*groups_)[e.group];
      const FlatSlot& slot = fg.slots()[e.slot];
      int64_t done = 0;
      while (done < slot.numel) {
        const int64_t flat_index = slot.offset + done;
        const int owner = fg.owner_of(flat_index);
        const int64_t part_end = static_cast<int64_t>(owner + 1) * fg.partition_numel();
        const int64_t len = std::min(slot.numel - done, part_end - flat_index);
        const int64_t at = e.bucket_offset + done;
        if (!b.runs.empty() && b.runs.back().owner == owner &&
            b.runs.back().bucket_offset + b.runs.back().numel == at) {
          b.runs.back().numel += len;
        } else {
          b.runs.push_back(Run{owner, at, len});
        }
        if (owner == fg.rank()) {
          b.copies.push_back(Copy{e.group, at,
                                  flat_index - static_cast<int64_t>(owner) * fg.partition_numel(),
                                  len});
        }
        done += len;
      }
    }
  }
  return plan;
}

void PartitionedGradReducer::prepare() { bucketer_->prepare(); }

ReductionStats PartitionedGradReducer::stats() const {
  ReductionStats stats;
  stats.buckets_launched = bucketer_->buckets_launched();
  stats.buckets_launched_from_hooks = bucketer_->buckets_launched_from_hooks();
  stats.reductions_issued = bucketer_->collectives_issued();
  return stats;
}

at::Tensor PartitionedGradReducer::bucket_view(const Bucket& b, size_t buffer) const {
  return buffers_.at(b.dtype)[buffer].narrow(0, 0, b.numel);
}

void PartitionedGradReducer::on_grad_ready(size_t i) {
  if (!bucketer_->armed()) return;
  const auto [g, s] = param_at_[i];
  DS_CHECK(!bucketer_->ready(i), UsageError, "the gradient of '", (*groups_)[g].slots()[s].name,
           "' was computed twice in one backward; call engine.backward() once per micro-batch");
  DS_CHECK(!bucketer_->launched(bucketer_->plan().bucket_of[i]), UsageError, "the gradient of '",
           (*groups_)[g].slots()[s].name, "' arrived after its bucket was reduced");
  bucketer_->on_ready(i);
}

void PartitionedGradReducer::fill(const Bucket& b, size_t k, size_t buffer) {
  const Entry& e = b.entries[k];
  at::Tensor p = (*groups_)[e.group].slots()[e.slot].param;
  at::Tensor dst = bucket_view(b, buffer).narrow(0, e.bucket_offset, p.numel());
  const at::Tensor& grad = p.grad();
  if (grad.defined()) {
    dst.copy_(grad.reshape({-1}));
  } else {
    // No gradient this backward (unused, or its bucket was flushed by finish()): zeros.
    dst.zero_();
  }
  p.mutable_grad() = at::Tensor();  // this rank keeps only its owned range, in the partition
}

std::vector<comm::Handle> PartitionedGradReducer::launch(const Bucket& b, size_t buffer) {
  at::Tensor flat = bucket_view(b, buffer);
  const double w = static_cast<double>(divisor_);
  if (options_.average) {
    if (options_.reduce_scatter || options_.prescale) {
      flat.mul_(1.0 / w);
    } else if (options_.predivide_factor != 1.0) {
      flat.mul_(1.0 / options_.predivide_factor);
    }
  }
  std::vector<comm::Handle> handles;
  if (!options_.reduce_scatter || options_.multi_rank_bucket_allreduce) {
    handles.push_back(
        comm::all_reduce(flat, comm::ReduceOp::kSum, /*async_op=*/true, options_.group));
  } else {
    for (const Run& r : b.runs) {
      at::Tensor range = flat.narrow(0, r.bucket_offset, r.numel);
      // r.owner is a data-parallel rank; reduce's dst is a global rank.
      handles.push_back(comm::reduce(range, options_.group.global_rank(r.owner),
                                     comm::ReduceOp::kSum, /*async_op=*/true, options_.group));
    }
  }
  return handles;
}

void PartitionedGradReducer::complete(const Bucket& b, size_t buffer) {
  at::Tensor flat = bucket_view(b, buffer);
  const double w = static_cast<double>(divisor_);
  if (options_.average && !options_.reduce_scatter && !options_.prescale &&
      options_.predivide_factor != w) {
    flat.mul_(options_.predivide_factor / w);
  }
  // Accumulates across micro-steps (stage 2); stage 1 reduces once into a zeroed partition.
  for (const Copy& c : b.copies) {
    (*grad_partitions_)[c.group]
        .narrow(0, c.partition_offset, c.numel)
        .add_(flat.narrow(0, c.bucket_offset, c.numel));
    if (options_.on_reduced) options_.on_reduced(c.group, c.partition_offset, c.numel);
  }
}

void PartitionedGradReducer::finish() {
  if (!bucketer_->armed()) return;
  if (!options_.ignore_unused_parameters) {
    for (size_t i = 0; i < param_at_.size(); ++i) {
      const auto [g, s] = param_at_[i];
      const FlatSlot& slot = (*groups_)[g].slots()[s];
      DS_CHECK(bucketer_->ready(i) || slot.param.grad().defined(), UsageError, "parameter '",
               slot.name, "' got no gradient in this backward (it is unused by the forward pass) while "
               "zero_optimization.ignore_unused_parameters is false");
    }
  }
  bucketer_->flush();  // what is left launches now, in order
}

int64_t PartitionedGradReducer::buffer_bytes() const {
  int64_t total = 0;
  for (const auto& [dtype, pool] : buffers_) {
    for (const auto& b : pool) total += b.numel() * static_cast<int64_t>(b.element_size());
  }
  return total;
}

}  // namespace deepspeed::runtime
