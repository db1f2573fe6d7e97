#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <charconv>

#include "tokenizer/bpe.h"
#include "tokenizer/spm.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

namespace rf {

namespace {

// SentencePiece writes spaces as U+2581 ("▁").
constexpr std::string_view kEscapedSpace = "\xE2\x96\x81";

// Token texts that end a turn or the text: models often leave them out of tokenizer.ggml.eot_token_id, so
// llama.cpp recognizes them by text.
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<end_of_utterance>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // DeepSeek's <｜end▁of▁sentence｜>
};

const std::vector<std::string_view>& read_strings(const gguf::File& file, std::string_view key) {
  const gguf::Value& value = file.get_value(key);
  if (!value.is_array() || value.element_type() != gguf::ValueType::STRING) {
    fail("{}: key '{}' is not an array of strings", file.path(), key);
  }
  return value.strings();
}

// A numeric array of at least `count` items, as floats (scores may be stored as int32, as llama.cpp accepts).
std::vector<float> read_scores(const gguf::File& file, std::string_view key, size_t count) {
  const gguf::Value* value = file.find(key);
  if (!value) return std::vector<float>(count, 0.0f);
  std::vector<float> scores;
  if (value->is_array() && value->element_type() == gguf::ValueType::FLOAT32) {
    scores = value->array<float>();
  } else if (value->is_array() && value->element_type() == gguf::ValueType::INT32) {
    for (int32_t score : value->array<int32_t>()) scores.push_back(static_cast<float>(score));
  } else {
    fail("{}: key '{}' is not an array of float32 or int32", file.path(), key);
  }
  if (scores.size() < count) fail("{}: key '{}' has {} items for {} tokens", file.path(), key, scores.size(), count);
  return scores;
}

std::vector<TokenType> read_types(const gguf::File& file, std::string_view key, size_t count) {
  const gguf::Value* value = file.find(key);
  if (!value) return std::vector<TokenType>(count, TokenType::Normal);
  if (!value->is_array() || value->element_type() != gguf::ValueType::INT32) {
    fail("{}: key '{}' is not an array of int32", file.path(), key);
  }
  const std::vector<int32_t> raw = value->array<int32_t>();
  if (raw.size() < count) fail("{}: key '{}' has {} items for {} tokens", file.path(), key, raw.size(), count);
  std::vector<TokenType> types(count);
  for (size_t i = 0; i < count; ++i) {
    const bool known = raw[i] >= 0 && raw[i] <= static_cast<int32_t>(TokenType::Byte);
    types[i] = known ? static_cast<TokenType>(raw[i]) : TokenType::Undefined;
  }
  return types;
}

// A token id key; absent or out of range (files write 0xFFFFFFFF for "none") gives `fallback` if that is in
// range, else kNoToken.
int32_t read_token_id(const gguf::File& file, std::string_view key, int32_t fallback, int32_t n_vocab) {
  const int64_t id = file.has(key) ? file.get_int(key) : fallback;
  return id >= 0 && id < n_vocab ? static_cast<int32_t>(id) : kNoToken;
}

bool read_flag(const gguf::File& file, std::string_view key, bool fallback) {
  return file.has(key) ? file.get<bool>(key) : fallback;
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  for (size_t at = text.find(from); at != std::string_view::npos; at = text.find(from)) {
    out += text.substr(0, at);
    out += to;
    text.remove_prefix(at + from.size());
  }
  out += text;
  return out;
}

}  // namespace

Tokenizer::Tokenizer(const gguf::File& file) : vocab_(std::make_unique<Vocab>()) {
  const auto model = file.get<std::string_view>("tokenizer.ggml.model");
  const auto pre = file.has("tokenizer.ggml.pre") ? file.get<std::string_view>("tokenizer.ggml.pre") : "";
  if (model == "llama") {
    kind_ = TokenizerKind::SentencePiece;
  } else if (model == "gpt2") {
    kind_ = TokenizerKind::BytePairEncoding;
  } else {
    fail("{}: unsupported tokenizer model '{}' (tokenizer.ggml.model)", file.path(), model);
  }

  const auto& texts = read_strings(file, "tokenizer.ggml.tokens");
  if (texts.empty() || texts.size() > static_cast<size_t>(INT32_MAX)) {
    fail("{}: tokenizer.ggml.tokens has {} tokens", file.path(), texts.size());
  }
  Vocab& vocab = *vocab_;
  vocab.scores = read_scores(file, "tokenizer.ggml.scores", texts.size());
  vocab.types = read_types(file, "tokenizer.ggml.token_type", texts.size());
  vocab.texts.reserve(texts.size());
  vocab.ids.reserve(texts.size());
  for (size_t id = 0; id < texts.size(); ++id) {
    vocab.texts.emplace_back(texts[id]);
    // An empty token can never be matched (and would match everywhere when splitting at special tokens).
    if (!texts[id].empty()) vocab.ids.emplace(texts[id], static_cast<int32_t>(id));
  }
  const int32_t n = vocab.size();

  // Defaults as llama.cpp's for a file that does not say.
  const bool is_spm = kind_ == TokenizerKind::SentencePiece;
  bos_ = read_token_id(file, "tokenizer.ggml.bos_token_id", is_spm ? 1 : kNoToken, n);
  eos_ = read_token_id(file, "tokenizer.ggml.eos_token_id", is_spm ? 2 : kNoToken, n);
  unk_ = read_token_id(file, "tokenizer.ggml.unknown_token_id", is_spm ? 0 : kNoToken, n);
  pad_ = read_token_id(file, "tokenizer.ggml.padding_token_id", kNoToken, n);
  eot_ = read_token_id(file, "tokenizer.ggml.eot_token_id", kNoToken, n);
  eom_ = read_token_id(file, "tokenizer.ggml.eom_token_id", kNoToken, n);

  if (is_spm) {
    spm_ = std::make_unique<SentencePieceEncoder>(vocab, unk_);
    add_space_prefix_ = read_flag(file, "tokenizer.ggml.add_space_prefix", true);
    add_bos_ = read_flag(file, "tokenizer.ggml.add_bos_token", true);
  } else {
    const auto& merges = read_strings(file, "tokenizer.ggml.merges");
    bpe_ = std::make_unique<BytePairEncoder>(vocab, merges, pre);
    add_bos_ = read_flag(file, "tokenizer.ggml.add_bos_token", bpe_->pre_tokenizer().adds_bos_by_default());
  }
  add_eos_ = read_flag(file, "tokenizer.ggml.add_eos_token", false);
  if (add_bos_ && bos_ == kNoToken) fail("{}: the tokenizer adds BOS but has no BOS token", file.path());
  if (add_eos_ && eos_ == kNoToken) fail("{}: the tokenizer adds EOS but has no EOS token", file.path());

  for (std::string_view text : kEndOfGenerationTexts) {
    const int32_t id = vocab.find(text);
    if (id == kNoToken) continue;
    end_of_generation_.push_back(id);
    if (eot_ == kNoToken && text != "<|eom_id|>") eot_ = id;
  }
  for (int32_t id : {eos_, eot_, eom_}) {
    if (id != kNoToken) end_of_generation_.push_back(id);
  }
  std::sort(end_of_generation_.begin(), end_of_generation_.end());
  end_of_generation_.erase(std::unique(end_of_generation_.begin(), end_of_generation_.end()),
                           end_of_generation_.end());

  for (int32_t id = 0; id < n; ++id) {
    const TokenType type = vocab.types[id];
    const bool is_special = type == TokenType::Control || type == TokenType::UserDefined || type == TokenType::Unknown;
    if (is_special && !vocab.texts[id].empty()) {
      special_tokens_.push_back(id);
    }
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](int32_t a, int32_t b) {
    return vocab.texts[a].size() > vocab.texts[b].size();
  });

  if (const gguf::Value* chat_template = file.find("tokenizer.chat_template")) {
    if (chat_template->type() != gguf::ValueType::STRING) {
      fail("{}: key 'tokenizer.chat_template' is not a string", file.path());
    }
    chat_template_ = chat_template->str();
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

int32_t Tokenizer::n_vocab() const { return vocab_->size(); }

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::binary_search(end_of_generation_.begin(), end_of_generation_.end(), id);
}

int32_t Tokenizer::token_id(std::string_view text) const { return vocab_->find(text); }

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_->size()) fail("token id {} is out of range (vocabulary of {})", id, vocab_->size());
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return vocab_->texts[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return vocab_->types[id];
}

// Cuts the text at special tokens written in it, as llama.cpp's tokenizer_st_partition: the longest token
// first, each splitting all text fragments left by the longer ones.
std::vector<Tokenizer::Fragment> Tokenizer::split_special_tokens(std::string_view text, bool parse_special) const {
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({text, kNoToken});
  std::vector<Fragment> next;
  for (int32_t special : special_tokens_) {
    const TokenType type = vocab_->types[special];
    if (!parse_special && type != TokenType::UserDefined) continue;
    const std::string& token_text = vocab_->texts[special];
    next.clear();
    for (const Fragment& fragment : fragments) {
      if (fragment.token != kNoToken) {
        next.push_back(fragment);
        continue;
      }
      std::string_view rest = fragment.text;
      for (size_t at = rest.find(token_text); at != std::string_view::npos; at = rest.find(token_text)) {
        if (at > 0) next.push_back({rest.substr(0, at), kNoToken});
        next.push_back({{}, special});
        rest.remove_prefix(at + token_text.size());
      }
      if (!rest.empty()) next.push_back({rest, kNoToken});
    }
    fragments.swap(next);
  }
  return fragments;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> ids;
  if (add_special && add_bos_) ids.push_back(bos_);

  // SentencePiece puts a space in front of the text, and again after each special token, as llama.cpp does.
  bool after_special = true;
  for (const Fragment& fragment : split_special_tokens(text, parse_special)) {
    if (fragment.token != kNoToken) {
      ids.push_back(fragment.token);
      after_special = true;
    } else if (spm_) {
      const std::string_view prefix = add_space_prefix_ && after_special ? " " : "";
      spm_->encode(replace_all(std::string(prefix) + std::string(fragment.text), " ", kEscapedSpace), ids);
      after_special = false;
    } else {
      bpe_->encode(fragment.text, ids);
    }
  }

  if (add_special && add_eos_) ids.push_back(eos_);
  return ids;
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  check_id(id);
  const std::string& text = vocab_->texts[id];
  switch (vocab_->types[id]) {
    case TokenType::Normal:
      return bpe_ ? BytePairEncoder::decode_token_text(text) : replace_all(text, kEscapedSpace, " ");
    case TokenType::Byte: {
      // "<0xNN>"; anything else marked as a byte token is taken as text.
      unsigned value = 0;
      const bool is_hex_byte = text.size() == 6 && text.starts_with("<0x") && text.ends_with(">") &&
                               std::from_chars(text.data() + 3, text.data() + 5, value, 16).ptr == text.data() + 5;
      return is_hex_byte ? std::string(1, static_cast<char>(value)) : text;
    }
    case TokenType::UserDefined:
      return text;
    case TokenType::Control:
    case TokenType::Unknown:
      return render_special ? text : std::string();
    case TokenType::Unused:
    case TokenType::Undefined:
      break;
  }
  return {};
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string text;
  bool strip_prefix_space = add_space_prefix_;
  for (int32_t id : ids) {
    std::string piece = token_to_piece(id, render_special);
    if (strip_prefix_space && !piece.empty()) {
      if (piece[0] == ' ') piece.erase(0, 1);
      strip_prefix_space = false;
    }
    text += piece;
  }
  return text;
}

std::string Detokenizer::push(int32_t id) {
  pending_ += tokenizer_.token_to_piece(id, render_special_);

  // Hold back the start of a character whose remaining bytes may come with the next tokens: a valid but
  // truncated character beginning within the last three bytes.
  size_t complete = pending_.size();
  for (size_t start = pending_.size(); start > 0 && pending_.size() - start < 3;) {
    --start;
    if ((static_cast<uint8_t>(pending_[start]) & 0xC0) != 0x80) {  // not a continuation byte
      if (utf8::read_prefix(std::string_view(pending_).substr(start)).kind == utf8::Prefix::Kind::Truncated) {
        complete = start;
      }
      break;
    }
  }
  std::string text = utf8::sanitize(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return text;
}

std::string Detokenizer::flush() {
  std::string text = utf8::sanitize(pending_);
  pending_.clear();
  return text;
}

}  // namespace rf
