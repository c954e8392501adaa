// Heap-driven BPE merging (see bpe_merge.h). Symbols stay at their first position in a linked
// list; a popped candidate whose pair no longer stands there is stale and skipped. A candidate
// that still stands is exactly what the lowest-rank-leftmost rule would merge next, since every
// pair that forms is pushed and positions keep their left-to-right order.
#include "bpe_merge.h"

#include <cstddef>
#include <functional>
#include <queue>

namespace deepspeed::examples {
namespace {

struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t merged;
  bool operator>(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

}  // namespace

void merge_word(const MergeTable& merges, std::vector<int64_t>* ids) {
  std::vector<int64_t>& sym = *ids;
  const auto n = static_cast<int32_t>(sym.size());
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges.find(merge_key(sym[pos], sym[next[pos]]));
    if (it != merges.end()) heap.push({it->second.first, pos, it->second.second});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int32_t right = next[c.pos];
    auto it = merges.find(merge_key(sym[c.pos], sym[right]));
    if (it == merges.end() || it->second.second != c.merged) continue;  // stale
    sym[c.pos] = c.merged;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[c.pos] >= 0) prev[next[c.pos]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  std::size_t out = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (alive[i]) sym[out++] = sym[i];
  }
  sym.resize(out);
}

}  // namespace deepspeed::examples
