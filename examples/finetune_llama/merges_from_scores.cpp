// Merges of a score-only SentencePiece vocabulary (see merges_from_scores.h).
#include "merges_from_scores.h"

#include <algorithm>
#include <unordered_map>

#include "gguf_file.h"  // ModelFileError
#include "util/check.h"

namespace deepspeed::examples {
namespace {

struct Candidate {
  size_t left_len;  // the cut, in bytes
  double left_score, right_score, score;
  size_t token;     // index into the deduplicated vocabulary
};

}  // namespace

std::vector<std::pair<std::string, std::string>> merges_from_scores(
    const std::vector<std::string>& tokens, const std::vector<double>& scores) {
  DS_CHECK(tokens.size() == scores.size(), ModelFileError, "a vocabulary of ", tokens.size(),
           " tokens has ", scores.size(), " scores");
  // A Python dict of token -> score: a repeated token keeps its first place and its last score.
  std::vector<std::string> unique;
  std::unordered_map<std::string, double> score_of;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (score_of.find(tokens[i]) == score_of.end()) unique.push_back(tokens[i]);
    score_of[tokens[i]] = scores[i];
  }
  std::vector<Candidate> all;
  std::vector<Candidate> local;
  for (size_t t = 0; t < unique.size(); ++t) {
    const std::string& token = unique[t];
    local.clear();
    // Cut between code points, as Python slices a str.
    for (size_t cut = 1; cut < token.size(); ++cut) {
      if ((static_cast<unsigned char>(token[cut]) & 0xC0) == 0x80) continue;
      auto l = score_of.find(token.substr(0, cut));
      if (l == score_of.end()) continue;
      auto r = score_of.find(token.substr(cut));
      if (r == score_of.end()) continue;
      local.push_back({cut, l->second, r->second, score_of[token], t});
    }
    std::stable_sort(local.begin(), local.end(), [](const Candidate& a, const Candidate& b) {
      if (a.left_score != b.left_score) return a.left_score > b.left_score;
      return a.right_score > b.right_score;
    });
    all.insert(all.end(), local.begin(), local.end());
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(all.size());
  for (const auto& c : all) {
    const std::string& token = unique[c.token];
    merges.emplace_back(token.substr(0, c.left_len), token.substr(c.left_len));
  }
  return merges;
}

}  // namespace deepspeed::examples
