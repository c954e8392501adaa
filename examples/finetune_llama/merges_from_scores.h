// The merges of a SentencePiece BPE vocabulary that a GGUF file holds without any
// (tokenizer.ggml.model "llama": tokens and their scores only), made as transformers' GGUF loader
// makes them, so that the tokenizer encodes as the one transformers builds from the same file:
// every way of cutting a token into two tokens of the vocabulary is a merge; a token's merges go
// highest (score of left, score of right) first, and all of them by the token's score, highest
// first, keeping that order among equal scores.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace deepspeed::examples {

std::vector<std::pair<std::string, std::string>> merges_from_scores(
    const std::vector<std::string>& tokens, const std::vector<double>& scores);

}  // namespace deepspeed::examples
