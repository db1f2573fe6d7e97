// Tokenizers read from a GGUF file's tokenizer.ggml.* keys, behaving like llama.cpp's llama-vocab:
// SentencePiece-style ("llama": score-driven merging, byte fallback) and byte-level BPE ("gpt2": a regex
// pre-tokenizer chosen by tokenizer.ggml.pre, then merge ranks).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"

namespace rf {

inline constexpr int32_t kNoToken = -1;

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

enum class TokenizerKind { SentencePiece, BytePairEncoding };

struct Vocab;
class SentencePieceEncoder;
class BytePairEncoder;

class Tokenizer {
 public:
  // Reads the tokenizer of `file`; an unsupported model or pre-tokenizer, or missing or inconsistent keys,
  // is an rf::Error naming the file and the key. The tokenizer copies what it needs: `file` may close after.
  explicit Tokenizer(const gguf::File& file);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Text to token ids. add_special: BOS/EOS as the model's add_bos/add_eos flags say. parse_special: control
  // tokens written in the text (e.g. "<|eot_id|>") become those tokens, longest first; otherwise they are
  // tokenized as text. User-defined tokens are always recognized, as in llama.cpp. Any bytes are accepted.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // The bytes a token stands for. Control and unknown tokens (BOS, EOS, <unk>...) give their text only with
  // render_special, otherwise nothing; unused tokens give nothing. An id out of range is an rf::Error.
  std::string token_to_piece(int32_t id, bool render_special = false) const;

  // The bytes of a whole sequence: the inverse of encode. For SentencePiece the space that encode puts in
  // front of the text is removed again from the first piece.
  std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

  TokenizerKind kind() const { return kind_; }
  int32_t n_vocab() const;
  // Special tokens; kNoToken when the model has none.
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t unk() const { return unk_; }
  int32_t pad() const { return pad_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // EOS, EOT/EOM, and end-of-turn tokens recognized by their text (<|eot_id|>, <|im_end|>, <|end|>,
  // <end_of_turn>, <|endoftext|>...) as llama.cpp does when the file does not name them.
  bool is_end_of_generation(int32_t id) const;
  const std::vector<int32_t>& end_of_generation_tokens() const { return end_of_generation_; }

  // The id of the token whose text is exactly `text` (any type), or kNoToken.
  int32_t token_id(std::string_view text) const;
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // tokenizer.chat_template (a Jinja template), empty when the file has none.
  const std::string& chat_template() const { return chat_template_; }

 private:
  struct Fragment {
    std::string_view text;  // raw text, when token is kNoToken
    int32_t token;
  };
  std::vector<Fragment> split_special_tokens(std::string_view text, bool parse_special) const;
  void check_id(int32_t id) const;

  TokenizerKind kind_;
  std::unique_ptr<Vocab> vocab_;
  std::unique_ptr<SentencePieceEncoder> spm_;
  std::unique_ptr<BytePairEncoder> bpe_;
  std::vector<int32_t> special_tokens_;       // control, user-defined and unknown tokens, longest text first
  std::vector<int32_t> end_of_generation_;    // sorted
  int32_t bos_ = kNoToken, eos_ = kNoToken, eot_ = kNoToken, eom_ = kNoToken, unk_ = kNoToken, pad_ = kNoToken;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  std::string chat_template_;
};

// Streams generated tokens as text. Each push returns the text that became complete: a character whose bytes
// are spread over several tokens comes out whole once its last byte arrives. The output is always valid
// UTF-8 (bytes that cannot form a character come out as U+FFFD). Pieces are emitted as they are: a leading
// space is kept, since generated text continues a prompt.
class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer& tokenizer, bool render_special = false)
      : tokenizer_(tokenizer), render_special_(render_special) {}
  std::string push(int32_t id);
  // What is still held back (the start of a character the stream ended in), as U+FFFD; resets the stream.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool render_special_;
  std::string pending_;
};

}  // namespace rf
