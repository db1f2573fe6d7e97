// SentencePiece-style tokenization as llama.cpp's llm_tokenizer_spm does it (internal to the module).
#pragma once
#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace rf {

class SentencePieceEncoder {
 public:
  // `unknown` stands for bytes the vocabulary has no token for (kNoToken drops them).
  SentencePieceEncoder(const Vocab& vocab, int32_t unknown);

  // Appends the tokens of `text`, whose spaces the caller has already escaped to U+2581. Adjacent symbols
  // merge into the token of highest score; what ends up as no token falls back to byte tokens <0xNN>, or to
  // single-byte tokens, or to `unknown` when the vocabulary has neither.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  const Vocab& vocab_;
  std::array<int32_t, 256> byte_tokens_;
};

}  // namespace rf
