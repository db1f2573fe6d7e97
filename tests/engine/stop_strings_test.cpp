// Stop strings against the text they are fed piece by piece: a stop string split across pieces is matched and
// never emitted, held-back text comes out when it turns out not to be a stop string or at the end, the first
// stop string to complete wins (several, prefixes of one another, overlapping candidates, at the very start,
// multi-byte characters), bad stop strings are rf::Errors, and random texts, stop strings and splits agree with
// a direct search of the whole text.
#include "engine/stop_strings.h"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_of.h"
#include "tokenizer/utf8.h"

namespace rf::engine {
namespace {

using test::error_of;

struct Fed {
  std::vector<std::string> emitted;  // what each push returned, then what flush returned
  std::string text;                  // all of it together
  std::optional<size_t> matched;
};

Fed feed(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopStrings matcher(stops);
  Fed fed;
  for (const std::string& piece : pieces) fed.emitted.push_back(matcher.push(piece));
  fed.emitted.push_back(matcher.flush());
  for (const std::string& text : fed.emitted) fed.text += text;
  fed.matched = matcher.matched();
  return fed;
}

// Each character of `text` as its own piece.
std::vector<std::string> characters(std::string_view text) {
  std::vector<std::string> pieces;
  while (!text.empty()) {
    const size_t length = utf8::read_prefix(text).length;
    pieces.emplace_back(text.substr(0, length));
    text.remove_prefix(length);
  }
  return pieces;
}

using Pieces = std::vector<std::string>;

TEST(StopStrings, WithoutStopStringsEveryPieceComesBackWhole) {
  const Fed fed = feed({}, {"Once", " upon", "", " a time"});
  EXPECT_EQ(fed.emitted, (Pieces{"Once", " upon", "", " a time", ""}));
  EXPECT_FALSE(fed.matched);
}

TEST(StopStrings, StopSplitAcrossPiecesIsHeldBackAndNotEmitted) {
  const Fed fed = feed({"</s>"}, {"Hello <", "/", "s", "> and more"});
  EXPECT_EQ(fed.emitted, (Pieces{"Hello ", "", "", "", ""}));
  EXPECT_EQ(fed.matched, 0u);
}

TEST(StopStrings, HeldTextThatTurnsOutNotToBeAStopComesOutWhole) {
  const Fed fed = feed({"STOP"}, {"a ST", "ART", " STO", "NE"});
  EXPECT_EQ(fed.emitted, (Pieces{"a ", "START", " ", "STONE", ""}));
  EXPECT_FALSE(fed.matched);
}

TEST(StopStrings, FlushReturnsWhatWasHeldBackAndStartsOver) {
  StopStrings matcher({"<end>"});
  EXPECT_EQ(matcher.push("done <en"), "done ");
  EXPECT_EQ(matcher.flush(), "<en");
  EXPECT_EQ(matcher.flush(), "");
  EXPECT_EQ(matcher.push("d>"), "d>");  // not the end of "<en": that was flushed
  EXPECT_FALSE(matcher.matched());
}

TEST(StopStrings, NothingComesOutAfterAMatch) {
  StopStrings matcher({"\n"});
  EXPECT_EQ(matcher.push("one\ntwo"), "one");
  EXPECT_EQ(matcher.push("three"), "");
  EXPECT_EQ(matcher.flush(), "");
  EXPECT_EQ(matcher.matched(), 0u);
}

TEST(StopStrings, OverlappingCandidates) {
  // "aba" then "a": the candidate from the first "a" fails, the one from the third "a" becomes "abab".
  for (const Pieces& pieces : {characters("abaabab"), Pieces{"abaabab"}, Pieces{"ab", "aab", "ab"}}) {
    const Fed fed = feed({"abab"}, pieces);
    EXPECT_EQ(fed.text, "aba");
    EXPECT_EQ(fed.matched, 0u);
  }
  const Fed fed = feed({"aab"}, characters("aaaab!"));
  EXPECT_EQ(fed.text, "aa");
}

TEST(StopStrings, ThePrefixOfAnotherStopCompletesFirst) {
  Fed fed = feed({"abc", "ab"}, {"xa", "bc"});
  EXPECT_EQ(fed.text, "x");
  EXPECT_EQ(fed.matched, 1u);

  // "abc" is still only a candidate when "ab" completes; generation stops there.
  fed = feed({"ab", "abc"}, {"xab"});
  EXPECT_EQ(fed.matched, 0u);
}

TEST(StopStrings, TheFirstStopToEndWinsAndOfThoseEndingTogetherTheLongest) {
  // "bc" ends before "abcd" could, so the output keeps the "a" that "abcd" would have dropped.
  Fed fed = feed({"abcd", "bc"}, {"abcd"});
  EXPECT_EQ(fed.text, "a");
  EXPECT_EQ(fed.matched, 1u);

  fed = feed({"c", "bc", "abc"}, {"zabc"});
  EXPECT_EQ(fed.text, "z");
  EXPECT_EQ(fed.matched, 2u);
}

TEST(StopStrings, SeveralStopStrings) {
  const Fed fed = feed({"\n\n", "User:", "###"}, {"Answer: 42", "\n", "User", ":", " thanks"});
  EXPECT_EQ(fed.text, "Answer: 42\n");
  EXPECT_EQ(fed.matched, 1u);
}

TEST(StopStrings, ARepeatedStopStringReportsItsFirstIndex) {
  EXPECT_EQ(feed({"x", "end", "end"}, {"the end"}).matched, 1u);
}

TEST(StopStrings, StopAtTheVeryStart) {
  Fed fed = feed({"Hi"}, {"Hi there"});
  EXPECT_EQ(fed.emitted, (Pieces{"", ""}));
  EXPECT_EQ(fed.matched, 0u);

  fed = feed({"Hi"}, {"", "H", "i"});
  EXPECT_EQ(fed.text, "");
  EXPECT_EQ(fed.matched, 0u);
}

TEST(StopStrings, MultiByteCharacters) {
  // Held back whole characters only, and released whole when they are not the stop string.
  Fed fed = feed({"日本語です"}, {"日", "本", "人", "。"});
  EXPECT_EQ(fed.emitted, (Pieces{"", "", "日本人", "。", ""}));

  fed = feed({"。\n"}, {"日本語", "。", "\n", "次"});
  EXPECT_EQ(fed.text, "日本語");
  EXPECT_EQ(fed.matched, 0u);

  // "è" and "é" share their first byte: "è" is not the start of "é" and comes out at once.
  fed = feed({"é"}, {"è", "é"});
  EXPECT_EQ(fed.emitted, (Pieces{"è", "", ""}));
  EXPECT_EQ(fed.matched, 0u);

  fed = feed({"🛑"}, {"go ", "🙂", "🛑"});
  EXPECT_EQ(fed.text, "go 🙂");
}

TEST(StopStrings, BadStopStringsAreErrorsNamingThem) {
  EXPECT_EQ(error_of([] { StopStrings({"ok", ""}); }), "stop string 1 is empty");
  EXPECT_EQ(error_of([] { StopStrings({"\xC3"}); }), "stop string 0 is not valid UTF-8");
  EXPECT_EQ(error_of([] { StopStrings({"a", "b", "\xED\xA0\x80"}); }), "stop string 2 is not valid UTF-8");
}

TEST(StopStrings, LongStreamOfNearMisses) {
  // 48 stop strings of 48 bytes that each differ from the text only in their last byte: every byte extends a
  // candidate, none completes, and what is held back never exceeds one stop string.
  std::vector<std::string> stops;
  for (int i = 0; i < 48; ++i) stops.push_back(std::string(47, 'a') + static_cast<char>('0' + i));
  StopStrings matcher(stops);
  std::string emitted;
  constexpr size_t kBytes = 200000;
  for (size_t i = 0; i < kBytes; ++i) {
    emitted += matcher.push("a");
    ASSERT_GE(emitted.size() + 47, i + 1);
  }
  emitted += matcher.flush();
  EXPECT_EQ(emitted, std::string(kBytes, 'a'));
}

// The direct answer from the whole text: the stop occurrence that ends first (the text stops growing there),
// and of those ending together the longest (first in the list among equal ones).
struct Expected {
  std::string text;
  std::optional<size_t> matched;
};

Expected search(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    std::optional<size_t> best;
    for (size_t i = 0; i < stops.size(); ++i) {
      const std::string& stop = stops[i];
      if (stop.size() > end || text.compare(end - stop.size(), stop.size(), stop) != 0) continue;
      if (!best || stop.size() > stops[*best].size()) best = i;
    }
    if (best) return {text.substr(0, end - stops[*best].size()), best};
  }
  return {text, std::nullopt};
}

// The longest end of `text` that is the start of a stop string: what must be held back.
size_t held_back(const std::string& text, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const std::string& stop : stops)
    for (size_t length = std::min(stop.size(), text.size()); length > longest; --length)
      if (text.compare(text.size() - length, length, stop, 0, length) == 0) longest = length;
  return longest;
}

// Characters first..first+count-1.
std::vector<std::string> slice(const std::vector<std::string>& chars, size_t first, size_t count) {
  return {chars.begin() + static_cast<ptrdiff_t>(first), chars.begin() + static_cast<ptrdiff_t>(first + count)};
}

TEST(StopStrings, RandomTextsStopsAndSplitsAgreeWithASearchOfTheWholeText) {
  // Few distinct characters, so that stop strings, their prefixes and overlaps occur often; multi-byte ones
  // share lead bytes ("é", "è") and are of every length.
  const std::vector<std::string> alphabet = {"a", "b", "c", "é", "è", "日", "🙂"};
  std::mt19937 rng(20240611);
  const auto below = [&rng](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  const auto random_text = [&](size_t max_chars) {
    std::vector<std::string> chars(below(max_chars + 1));
    for (std::string& c : chars) c = alphabet[below(alphabet.size())];
    return chars;
  };
  const auto join = [](const std::vector<std::string>& chars) {
    std::string text;
    for (const std::string& c : chars) text += c;
    return text;
  };

  size_t matches = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const std::vector<std::string> chars = random_text(40);
    const std::string text = join(chars);
    std::vector<std::string> stops(1 + below(4));
    for (std::string& stop : stops) {
      if (below(2) == 0 && !chars.empty()) {  // a piece of the text, so that it occurs
        const size_t first = below(chars.size());
        const size_t count = 1 + below(std::min<size_t>(5, chars.size() - first));
        stop = join(slice(chars, first, count));
      } else {
        do stop = join(random_text(5)); while (stop.empty());
      }
    }

    // Pieces of zero or more whole characters, as a detokenizer yields them.
    std::vector<std::string> pieces;
    for (size_t next = 0; next < chars.size();) {
      const size_t count = std::min(below(4), chars.size() - next);
      pieces.push_back(join(slice(chars, next, count)));
      next += count;
    }
    StopStrings matcher(stops);
    std::string fed, emitted;
    for (size_t i = 0; i < pieces.size() && !matcher.matched(); ++i) {
      const std::string out = matcher.push(pieces[i]);
      ASSERT_EQ(utf8::sanitize(out), out) << "a character split in trial " << trial;
      fed += pieces[i];
      emitted += out;
      if (!matcher.matched()) {
        ASSERT_EQ(emitted.size() + held_back(fed, stops), fed.size()) << "trial " << trial;
      }
    }
    emitted += matcher.flush();

    const Expected expected = search(text, stops);
    ASSERT_EQ(emitted, expected.text) << "trial " << trial << " text " << text;
    ASSERT_EQ(matcher.matched(), expected.matched) << "trial " << trial << " text " << text;
    matches += expected.matched.has_value();
  }
  EXPECT_GT(matches, 2000u);  // both outcomes are well exercised
  EXPECT_LT(matches, 18000u);
}

}  // namespace
}  // namespace rf::engine
