#include "tokenizer/merge.h"

#include <algorithm>
#include <queue>

#include "tokenizer/utf8.h"

namespace rf {

namespace {

// A run of text in a doubly linked list; a symbol merged into its left neighbour keeps length 0.
struct Symbol {
  size_t begin;
  size_t length;
  int prev;
  int next;
};

// A pair that may merge. `length` is the pair's combined length when it was queued: if either symbol has
// merged with another neighbour since, the lengths no longer add up and the candidate is stale.
struct Candidate {
  double priority;
  int left;
  int right;
  size_t length;
};

struct LowerCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
  }
};

}  // namespace

std::vector<std::string_view> merge_symbols(std::string_view text, const PairPriority& priority) {
  std::vector<Symbol> symbols;
  for (size_t offset = 0; offset < text.size();) {
    const size_t length = std::min(utf8::length_from_lead(static_cast<uint8_t>(text[offset])), text.size() - offset);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({offset, length, index - 1, offset + length < text.size() ? index + 1 : -1});
    offset += length;
  }

  std::priority_queue<Candidate, std::vector<Candidate>, LowerCandidate> queue;
  auto try_queue = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = symbols[left];
    const Symbol& b = symbols[right];
    if (auto p = priority(text.substr(a.begin, a.length), text.substr(b.begin, b.length))) {
      queue.push({*p, left, right, a.length + b.length});
    }
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_queue(i - 1, i);

  while (!queue.empty()) {
    const Candidate best = queue.top();
    queue.pop();
    Symbol& left = symbols[best.left];
    Symbol& right = symbols[best.right];
    if (left.length == 0 || right.length == 0 || left.length + right.length != best.length) continue;

    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = best.left;

    try_queue(left.prev, best.left);
    try_queue(best.left, left.next);
  }

  std::vector<std::string_view> pieces;
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    pieces.push_back(text.substr(symbols[i].begin, symbols[i].length));
  }
  return pieces;
}

}  // namespace rf
