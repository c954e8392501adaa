// NvmeShardStore: parameter indices onto swap::ShardSwapper ids (see stage3_nvme_shards.h).
#include "runtime/zero/stage3_nvme_shards.h"

#include "util/check.h"

namespace deepspeed::runtime {

NvmeShardStore::NvmeShardStore(std::vector<PartitionedParam>* params,
                               swap::ShardSwapperOptions options)
    : params_(params),
      swapper_(std::make_unique<swap::ShardSwapper>(std::move(options))),
      id_of_(params->size(), -1) {}

void NvmeShardStore::add(size_t param) {
  DS_INTERNAL_ASSERT(id_of_.at(param) < 0, "a parameter's shard is registered once");
  id_of_[param] = swapper_->add((*params_)[param].shard);
}

bool NvmeShardStore::registered(size_t param) const { return id_of_.at(param) >= 0; }

bool NvmeShardStore::swapped(size_t param) const {
  const int id = id_of_.at(param);
  return id >= 0 && swapper_->swapped(id);
}

std::vector<int> NvmeShardStore::ids(const std::vector<size_t>& params) const {
  std::vector<int> out;
  out.reserve(params.size());
  for (size_t p : params) {
    if (swapped(p)) out.push_back(id_of_[p]);
  }
  return out;
}

void NvmeShardStore::prefetch(const std::vector<size_t>& params) {
  auto wanted = ids(params);
  if (!wanted.empty()) swapper_->prefetch(wanted);
}

void NvmeShardStore::swap_in(const std::vector<size_t>& params) {
  auto wanted = ids(params);
  if (!wanted.empty()) swapper_->swap_in(wanted);
}

void NvmeShardStore::release(const std::vector<size_t>& params) {
  auto wanted = ids(params);
  if (!wanted.empty()) swapper_->release(wanted);
}

void NvmeShardStore::write(size_t param, const at::Tensor& values) {
  const int id = id_of_.at(param);
  DS_INTERNAL_ASSERT(id >= 0, "write of a shard the store does not hold");
  swapper_->write(id, values);
}

int64_t NvmeShardStore::swapped_bytes() const { return swapper_->swapped_bytes(); }
int64_t NvmeShardStore::buffer_bytes() const { return swapper_->buffer_bytes(); }

}  // namespace deepspeed::runtime
