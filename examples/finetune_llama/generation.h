// Text generation with a key/value cache: greedy by default, or temperature / nucleus (top-p)
// sampling from a seeded generator. Every rank runs the same steps (a ZeRO-3 model gathers its
// layers collectively), and with one seed every rank draws the same tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "llama_model.h"

namespace deepspeed::examples {

struct GenerationOptions {
  int64_t max_new_tokens = 32;
  double temperature = 0.0;  // 0: greedy (argmax)
  double top_p = 1.0;        // keep the smallest set of tokens whose probability reaches top_p
  uint64_t seed = 1234;
  int64_t eos_token_id = -1;  // stop after generating it (it is kept); -1: never
};

/// The ids generated after `prompt` (the prompt itself not included), at most max_new_tokens.
/// Runs under NoGradGuard.
std::vector<int64_t> generate(LlamaForCausalLMImpl& model, const std::vector<int64_t>& prompt,
                              const GenerationOptions& options);

}  // namespace deepspeed::examples
