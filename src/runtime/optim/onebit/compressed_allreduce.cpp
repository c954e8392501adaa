// DeepSpeed's compressed all-reduce (the worker/server scheme of its nccl/compressed backends):
// each rank is the server of one chunk; workers send it 1-bit chunks, it averages and
// re-compresses, and everyone gathers the servers' 1-bit chunks.
#include <atomic>

#include <ATen/ATen.h>

#include "comm/comms_logger.h"
#include "deepspeed/onebit.h"
#include "util/check.h"

namespace deepspeed::onebit {
namespace {

// The comms logger keys records by sequence number; the compressed all-reduce, which is made
// of four numbered collectives, gets its own record under negative numbers that never collide.
int64_t next_log_seq() {
  static std::atomic<int64_t> seq{0};
  return -(++seq);
}

}  // namespace

void compressed_allreduce(at::Tensor& buffer, at::Tensor& worker_error, at::Tensor& server_error,
                          const comm::Group& group) {
  const int world = group.size();
  if (world == 1) return;
  DS_CHECK(buffer.scalar_type() == at::kFloat && worker_error.scalar_type() == at::kFloat &&
               server_error.scalar_type() == at::kFloat,
           UsageError, "compressed_allreduce: expected float32 buffer and error buffers");
  const CompressionLayout l = compression_layout(buffer.numel(), world);
  DS_CHECK(worker_error.numel() == l.padded_numel && server_error.numel() == l.chunk_numel,
           UsageError, "compressed_allreduce on ", group.describe(), ": a tensor of ",
           buffer.numel(), " elements needs a worker error of ", l.padded_numel,
           " and a server error of ", l.chunk_numel, " elements; got ", worker_error.numel(),
           " and ", server_error.numel());
  const int me = group.rank();
  const int64_t chunk_bytes = l.chunk_numel / 8;
  const int64_t log_seq = next_log_seq();
  comm::detail::comms_log_issue(log_seq, "compressed_allreduce", buffer, world,
                                group.name() == "world" ? std::string() : group.name());

  // Worker side: compress the whole (padded) tensor; chunk r of the signs goes to server r.
  at::Tensor padded = at::zeros({l.padded_numel}, buffer.options());
  padded.narrow(0, 0, l.numel).copy_(buffer.reshape({-1}));
  Compressed worker = compress_with_error(padded, worker_error, l.numel);
  at::Tensor received_bits = at::empty_like(worker.bits);
  comm::all_to_all_single(received_bits, worker.bits, false, group);
  at::Tensor worker_scales = at::empty({world}, worker.scale.options());
  comm::all_gather(worker_scales, worker.scale, false, group);

  // Server side: average the workers' 1-bit versions of this rank's chunk, then compress that.
  at::Tensor signs = unpack_signs(received_bits).view({world, l.chunk_numel});
  at::Tensor chunk = signs.mul_(worker_scales.div(world).view({world, 1})).sum(0);
  Compressed server = compress_with_error(chunk, server_error, l.valid_in_chunk(me));

  at::Tensor all_bits = at::empty({world * chunk_bytes}, server.bits.options());
  comm::all_gather(all_bits, server.bits, false, group);
  at::Tensor server_scales = at::empty({world}, server.scale.options());
  comm::all_gather(server_scales, server.scale, false, group);

  at::Tensor result = unpack_signs(all_bits).view({world, l.chunk_numel});
  result.mul_(server_scales.view({world, 1}));
  buffer.view({-1}).copy_(result.view({-1}).narrow(0, 0, l.numel));
  comm::detail::comms_log_complete(log_seq);
}

}  // namespace deepspeed::onebit
