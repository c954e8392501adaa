// Our side of bench/dynamic_batching: batch_by_seqlens over N samples of lengths 1..59 (the
// same formula as DeepSpeed's side), max_tokens T, effective batch size 8, picking order O
// (seed 1 for "random"). Prints `pack_s=.. batches=.. checksum=..` for run.sh: the checksum
// (over every micro-batch's batch id and sample ids) lets run.sh check both packed alike.
// Usage: dynamic_batching_bench N T O
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "deepspeed/variable_batch.h"

namespace ds = deepspeed::data_sampling;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s N MAX_TOKENS ORDER\n", argv[0]);
    return 2;
  }
  const int64_t n = std::atoll(argv[1]);
  std::vector<int64_t> seqlens;
  for (int64_t i = 0; i < n; ++i) seqlens.push_back((i * 7919) % 59 + 1);
  ds::BatchBySeqlensOptions options;
  options.max_tokens = std::atoll(argv[2]);
  options.sequence_picking_order = argv[3];
  options.effective_batch_size = 8;
  options.seed = 1;
  const auto t0 = std::chrono::steady_clock::now();
  const ds::VariableBatches batches = ds::batch_by_seqlens(seqlens, options);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t checksum = 0;
  for (const auto& [batch, ids] : batches.microbatch_ids) {
    checksum = checksum * 1000003 + static_cast<uint64_t>(batch);
    for (int64_t id : ids) checksum = checksum * 1000003 + static_cast<uint64_t>(id);
  }
  std::printf("pack_s=%.6f batches=%zu checksum=%llu\n", s, batches.batch_sizes.size(),
              static_cast<unsigned long long>(checksum));
  return 0;
}
