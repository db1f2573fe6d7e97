// Greedy pairwise merging, the core shared by the SentencePiece and the byte-level BPE tokenizers.
#pragma once
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

namespace rf {

// How eagerly two adjacent symbols merge: higher first; nullopt when they do not merge at all.
using PairPriority = std::function<std::optional<double>(std::string_view left, std::string_view right)>;

// Starts from one symbol per character of `text` (cut by lead bytes, so any bytes work) and repeatedly merges
// the adjacent pair of highest priority, the leftmost one on ties, until no pair merges. Returns the final
// symbols in order; they are views into `text`.
std::vector<std::string_view> merge_symbols(std::string_view text, const PairPriority& priority);

}  // namespace rf
