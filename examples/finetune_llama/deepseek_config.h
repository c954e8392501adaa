// DeepSeek-V2's and V3's config.json keys (transformers' DeepseekV2Config and DeepseekV3Config,
// and the DeepSeek repositories' own configuration files, which carry the same keys), read into
// and written from a LlamaConfig. llama_config.cpp reads the keys every family shares.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "llama_config.h"

namespace deepspeed::examples {

/// The multi-head latent attention and MoE keys of a "deepseek_v2" / "deepseek_v3" config.json,
/// with the config class's defaults, once the shared sizes are in `c`. Refused by name
/// (NotSupportedError): another hidden_act, attention dropout, fewer key/value heads than heads,
/// a moe_layer_freq other than 1, another scoring_func or topk_method than the model's, V2's
/// norm_topk_prob (transformers' DeepseekV2 never renormalises). ModelFileError naming `path`
/// and the key for sizes that do not fit.
void read_deepseek(const nlohmann::json& j, const std::string& path, LlamaConfig* c);

/// Adds what DeepseekV2Config / DeepseekV3Config read to `j` (the shared keys' object).
void write_deepseek(const LlamaConfig& c, nlohmann::json* j);

}  // namespace deepspeed::examples
