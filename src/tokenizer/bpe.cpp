#include "tokenizer/bpe.h"

#include <algorithm>

#include "tokenizer/merge.h"
#include "tokenizer/utf8.h"

namespace rf {

namespace {

// GPT-2's reversible byte encoding: printable Latin-1 bytes stand for themselves and the other 68 bytes
// (controls, space, 0x7F-0xA0, 0xAD) take the code points from U+0100 on in byte order. Every byte thus
// becomes a visible character, and words never contain a space, which separates the halves of a merge.
struct ByteCharacters {
  static constexpr char32_t kEnd = 256 + 68;
  std::array<std::string, 256> of_byte;
  std::array<int, kEnd> byte_of;  // code point -> byte, -1 for none
};

const ByteCharacters& byte_characters() {
  static const ByteCharacters table = [] {
    ByteCharacters t;
    t.byte_of.fill(-1);
    char32_t next_shifted = 256;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
      const char32_t code_point = printable ? static_cast<char32_t>(byte) : next_shifted++;
      t.of_byte[byte] = utf8::encode(code_point);
      t.byte_of[code_point] = byte;
    }
    return t;
  }();
  return table;
}

}  // namespace

BytePairEncoder::BytePairEncoder(const Vocab& vocab, const std::vector<std::string_view>& merges,
                                 std::string_view pre)
    : vocab_(vocab), pre_tokenizer_(pre) {
  merge_ranks_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    // The halves are split at the first space after the first byte; the first of duplicate merges counts.
    if (merges[rank].find(' ', 1) != std::string_view::npos) {
      merge_ranks_.emplace(merges[rank], static_cast<int32_t>(rank));
    }
  }
}

void BytePairEncoder::encode(std::string_view text, std::vector<int32_t>& out) const {
  const ByteCharacters& chars = byte_characters();
  std::string merge_key;
  const PairPriority lower_rank_first = [&](std::string_view left, std::string_view right) {
    merge_key.assign(left).append(" ").append(right);
    const auto it = merge_ranks_.find(merge_key);
    return it == merge_ranks_.end() ? std::nullopt : std::optional<double>(-static_cast<double>(it->second));
  };

  for (std::string_view word : pre_tokenizer_.split(text)) {
    std::string encoded;
    for (char byte : word) encoded += chars.of_byte[static_cast<uint8_t>(byte)];

    if (pre_tokenizer_.ignore_merges()) {
      if (const int32_t id = vocab_.find_normal(encoded); id != kNoToken) {
        out.push_back(id);
        continue;
      }
    }
    for (std::string_view piece : merge_symbols(encoded, lower_rank_first)) {
      if (const int32_t id = vocab_.find_normal(piece); id != kNoToken) {
        out.push_back(id);
        continue;
      }
      // Only a vocabulary missing some byte characters gets here: keep the characters it has.
      while (!piece.empty()) {
        const size_t length = utf8::length_from_lead(static_cast<uint8_t>(piece[0]));
        if (const int32_t id = vocab_.find_normal(piece.substr(0, length)); id != kNoToken) out.push_back(id);
        piece.remove_prefix(std::min(length, piece.size()));
      }
    }
  }
}

std::string BytePairEncoder::decode_token_text(std::string_view text) {
  const ByteCharacters& chars = byte_characters();
  std::string bytes;
  while (!text.empty()) {
    const utf8::Prefix prefix = utf8::read_prefix(text);
    const bool is_byte_char = prefix.kind == utf8::Prefix::Kind::Char && prefix.code_point < ByteCharacters::kEnd &&
                              chars.byte_of[prefix.code_point] >= 0;
    if (is_byte_char) {
      bytes += static_cast<char>(chars.byte_of[prefix.code_point]);
    } else {
      bytes += text.substr(0, prefix.length);  // not a byte character: keep it as it is
    }
    text.remove_prefix(prefix.length);
  }
  return bytes;
}

}  // namespace rf
