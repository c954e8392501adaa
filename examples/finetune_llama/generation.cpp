// Generation loop (see generation.h): the prompt fills the cache in one forward, then one token
// per forward.
#include "generation.h"

#include <torch/torch.h>

#include "util/check.h"

namespace deepspeed::examples {
namespace {

int64_t pick(const torch::Tensor& logits, const GenerationOptions& o, torch::Generator& gen) {
  if (o.temperature <= 0.0) return logits.argmax().item<int64_t>();
  auto probs = torch::softmax(logits.to(torch::kDouble) / o.temperature, -1);
  if (o.top_p < 1.0) {
    auto [sorted, order] = probs.sort(/*dim=*/-1, /*descending=*/true);
    auto before = sorted.cumsum(-1) - sorted;  // mass of the tokens ranked above each one
    sorted.masked_fill_(before >= o.top_p, 0.0);
    probs = torch::zeros_like(probs).scatter_(-1, order, sorted);
  }
  return torch::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
}

}  // namespace

std::vector<int64_t> generate(LlamaForCausalLMImpl& model, const std::vector<int64_t>& prompt,
                              const GenerationOptions& o) {
  DS_CHECK(!prompt.empty(), UsageError, "generation needs a prompt of at least one token");
  DS_CHECK(o.top_p > 0.0 && o.top_p <= 1.0, UsageError, "--top_p is ", o.top_p,
           "; expected a value in (0, 1]");
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  torch::Generator generator(gen);
  LlamaKvCache cache;
  std::vector<int64_t> out;
  std::vector<int64_t> sequence = prompt;
  auto input = torch::tensor(prompt, torch::kLong).unsqueeze(0);
  // Phi-3's longrope rotates with other frequencies once the sequence passes the original
  // context: the step that first does so runs the whole sequence again without the cache, whose
  // keys were rotated with the short ones (transformers' Phi3ForCausalLM does the same).
  const RopeScaling& rope = model.config().rope_scaling;
  const int64_t switch_at =
      rope.rope_type == "longrope" ? rope.original_max_position_embeddings : -1;
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    if (cache.length() > 0 && cache.length() == switch_at) {
      cache = LlamaKvCache();
      input = torch::tensor(sequence, torch::kLong).unsqueeze(0);
    }
    auto logits = model.logits(input, &cache);
    const int64_t next = pick(logits[0][-1], o, generator);
    out.push_back(next);
    sequence.push_back(next);
    if (next == o.eos_token_id) break;
    input = torch::tensor({next}, torch::kLong).unsqueeze(0);
  }
  return out;
}

}  // namespace deepspeed::examples
