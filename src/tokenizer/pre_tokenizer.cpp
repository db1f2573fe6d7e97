#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <string>

#include "util/error.h"

namespace rf {

namespace {

// The regexes of llama.cpp's pre-tokenizer list (llm_tokenizer_bpe), in their original tokenizer.json form
// where llama.cpp had to rewrite them for std::regex: PCRE2 runs them as written.

// GPT-2: contractions, letters, digits, other symbols, each optionally after one space; whitespace runs.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// Llama 3 (tiktoken cl100k style): digits in groups of up to three, newlines kept apart.
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+)"
    R"(|\s+(?!\S)|\s+)";

// Qwen2: like Llama 3 with single digits.
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-4o (o200k): words split at case changes, with trailing contractions.
constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Han, Hangul and other CJK runs as DeepSeek's tokenizers define them.
constexpr std::string_view kDeepSeekCjk = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

// DeepSeek LLM: cased letters of the scripts that have case, as the Unicode ranges of its tokenizer.json.
constexpr std::string_view kDeepSeekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
    R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";

// Falcon-era and "default" prefixes that cut punctuation and digit runs before the GPT-2 rules.
constexpr std::string_view kPunctuationRuns = R"([\p{P}\$\+<=>\^~\|`]+)";
constexpr std::string_view kPunctuationRunsNoBacktick = R"([\p{P}\$\+<=>\^~\|]+)";

// Bloom-style: words are runs of anything but whitespace and sentence punctuation.
constexpr std::string_view kBloom = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";

struct Family {
  std::vector<std::string_view> names;  // values of tokenizer.ggml.pre
  std::vector<std::string_view> regexes;
  bool ignore_merges = false;
  bool adds_bos_by_default = false;
};

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {{"default", ""}, {kPunctuationRunsNoBacktick, kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       {kLlama3}, true, true},
      {{"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"}, {kLlama3}},
      {{"deepseek-llm"},
       {R"([\r\n])", kDeepSeekLetters,
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)", R"(\s+$)",
        kDeepSeekCjk, R"(\p{N}+)"}},
      {{"deepseek-coder"}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepSeekCjk, R"(\p{N})"}},
      {{"deepseek-v3", "hunyuan-dense"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
        R"(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"falcon"}, {kPunctuationRuns, kGpt2, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2}},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
        "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "trillion",
        "granite-docling", "exaone4"},
       {kGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan", "grok-2", "solar-open"}, {kQwen2}},
      {{"qwen35"},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*)"
        R"(|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kBloom}},
      {{"viking"}, {kBloom, R"(\p{N})"}},
      {{"tekken"},
       {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
        R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
        R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       true, true},
      {{"chameleon"},
       {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", R"(([\t\n]|    |  ))", R"(\p{N})",
        R"([\p{P}!-/:-@\[-`{-~])", kGpt2},
       false, true},
      {{"gpt-4o", "llama4", "minimax-m2", "kanana2"}, {kGpt4o}},
      {{"superbpe"}, {R"(\p{N}+)", R"((?=(\d{3})+(?!\d)))"}},
      {{"bailingmoe", "bailingmoe2", "llada-moe"},
       {R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n])"
        R"(|\s+(?!\S)|\s+)"}},
      {{"seed-coder"},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+)"
        R"(|\s+(?!\S)|\s+)"}},
      {{"minicpm5"},
       {R"(\p{N}{1,3})",
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+)"
        R"(|\s+(?!\S)|\s+)"},
       true},
  };
  return table;
}

// Per-call PCRE2 match state, so that one PreTokenizer serves several threads. The JIT stack is larger than
// PCRE2's 32 KiB default because group repeats (tekken, gpt-4o) use stack per character of a word.
class MatchState {
 public:
  MatchState()
      : data_(pcre2_match_data_create(1, nullptr)),
        context_(pcre2_match_context_create(nullptr)),
        jit_stack_(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
    if (!data_ || !context_) throw std::bad_alloc();
    pcre2_jit_stack_assign(context_, nullptr, jit_stack_);  // a null stack (no JIT) keeps the default
  }
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;

  // The next match of `regex` in `subject` at or after `offset` as [begin, end), or false when there is none.
  bool find(const pcre2_code* regex, std::string_view subject, size_t offset, uint32_t options, size_t& begin,
            size_t& end) {
    const int rc = pcre2_match(regex, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), offset,
                               options, data_, context_);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof message);
      fail("pre-tokenizer regex failed on a {}-byte word: {}", subject.size(), reinterpret_cast<char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data_);
    begin = ovector[0];
    end = ovector[1];
    return true;
  }

 private:
  pcre2_match_data* data_;
  pcre2_match_context* context_;
  pcre2_jit_stack* jit_stack_;
};

// Appends the matches of `regex` in `piece` and the gaps between them.
void split_piece(const pcre2_code* regex, std::string_view piece, MatchState& state,
                 std::vector<std::string_view>& out) {
  size_t gap_begin = 0;
  size_t offset = 0;
  uint32_t options = 0;
  size_t begin = 0, end = 0;
  while (offset <= piece.size() && state.find(regex, piece, offset, options, begin, end)) {
    if (begin > gap_begin) out.push_back(piece.substr(gap_begin, begin - gap_begin));
    if (end > begin) out.push_back(piece.substr(begin, end - begin));
    gap_begin = end;
    offset = end;
    // After an empty match (a lookahead-only regex marks a cut), look for a non-empty one at the same place
    // or any match further on, so that the search moves forward.
    options = begin == end ? PCRE2_NOTEMPTY_ATSTART : 0;
  }
  if (gap_begin < piece.size()) out.push_back(piece.substr(gap_begin));
}

}  // namespace

void PreTokenizer::FreeCode::operator()(pcre2_real_code_8* code) const { pcre2_code_free(code); }

PreTokenizer::PreTokenizer(std::string_view name) {
  const auto& table = families();
  const auto family = std::find_if(table.begin(), table.end(), [&](const Family& f) {
    return std::find(f.names.begin(), f.names.end(), name) != f.names.end();
  });
  if (family == table.end()) fail("unknown pre-tokenizer '{}' (tokenizer.ggml.pre)", name);
  ignore_merges_ = family->ignore_merges;
  adds_bos_by_default_ = family->adds_bos_by_default;

  // UTF: match characters, not bytes. UCP: \s, \d and friends follow Unicode. MATCH_INVALID_UTF: invalid
  // bytes simply never match instead of failing the match. DOLLAR_ENDONLY: '$' means the end of the piece,
  // as in the ECMAScript regexes of llama.cpp.
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
  for (std::string_view pattern : family->regexes) {
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                                     &error, &error_offset, nullptr);
    if (!code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      fail("pre-tokenizer '{}': regex does not compile at offset {}: {}", name, error_offset,
           reinterpret_cast<char*>(message));
    }
    regexes_.emplace_back(code);
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT support, matching falls back to the interpreter
  }
}

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string_view> PreTokenizer::known_names() {
  std::vector<std::string_view> names;
  for (const Family& family : families()) names.insert(names.end(), family.names.begin(), family.names.end());
  return names;
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  MatchState state;
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> next;
  for (const auto& regex : regexes_) {
    next.clear();
    for (std::string_view piece : pieces) split_piece(regex.get(), piece, state, next);
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace rf
