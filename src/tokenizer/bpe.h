// Byte-level BPE tokenization as llama.cpp's llm_tokenizer_bpe does it (internal to the module).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/vocab.h"

namespace rf {

class BytePairEncoder {
 public:
  // `merges` are tokenizer.ggml.merges ("left right", best first); `pre` is tokenizer.ggml.pre.
  BytePairEncoder(const Vocab& vocab, const std::vector<std::string_view>& merges, std::string_view pre);

  // Appends the tokens of `text`: the pre-tokenizer cuts it into words, each word's bytes become GPT-2's
  // byte characters, and adjacent symbols merge by rank, lowest first. A byte the vocabulary has no
  // character token for is dropped, as llama.cpp does (its "unknown" token is often the end of text).
  void encode(std::string_view text, std::vector<int32_t>& out) const;

  // The bytes a normal token's text stands for (its byte characters mapped back).
  static std::string decode_token_text(std::string_view text);

  const PreTokenizer& pre_tokenizer() const { return pre_tokenizer_; }

 private:
  const Vocab& vocab_;
  PreTokenizer pre_tokenizer_;
  std::unordered_map<std::string, int32_t, Vocab::TextHash, std::equal_to<>> merge_ranks_;  // "left right"
};

}  // namespace rf
