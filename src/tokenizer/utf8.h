// UTF-8 helpers for the tokenizers. Text reaching a tokenizer is arbitrary bytes, so every function here
// accepts any byte sequence.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rf::utf8 {

// Bytes of the character that starts with `lead`, judged by the lead byte alone (a continuation or invalid
// byte counts as 1). The tokenizers cut text into symbols this way, as llama.cpp does: it never fails, and
// on valid UTF-8 it yields exactly the characters.
inline size_t length_from_lead(uint8_t lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// What the bytes at the start of a string hold.
struct Prefix {
  enum class Kind {
    Char,       // one valid character of `length` bytes
    Truncated,  // the valid first `length` bytes of a character that the string cuts off
    Invalid,    // `length` bytes (at least 1) that no valid character starts with
  };
  Kind kind;
  size_t length;
  char32_t code_point;  // for Char only
};
Prefix read_prefix(std::string_view text);  // text must not be empty

std::string encode(char32_t code_point);

// `text` with each invalid sequence replaced by U+FFFD; a truncated character at the end counts as invalid.
std::string sanitize(std::string_view text);

}  // namespace rf::utf8
