#include "tokenizer/utf8.h"

namespace rf::utf8 {

Prefix read_prefix(std::string_view text) {
  const auto lead = static_cast<uint8_t>(text[0]);
  if (lead < 0x80) return {Prefix::Kind::Char, 1, lead};

  // Well-formed sequences per RFC 3629: the lead byte fixes the length and the allowed range of the second
  // byte, which rules out overlong forms, surrogates and code points past U+10FFFF.
  size_t length = 0;
  uint8_t second_min = 0x80, second_max = 0xBF;
  char32_t code_point = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code_point = lead & 0x0F;
    if (lead == 0xE0) second_min = 0xA0;
    if (lead == 0xED) second_max = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code_point = lead & 0x07;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;
  } else {
    return {Prefix::Kind::Invalid, 1, 0};
  }

  for (size_t i = 1; i < length; ++i) {
    if (i == text.size()) return {Prefix::Kind::Truncated, i, 0};
    const auto byte = static_cast<uint8_t>(text[i]);
    const uint8_t min = i == 1 ? second_min : 0x80;
    const uint8_t max = i == 1 ? second_max : 0xBF;
    if (byte < min || byte > max) return {Prefix::Kind::Invalid, i, 0};
    code_point = (code_point << 6) | (byte & 0x3F);
  }
  return {Prefix::Kind::Char, length, code_point};
}

std::string encode(char32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
  return out;
}

std::string sanitize(std::string_view text) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const Prefix prefix = read_prefix(text);
    if (prefix.kind == Prefix::Kind::Char) {
      out += text.substr(0, prefix.length);
    } else {
      out += kReplacement;
    }
    text.remove_prefix(prefix.length);
  }
  return out;
}

}  // namespace rf::utf8
