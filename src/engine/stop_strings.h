// A request's stop strings, matched against its generated text as it streams, as OpenAI's API, vLLM and
// llama.cpp's server define them: the first stop string to appear ends the output, and neither it nor anything
// after it is part of the output. Text that may be the start of a stop string split across tokens is held back
// until the following pieces show whether it is one.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rf::engine {

class StopStrings {
 public:
  // Each stop string must be non-empty valid UTF-8 (else an rf::Error naming it); no stop strings: nothing
  // ever matches, and every piece comes back whole.
  explicit StopStrings(std::vector<std::string> stops);

  // Takes the next piece of generated text (whole UTF-8 characters, as Detokenizer::push yields them; may be
  // empty) and returns the text that is now safe to emit. It holds back the longest end of the text that is
  // the start of a stop string, so what it returns never splits a character. When a stop string completes,
  // it returns the text before that stop string and matched() names it; the occurrence that ends first wins
  // (the generation stops there), and of those ending together the longest. After a match it returns nothing.
  std::string push(std::string_view piece);

  // At the end of generation without a match (token limit, end-of-generation token, cancellation): returns
  // what was held back and starts over. Returns nothing after a match.
  std::string flush();

  // The index in stops() of the stop string that ended the text, if one did.
  std::optional<size_t> matched() const { return matched_; }
  const std::vector<std::string>& stops() const { return stops_; }

 private:
  // One state of an Aho-Corasick automaton over the stop strings' bytes: a prefix of at least one of them.
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node), sorted by byte
    int32_t fallback = 0;  // the node of the longest proper suffix of this prefix that is a prefix too
    int32_t depth = 0;     // bytes in the prefix
    int32_t stop = -1;     // the longest stop string that ends this prefix (index into stops_), or -1
  };

  int32_t child(int32_t node, uint8_t byte) const;  // -1 when there is none
  int32_t step(int32_t node, uint8_t byte) const;

  std::vector<std::string> stops_;
  std::vector<Node> nodes_;    // nodes_[0]: the empty prefix
  int32_t state_ = 0;          // the longest end of the text so far that is the start of a stop string
  std::string held_;           // that end's bytes, not emitted yet
  std::optional<size_t> matched_;
};

}  // namespace rf::engine
