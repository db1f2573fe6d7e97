#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "gguf/writer.h"
#include "test_paths.h"
#include "tokenizer/utf8.h"

namespace rf {
namespace {

// Vocabularies are large; each is read once for the whole test program.
const Tokenizer& shared_tokenizer(const std::string& relative_path) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[relative_path];
  if (!slot) slot = std::make_unique<Tokenizer>(*gguf::File::open(test::shared_path(relative_path)));
  return *slot;
}
const Tokenizer& vocab(const std::string& name) { return shared_tokenizer("vocab/ggml-vocab-" + name + ".gguf"); }

const std::vector<std::string> kAllVocabs = {"llama-spm", "phi-3", "llama-bpe", "gpt-2", "deepseek-llm", "starcoder"};

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// ---- special tokens and flags

TEST(Tokenizer, ReadsSpecialTokensOfLlamaSpm) {
  const Tokenizer& t = vocab("llama-spm");
  EXPECT_EQ(t.kind(), TokenizerKind::SentencePiece);
  EXPECT_EQ(t.n_vocab(), 32000);
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  EXPECT_EQ(t.unk(), 0);
  EXPECT_TRUE(t.add_bos());
  EXPECT_FALSE(t.add_eos());
  EXPECT_TRUE(t.is_end_of_generation(2));
  EXPECT_FALSE(t.is_end_of_generation(1));
  EXPECT_EQ(t.token_type(1), TokenType::Control);
  EXPECT_EQ(t.token_type(3), TokenType::Byte);
}

TEST(Tokenizer, FindsEndOfTurnTokensByText) {
  const Tokenizer& llama3 = vocab("llama-bpe");
  EXPECT_EQ(llama3.bos(), 128000);
  EXPECT_EQ(llama3.eos(), 128009);
  EXPECT_EQ(llama3.eot(), llama3.token_id("<|eot_id|>"));
  for (const char* text : {"<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"}) {
    EXPECT_TRUE(llama3.is_end_of_generation(llama3.token_id(text))) << text;
  }
  EXPECT_FALSE(llama3.is_end_of_generation(llama3.token_id("<|start_header_id|>")));
  EXPECT_FALSE(llama3.is_end_of_generation(llama3.bos()));

  const Tokenizer& phi3 = vocab("phi-3");
  EXPECT_EQ(phi3.eot(), phi3.token_id("<|end|>"));
  EXPECT_TRUE(phi3.is_end_of_generation(phi3.token_id("<|end|>")));
  EXPECT_TRUE(phi3.is_end_of_generation(phi3.eos()));
  EXPECT_FALSE(phi3.is_end_of_generation(phi3.token_id("<|assistant|>")));

  const Tokenizer& gpt2 = vocab("gpt-2");
  EXPECT_EQ(gpt2.end_of_generation_tokens(), std::vector<int32_t>{50256});
  EXPECT_FALSE(gpt2.add_bos());
}

TEST(Tokenizer, AddsBosAndEosOnlyWhenAsked) {
  const Tokenizer& t = vocab("llama-spm");
  const std::vector<int32_t> plain = t.encode("Hello world", false, false);
  EXPECT_EQ(t.encode("Hello world", true, false), concat({{1}, plain}));
  EXPECT_EQ(t.encode("", true, false), std::vector<int32_t>{1});
  EXPECT_TRUE(t.encode("", false, false).empty());
  // GPT-2 does not add BOS.
  EXPECT_EQ(vocab("gpt-2").encode("Hello", true, false), vocab("gpt-2").encode("Hello", false, false));
}

TEST(Tokenizer, LooksUpTokensByText) {
  const Tokenizer& t = vocab("llama-bpe");
  EXPECT_EQ(t.token_id("<|eot_id|>"), 128009);
  EXPECT_EQ(t.token_text(128009), "<|eot_id|>");
  EXPECT_EQ(t.token_id("no such token text"), kNoToken);
  EXPECT_THROW(t.token_text(-1), Error);
  EXPECT_THROW(t.token_to_piece(t.n_vocab()), Error);
}

// ---- special-token parsing

TEST(Tokenizer, ParsesControlTokensOnlyWhenAsked) {
  const Tokenizer& t = vocab("llama-bpe");
  const std::string text = "<|start_header_id|>user<|end_header_id|>";
  EXPECT_EQ(t.encode(text, false, true), concat({{128006}, t.encode("user", false, false), {128007}}));
  const std::vector<int32_t> as_text = t.encode(text, false, false);
  EXPECT_GT(as_text.size(), 3u);
  for (int32_t id : as_text) EXPECT_EQ(t.token_type(id), TokenType::Normal);
  EXPECT_EQ(t.decode(as_text), text);
}

TEST(Tokenizer, ParsesTheLongestSpecialTokenFirst) {
  const Tokenizer& t = vocab("llama-bpe");
  const int32_t ten = t.token_id("<|reserved_special_token_10|>");
  const int32_t one = t.token_id("<|reserved_special_token_1|>");
  ASSERT_NE(ten, kNoToken);
  ASSERT_NE(one, kNoToken);
  EXPECT_EQ(t.encode("<|reserved_special_token_10|><|reserved_special_token_1|>", false, true),
            (std::vector<int32_t>{ten, one}));
}

TEST(Tokenizer, SentencePieceAddsASpaceAfterSpecialTokens) {
  const Tokenizer& t = vocab("llama-spm");
  const int32_t hello = t.token_id("\xE2\x96\x81Hello");  // "▁Hello"
  EXPECT_EQ(t.encode("<s>Hello</s>", false, true), (std::vector<int32_t>{1, hello, 2}));
  const std::vector<int32_t> as_text = t.encode("<s>Hello", false, false);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 1), 0);
  EXPECT_EQ(t.decode(as_text), "<s>Hello");
}

TEST(Tokenizer, AlwaysSplitsUserDefinedTokens) {
  const Tokenizer& t = vocab("phi-3");  // "</s>" is a user-defined token there
  const std::vector<int32_t> ids = t.encode("a</s>b", false, false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);
}

// ---- pieces and decoding

TEST(Tokenizer, RendersPieces) {
  const Tokenizer& spm = vocab("llama-spm");
  EXPECT_EQ(spm.token_to_piece(spm.token_id("\xE2\x96\x81Hello")), " Hello");
  EXPECT_EQ(spm.token_to_piece(spm.token_id("<0x0A>")), "\n");
  EXPECT_EQ(spm.token_to_piece(1), "");
  EXPECT_EQ(spm.token_to_piece(1, /*render_special=*/true), "<s>");
  EXPECT_EQ(spm.decode(spm.encode("Hello", true, false)), "Hello");
  EXPECT_EQ(spm.decode(spm.encode("Hello", true, false), true), "<s> Hello");

  const Tokenizer& gpt2 = vocab("gpt-2");
  EXPECT_EQ(gpt2.token_to_piece(gpt2.token_id("\xC4\xA0world")), " world");  // "Ġworld"
  EXPECT_EQ(gpt2.token_to_piece(50256), "");
  EXPECT_EQ(gpt2.token_to_piece(50256, true), "<|endoftext|>");
}

// ---- robustness: any bytes tokenize, and byte-capable vocabularies give them back exactly

std::vector<std::string> awkward_inputs() {
  std::vector<std::string> inputs = {
      "\xFF", "\xFE\xFF", "abc\xC3", "\xE2\x82", "\xED\xA0\x80", "\xC0\xAF", "\xF4\x90\x80\x80", "a\x80z",
      std::string("nul\0byte", 8), "\xF0\x9F\xA6", "caf\xC3\xA9 \xF0\x9F\xA6\x99\xF0", "   \t\r\n  ",
  };
  std::string all_bytes;
  for (int byte = 0; byte < 256; ++byte) {
    inputs.emplace_back(1, static_cast<char>(byte));
    all_bytes += static_cast<char>(byte);
  }
  inputs.push_back(all_bytes);
  std::mt19937 rng(1234);
  for (int i = 0; i < 50; ++i) {
    std::string random(1 + rng() % 40, '\0');
    for (char& c : random) c = static_cast<char>(rng());
    inputs.push_back(random);
  }
  return inputs;
}

// Vocabularies with a token for every byte give any input back exactly; the others at least every valid
// UTF-8 input (StarCoder and DeepSeek lack normal tokens for the bytes that never occur in UTF-8).
TEST(Tokenizer, AnyBytesRoundTrip) {
  const std::vector<std::string> inputs = awkward_inputs();
  for (const std::string& name : kAllVocabs) {
    const Tokenizer& t = vocab(name);
    bool spells_every_byte = true;
    for (int byte = 0; byte < 256; ++byte) {
      const std::string input(1, static_cast<char>(byte));
      spells_every_byte = spells_every_byte && t.decode(t.encode(input, false, false)) == input;
    }
    EXPECT_EQ(spells_every_byte, name != "starcoder" && name != "deepseek-llm");
    for (const std::string& input : inputs) {
      const std::vector<int32_t> ids = t.encode(input, true, false);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t.n_vocab());
      if (spells_every_byte || utf8::sanitize(input) == input) {
        EXPECT_EQ(t.decode(ids), input) << name << ": " << testing::PrintToString(input);
      }
    }
  }
}

TEST(Tokenizer, VocabularyWithoutByteTokensMapsUnknownBytesToUnk) {
  const Tokenizer& t = shared_tokenizer("models/TinyStories-656K-Q8_0.gguf");
  EXPECT_EQ(t.unk(), 0);
  for (const std::string& input : awkward_inputs()) {
    for (int32_t id : t.encode(input, true, true)) ASSERT_TRUE(id >= 0 && id < t.n_vocab());
  }
  const std::vector<int32_t> ids = t.encode("\xFF", false, false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), t.unk()), 1);
}

// The whole wikitext test split, line by line, through a SentencePiece vocabulary without byte tokens.
TEST(Tokenizer, TokenizesWikitextWithoutByteTokens) {
  const Tokenizer& t = shared_tokenizer("models/TinyStories-656K-Q8_0.gguf");
  std::ifstream in(test::shared_path("data/wiki.test.raw"), std::ios::binary);
  ASSERT_TRUE(in);
  size_t n_lines = 0, n_tokens = 0;
  for (std::string line; std::getline(in, line); ++n_lines) {
    const std::vector<int32_t> ids = t.encode(line, true, false);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t.n_vocab());
    n_tokens += ids.size();
  }
  EXPECT_GT(n_lines, 1000u);
  EXPECT_GT(n_tokens, n_lines * 2);
}

// The prompt tokens that llama.cpp produced for the reference runs.
TEST(Tokenizer, MatchesReferencePromptTokens) {
  for (const char* run : {"stories260K.p1", "TinyStories-656K-Q8_0.p1", "llama-2-tiny-random.p3",
                          "synth-tiny256-F32.p3"}) {
    std::ifstream in(test::shared_path(std::string("reference/") + run + ".json"));
    ASSERT_TRUE(in) << run;
    const nlohmann::json reference = nlohmann::json::parse(in);
    const Tokenizer& t = shared_tokenizer("models/" + reference["model"].get<std::string>());
    EXPECT_EQ(t.encode(reference["prompt"].get<std::string>(), reference["add_bos"].get<bool>(), false),
              reference["prompt_tokens"].get<std::vector<int32_t>>())
        << run;
  }
}

// ---- streaming detokenizer

TEST(Detokenizer, EmitsACharacterSplitOverByteTokensWhole) {
  const Tokenizer& t = vocab("llama-spm");
  const std::vector<int32_t> llama_bytes = {t.token_id("<0xF0>"), t.token_id("<0x9F>"), t.token_id("<0xA6>"),
                                            t.token_id("<0x99>")};  // U+1F999
  Detokenizer stream(t);
  EXPECT_EQ(stream.push(t.token_id("\xE2\x96\x81" "a")), " a");
  EXPECT_EQ(stream.push(llama_bytes[0]), "");
  EXPECT_EQ(stream.push(llama_bytes[1]), "");
  EXPECT_EQ(stream.push(llama_bytes[2]), "");
  EXPECT_EQ(stream.push(llama_bytes[3]), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(stream.flush(), "");
}

TEST(Detokenizer, StreamsByteLevelBpeTextExactly) {
  const Tokenizer& t = vocab("gpt-2");
  const std::string text = "Emoji \xF0\x9F\xA6\x99 and \xE4\xBD\xA0\xE5\xA5\xBD, caf\xC3\xA9.";
  Detokenizer stream(t);
  std::string streamed;
  for (int32_t id : t.encode(text, false, false)) {
    const std::string piece = stream.push(id);
    EXPECT_EQ(utf8::sanitize(piece), piece) << "a push returned a partial character";
    streamed += piece;
  }
  streamed += stream.flush();
  EXPECT_EQ(streamed, text);
}

TEST(Detokenizer, ReplacesBytesThatFormNoCharacter) {
  const Tokenizer& t = vocab("llama-spm");
  Detokenizer stream(t);
  EXPECT_EQ(stream.push(t.token_id("<0xFF>")), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.push(t.token_id("<0xE2>")), "");
  EXPECT_EQ(stream.push(t.token_id("<0x41>")), "\xEF\xBF\xBD" "A");  // the E2 sequence broke off
  EXPECT_EQ(stream.push(t.token_id("<0xE2>")), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");  // the stream ended inside a character
}

// ---- small synthetic files: what a GGUF must provide

std::string write_vocab_file(const std::string& name, const std::function<void(gguf::Writer&)>& fill) {
  gguf::Writer writer;
  fill(writer);
  const std::string path = testing::TempDir() + "/rf_tokenizer_" + name + ".gguf";
  writer.write(path);
  return path;
}

TEST(Tokenizer, RejectsUnsupportedFiles) {
  const std::vector<std::string> tokens = {"<unk>", "a", "b", "ab"};
  const std::vector<std::string> merges = {"a b"};
  const auto fill_tokens = [&](gguf::Writer& w) { w.set_string_array("tokenizer.ggml.tokens", std::span(tokens)); };
  const std::string bert = write_vocab_file("bert", [&](gguf::Writer& w) {
    w.set_string("tokenizer.ggml.model", "bert");
    fill_tokens(w);
  });
  const std::string unknown_pre = write_vocab_file("unknown_pre", [&](gguf::Writer& w) {
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "no-such-pre");
    fill_tokens(w);
    w.set_string_array("tokenizer.ggml.merges", std::span(merges));
  });
  const std::string no_tokens = write_vocab_file("no_tokens", [&](gguf::Writer& w) {
    w.set_string("tokenizer.ggml.model", "llama");
  });
  const auto error_of = [](const std::string& path) {
    try {
      Tokenizer tokenizer(*gguf::File::open(path));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(bert).find("unsupported tokenizer model 'bert'"), std::string::npos) << error_of(bert);
  EXPECT_NE(error_of(unknown_pre).find("unknown pre-tokenizer 'no-such-pre'"), std::string::npos);
  EXPECT_NE(error_of(no_tokens).find("tokenizer.ggml.tokens"), std::string::npos) << error_of(no_tokens);
  for (const auto& path : {bert, unknown_pre, no_tokens}) std::filesystem::remove(path);
}

TEST(Tokenizer, SentencePieceMergesByScoreAndDropsBytesWithoutAnyToken) {
  // No <unk> (0xFFFFFFFF means none), no byte tokens: characters the vocabulary lacks disappear.
  const std::vector<std::string> tokens = {"<s>", "</s>", "\xE2\x96\x81", "a", "b", "ab", "\xE2\x96\x81" "a", "bb"};
  const std::vector<float> scores = {0, 0, -1, -2, -2, -1, -0.5f, -3};
  const std::vector<int32_t> types = {3, 3, 1, 1, 1, 1, 1, 1};
  const std::string path = write_vocab_file("spm", [&](gguf::Writer& w) {
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_string_array("tokenizer.ggml.tokens", std::span(tokens));
    w.set_array("tokenizer.ggml.scores", std::span(scores));
    w.set_array("tokenizer.ggml.token_type", std::span(types));
    w.set<uint32_t>("tokenizer.ggml.unknown_token_id", 0xFFFFFFFF);
  });
  const Tokenizer t(*gguf::File::open(path));
  std::filesystem::remove(path);
  EXPECT_EQ(t.unk(), kNoToken);
  // "▁abb": "▁a" (-0.5) beats "ab" (-1), then "bb" (-3) merges last.
  EXPECT_EQ(t.encode("abb", false, false), (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(t.encode("ab\xFF", false, false), (std::vector<int32_t>{6, 4}));
}

}  // namespace
}  // namespace rf
