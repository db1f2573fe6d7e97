// The regex pre-tokenizers of byte-level BPE models, selected by tokenizer.ggml.pre (internal to the module).
#pragma once
#include <memory>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace rf {

class PreTokenizer {
 public:
  // The pre-tokenizer llama.cpp uses for `name` ("llama-bpe", "gpt-2", "qwen2"...; "" means "default").
  // An unknown name is an rf::Error.
  explicit PreTokenizer(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Cuts text into words: each regex in turn splits every piece so far into its matches and the gaps between
  // them, as llama.cpp's unicode_regex_split does. Bytes that are not valid UTF-8 never match and end up in
  // gaps, so they survive as words of their own. The words are views into `text` and cover it exactly.
  std::vector<std::string_view> split(std::string_view text) const;

  // Every name the constructor accepts.
  static std::vector<std::string_view> known_names();

  // A word that is a token as a whole becomes that token without merging (Llama 3 and a few others).
  bool ignore_merges() const { return ignore_merges_; }
  // Whether models of this family add BOS when the file does not say.
  bool adds_bos_by_default() const { return adds_bos_by_default_; }

 private:
  struct FreeCode {
    void operator()(pcre2_real_code_8* code) const;
  };
  std::vector<std::unique_ptr<pcre2_real_code_8, FreeCode>> regexes_;
  bool ignore_merges_ = false;
  bool adds_bos_by_default_ = false;
};

}  // namespace rf
