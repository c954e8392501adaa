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
  auto input = torch::tensor(prompt, torch::kLong).unsqueeze(0);
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    auto logits = model.logits(input, &cache);
    const int64_t next = pick(logits[0][-1], o, generator);
    out.push_back(next);
    if (next == o.eos_token_id) break;
    input = torch::tensor({next}, torch::kLong).unsqueeze(0);
  }
  return out;
}

}  // namespace deepspeed::examples
