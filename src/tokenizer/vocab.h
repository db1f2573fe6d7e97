// The token list shared by the tokenizer algorithms (internal to the tokenizer module).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace rf {

struct Vocab {
  std::vector<std::string> texts;
  std::vector<float> scores;
  std::vector<TokenType> types;

  struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  std::unordered_map<std::string, int32_t, TextHash, std::equal_to<>> ids;  // the first id of each text

  int32_t size() const { return static_cast<int32_t>(texts.size()); }
  int32_t find(std::string_view text) const {
    const auto it = ids.find(text);
    return it == ids.end() ? kNoToken : it->second;
  }
  // The tokens that text may turn into by merging are normal ones, so that text like "<s>" or "<0x0A>" never
  // becomes a control or byte token. SentencePiece writes user-defined tokens in the same alphabet as normal
  // ones, so they count there too; byte-level BPE writes them as plain text, unlike its byte characters.
  int32_t find_normal(std::string_view text) const { return find_of_types(text, TokenType::Normal, TokenType::Normal); }
  int32_t find_normal_or_user_defined(std::string_view text) const {
    return find_of_types(text, TokenType::Normal, TokenType::UserDefined);
  }

 private:
  int32_t find_of_types(std::string_view text, TokenType a, TokenType b) const {
    const int32_t id = find(text);
    return id != kNoToken && (types[id] == a || types[id] == b) ? id : kNoToken;
  }
};

}  // namespace rf
