// DeepSpeed's SparseAttentionUtils for token inputs: padding to whole blocks and back.
#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "deepspeed/sparse_attention.h"

namespace deepspeed::sparse_attention {
namespace {

at::Tensor pad_right(const at::Tensor& x, int64_t pad_len, int64_t value) {
  if (!x.defined() || pad_len == 0) return x;
  return at::constant_pad_nd(x, {0, pad_len}, static_cast<double>(value));
}

}  // namespace

PaddedInputs pad_to_block_size(int64_t block, const at::Tensor& input_ids,
                               const at::Tensor& attention_mask, const at::Tensor& token_type_ids,
                               const at::Tensor& position_ids, int64_t pad_token_id) {
  if (block < 1) throw std::invalid_argument("pad_to_block_size: block must be at least 1");
  if (!input_ids.defined() || input_ids.dim() != 2) {
    throw std::invalid_argument("pad_to_block_size: input_ids must be [batch, tokens]");
  }
  PaddedInputs out;
  const int64_t seq_len = input_ids.size(1);
  out.pad_len = (block - seq_len % block) % block;
  out.input_ids = pad_right(input_ids, out.pad_len, pad_token_id);
  out.position_ids = pad_right(position_ids, out.pad_len, pad_token_id);  // as DeepSpeed
  out.attention_mask = pad_right(attention_mask, out.pad_len, 0);         // no attention to padding
  out.token_type_ids = pad_right(token_type_ids, out.pad_len, 0);
  return out;
}

at::Tensor unpad_sequence_output(int64_t pad_len, const at::Tensor& sequence_output) {
  if (pad_len <= 0) return sequence_output;
  return sequence_output.slice(1, 0, sequence_output.size(1) - pad_len);
}

}  // namespace deepspeed::sparse_attention
