// DeepSeek-V2's and V3's GGUF metadata (llama.cpp's "deepseek2" architecture, as its converter's
// DeepseekV2Model writes both), read into a LlamaConfig. llama_config.cpp reads the keys every
// architecture shares; llama_weights.cpp the tensors.
#pragma once

#include <string>

#include "llama_config.h"

namespace deepspeed::examples {

class GgufFile;

/// The latent attention, rotation and MoE keys under prefix `p` ("deepseek2."), once the shared
/// sizes are in `c`: V3 where the router scores by sigmoid (expert_gating_func 2), else V2.
/// Throws ModelFileError naming the file and key for sizes that do not fit, NotSupportedError for
/// what the model cannot run (another rope scaling than yarn or none).
void read_deepseek_gguf(const GgufFile& f, const std::string& p, LlamaConfig* c);

}  // namespace deepspeed::examples
