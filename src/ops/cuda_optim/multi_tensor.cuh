// Multi-tensor apply for the fused optimizers: how a list of tensors becomes kernel launches.
//
// Note [Chunks and batches]
// Every tensor is cut into chunks of kChunkNumel elements (the last one shorter); a chunk is the
// unit of work of one thread block. Up to kMaxTensorsPerLaunch tensors go into one launch: their
// pointers and sizes travel in the kernel's arguments (a TensorBatch, by value, so no host-to-
// device copy precedes the launch), with the index of each tensor's first chunk. A block finds
// the tensor of its chunk by binary search over those indices, and the blocks stride over the
// chunks (grid-stride), so a launch of any size uses at most kMaxGridBlocks blocks. Chunks start
// at multiples of kChunkNumel, so a chunk of a 16-byte aligned buffer is 16-byte aligned too and
// the vectorized loop needs one check per tensor, made on the host.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

namespace deepspeed::ops::cuda_detail {

// 16 Ki elements (64 KiB per fp32 buffer): a 3M-element tensor is 184 chunks, enough blocks for
// an H100's 132 SMs; 64 Ki-element chunks would leave most SMs idle below ~9M elements.
inline constexpr int64_t kChunkNumel = int64_t{1} << 14;
inline constexpr int kBlockThreads = 256;
// A few waves of blocks on an H100 (132 SMs, 8 blocks of 256 threads each at full occupancy).
inline constexpr int kMaxGridBlocks = 2048;
// CUDA guarantees 4 KiB of kernel arguments on every toolkit and GPU; 48 tensors of the largest
// per-tensor record (56 bytes) plus the chunk table fit with room for the step's scalars.
inline constexpr int kMaxTensorsPerLaunch = 48;
inline constexpr size_t kMaxKernelArgBytes = 4096;

__host__ __device__ inline int64_t chunks_of(int64_t n) { return (n + kChunkNumel - 1) / kChunkNumel; }
/// The largest tensor a launch can hold (its chunks are counted in int32): 2^45 elements.
inline constexpr int64_t kMaxTensorNumel = int64_t{std::numeric_limits<int32_t>::max()} * kChunkNumel;

/// Whether `p` may be read and written as float4 / uint2 (vectorized loops).
inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

/// One launch's tensors: what the kernel gets by value. `Tensor` is the kernel's per-tensor
/// record and has an int64_t `n`.
template <class Tensor>
struct TensorBatch {
  Tensor tensors[kMaxTensorsPerLaunch];
  int32_t chunk_begin[kMaxTensorsPerLaunch];  // first chunk of tensors[i] in this launch
  int32_t index[kMaxTensorsPerLaunch];        // position of tensors[i] in the caller's list
  int32_t count;                              // tensors in this launch (empty ones included)
  int32_t total_chunks;                       // chunks of this launch
  int64_t chunk_base;                         // chunks of the caller's tensors before this launch
};

/// Which tensor of `batch` owns `chunk`: the last i with chunk_begin[i] <= chunk. An empty
/// tensor owns no chunk, and the last such i is never one (any later tensor begins after it).
template <class Tensor>
__host__ __device__ inline int owner_of(const TensorBatch<Tensor>& batch, int64_t chunk) {
  int lo = 0;
  int hi = batch.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (batch.chunk_begin[mid] <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

/// Elements [begin, begin + len) of tensor `owner` form `chunk`.
struct ChunkRange {
  int64_t begin;
  int64_t len;
};
template <class Tensor>
__host__ __device__ inline ChunkRange chunk_range(const TensorBatch<Tensor>& batch, int owner,
                                                  int64_t chunk) {
  const int64_t begin = (chunk - batch.chunk_begin[owner]) * kChunkNumel;
  const int64_t rest = batch.tensors[owner].n - begin;
  return {begin, rest < kChunkNumel ? rest : kChunkNumel};
}

/// Grid of a launch over `total_chunks` chunks (grid-stride beyond kMaxGridBlocks).
inline unsigned grid_blocks(int64_t total_chunks) {
  return static_cast<unsigned>(std::min<int64_t>(total_chunks, kMaxGridBlocks));
}

/// Packs tensors 0..count-1 (record(i) gives the kernel's record of tensor i) into batches, in
/// order, and calls launch(batch) for each; every tensor, empty or not, lands in one batch.
template <class Tensor, class Record, class Launch>
void for_each_batch(int count, Record&& record, Launch&& launch) {
  static_assert(sizeof(TensorBatch<Tensor>) + 128 <= kMaxKernelArgBytes,
                "a launch's tensors must fit the kernel arguments with the step's scalars");
  TensorBatch<Tensor> batch{};
  auto flush = [&] {
    if (batch.count == 0) return;
    launch(static_cast<const TensorBatch<Tensor>&>(batch));
    batch.chunk_base += batch.total_chunks;
    batch.count = 0;
    batch.total_chunks = 0;
  };
  for (int i = 0; i < count; ++i) {
    const Tensor t = record(i);
    const int64_t chunks = chunks_of(t.n);
    if (batch.count == kMaxTensorsPerLaunch ||
        batch.total_chunks + chunks > std::numeric_limits<int32_t>::max()) {
      flush();
    }
    batch.tensors[batch.count] = t;
    batch.chunk_begin[batch.count] = batch.total_chunks;
    batch.index[batch.count] = i;
    batch.total_chunks += static_cast<int32_t>(chunks);
    ++batch.count;
  }
  flush();
}

}  // namespace deepspeed::ops::cuda_detail
