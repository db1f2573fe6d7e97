#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace rf {
namespace {

using Kind = utf8::Prefix::Kind;

TEST(Utf8, ReadsCharactersAndRejectsIllFormedSequences) {
  const struct {
    std::string_view bytes;
    Kind kind;
    size_t length;
  } cases[] = {
      {"A", Kind::Char, 1},
      {"\xC3\xA9", Kind::Char, 2},
      {"\xE2\x82\xAC", Kind::Char, 3},
      {"\xF0\x9F\xA6\x99", Kind::Char, 4},
      {"\xF0\x9F\xA6", Kind::Truncated, 3},
      {"\xE2", Kind::Truncated, 1},
      {"\x80", Kind::Invalid, 1},           // a continuation byte cannot start a character
      {"\xC0\xAF", Kind::Invalid, 1},       // overlong '/'
      {"\xE0\x80\xAF", Kind::Invalid, 1},   // overlong, 3 bytes
      {"\xED\xA0\x80", Kind::Invalid, 1},   // UTF-16 surrogate
      {"\xF4\x90\x80\x80", Kind::Invalid, 1},  // past U+10FFFF
      {"\xE2\x82" "A", Kind::Invalid, 2},   // broken off after two valid bytes
      {"\xFF", Kind::Invalid, 1},
  };
  for (const auto& c : cases) {
    const utf8::Prefix prefix = utf8::read_prefix(c.bytes);
    EXPECT_EQ(prefix.kind, c.kind) << testing::PrintToString(std::string(c.bytes));
    EXPECT_EQ(prefix.length, c.length) << testing::PrintToString(std::string(c.bytes));
  }
  EXPECT_EQ(utf8::read_prefix("\xF0\x9F\xA6\x99").code_point, U'\U0001F999');
}

TEST(Utf8, EncodesAndSanitizes) {
  EXPECT_EQ(utf8::encode(U'A'), "A");
  EXPECT_EQ(utf8::encode(U'\u00E9'), "\xC3\xA9");
  EXPECT_EQ(utf8::encode(U'\u20AC'), "\xE2\x82\xAC");
  EXPECT_EQ(utf8::encode(U'\U0001F999'), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(utf8::sanitize("ok \xC3\xA9"), "ok \xC3\xA9");
  EXPECT_EQ(utf8::sanitize("a\xFF" "b\xE2\x82"), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

}  // namespace
}  // namespace rf
