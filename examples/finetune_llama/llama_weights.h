// Where a Llama's pretrained weights come from: a GGUF file (names mapped to Hugging Face's,
// tensors dequantised, the converter's q/k row order for RoPE undone) or a Hugging Face folder
// (config.json + model.safetensors or sharded *.safetensors with an index). Owns the name
// mapping and layout conventions; the model itself is llama_model.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "llama_config.h"
#include "llama_model.h"

namespace deepspeed::examples {

/// A model file opened for loading: its hyper-parameters and the source of each weight.
struct LlamaCheckpoint {
  std::string path;
  bool is_gguf = false;
  LlamaConfig config;
  LlamaWeightSource weights;  // fp32 values by Hugging Face parameter name
};

/// Opens `path`: a .gguf file or a Hugging Face folder. Throws ModelFileError naming the file
/// and field when something is missing or inconsistent (e.g. a folder without config.json, a
/// tensor missing from every shard, a vocabulary size that disagrees with the embedding).
LlamaCheckpoint open_llama_checkpoint(const std::string& path);

/// The GGUF name of a Hugging Face parameter name ("model.layers.3.mlp.up_proj.weight" ->
/// "blk.3.ffn_up.weight"; Gemma 2's and Gemma 3's norms by `model_type`). Throws
/// ModelFileError for a name with no GGUF counterpart.
std::string gguf_tensor_name(const std::string& hf_name, const std::string& model_type = "");

/// Undoes llama.cpp's converter permutation of q_proj / k_proj rows (it interleaves the two
/// halves of each head for its RoPE kernel): [out, in] with `n_head` heads -> Hugging Face order.
/// Matches transformers' reverse_permute_weights.
at::Tensor unpermute_rope_rows(const at::Tensor& w, int64_t n_head);

/// Writes `model` as a Hugging Face folder readable by transformers as is: config.json,
/// model.safetensors (fp32, tied lm_head left out) and generation_config.json. Call on every rank
/// under ZeRO-3 (the weights are gathered); only `write` ranks touch the disk.
void save_hf_weights(LlamaForCausalLMImpl& model, const std::string& dir, bool write);

}  // namespace deepspeed::examples
