#include "tokenizer/spm.h"

#include <fmt/format.h>

#include "tokenizer/merge.h"

namespace rf {

SentencePieceEncoder::SentencePieceEncoder(const Vocab& vocab, int32_t unknown) : vocab_(vocab) {
  for (int byte = 0; byte < 256; ++byte) {
    int32_t id = vocab.find(fmt::format("<0x{:02X}>", byte));
    if (id == kNoToken || vocab.types[id] != TokenType::Byte) {
      id = vocab.find_normal_or_user_defined(std::string(1, static_cast<char>(byte)));
    }
    byte_tokens_[byte] = id == kNoToken ? unknown : id;
  }
}

void SentencePieceEncoder::encode(std::string_view text, std::vector<int32_t>& out) const {
  const auto pieces = merge_symbols(text, [this](std::string_view left, std::string_view right) {
    // Symbols are adjacent views into one text, so the merged text is the span covering both.
    const int32_t id = vocab_.find_normal_or_user_defined(std::string_view(left.data(), left.size() + right.size()));
    return id == kNoToken ? std::nullopt : std::optional<double>(vocab_.scores[id]);
  });
  for (std::string_view piece : pieces) {
    if (const int32_t id = vocab_.find_normal_or_user_defined(piece); id != kNoToken) {
      out.push_back(id);
      continue;
    }
    for (char byte : piece) {
      if (const int32_t id = byte_tokens_[static_cast<uint8_t>(byte)]; id != kNoToken) out.push_back(id);
    }
  }
}

}  // namespace rf
