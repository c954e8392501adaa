// The memory figures of one --metrics_file line, shared by the examples so that train_gpt and
// finetune_llama write the same keys (docs/observability.md).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "deepspeed/config.h"
#include "deepspeed/engine.h"

namespace deepspeed::examples {

/// This rank's memory ledger as (metrics key, bytes) pairs, in the order of the file.
std::vector<std::pair<std::string, int64_t>> memory_figures(const MemoryStats& m);

/// Every rank's figures, one all-gather over the world (call it on every rank):
/// {"rss": [rank 0, rank 1, ...], "peak_rss": [...], "parameters": [...], ...}.
json gather_memory_figures(const MemoryStats& mine);

}  // namespace deepspeed::examples
