#include "cli/file_type.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "util/error.h"

namespace rf::cli {
namespace {

struct FileTypeName {
  uint32_t id;
  std::string_view name;
};

// llama.h's enum llama_ftype; the numbers it retired (4-6, 33-35) are absent.
constexpr std::array kFileTypeNames = {
    FileTypeName{0, "ALL_F32"},          FileTypeName{1, "MOSTLY_F16"},       FileTypeName{2, "MOSTLY_Q4_0"},
    FileTypeName{3, "MOSTLY_Q4_1"},      FileTypeName{7, "MOSTLY_Q8_0"},      FileTypeName{8, "MOSTLY_Q5_0"},
    FileTypeName{9, "MOSTLY_Q5_1"},      FileTypeName{10, "MOSTLY_Q2_K"},     FileTypeName{11, "MOSTLY_Q3_K_S"},
    FileTypeName{12, "MOSTLY_Q3_K_M"},   FileTypeName{13, "MOSTLY_Q3_K_L"},   FileTypeName{14, "MOSTLY_Q4_K_S"},
    FileTypeName{15, "MOSTLY_Q4_K_M"},   FileTypeName{16, "MOSTLY_Q5_K_S"},   FileTypeName{17, "MOSTLY_Q5_K_M"},
    FileTypeName{18, "MOSTLY_Q6_K"},     FileTypeName{19, "MOSTLY_IQ2_XXS"},  FileTypeName{20, "MOSTLY_IQ2_XS"},
    FileTypeName{21, "MOSTLY_Q2_K_S"},   FileTypeName{22, "MOSTLY_IQ3_XS"},   FileTypeName{23, "MOSTLY_IQ3_XXS"},
    FileTypeName{24, "MOSTLY_IQ1_S"},    FileTypeName{25, "MOSTLY_IQ4_NL"},   FileTypeName{26, "MOSTLY_IQ3_S"},
    FileTypeName{27, "MOSTLY_IQ3_M"},    FileTypeName{28, "MOSTLY_IQ2_S"},    FileTypeName{29, "MOSTLY_IQ2_M"},
    FileTypeName{30, "MOSTLY_IQ4_XS"},   FileTypeName{31, "MOSTLY_IQ1_M"},    FileTypeName{32, "MOSTLY_BF16"},
    FileTypeName{36, "MOSTLY_TQ1_0"},    FileTypeName{37, "MOSTLY_TQ2_0"},    FileTypeName{38, "MOSTLY_MXFP4_MOE"},
};

// The file types used below, by their llama.cpp numbers.
enum FileType : uint32_t {
  ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_Q4_0 = 2, MOSTLY_Q4_1 = 3, MOSTLY_Q8_0 = 7, MOSTLY_Q5_0 = 8,
  MOSTLY_Q5_1 = 9, MOSTLY_Q2_K = 10, MOSTLY_Q3_K_S = 11, MOSTLY_Q3_K_M = 12, MOSTLY_Q3_K_L = 13,
  MOSTLY_Q4_K_S = 14, MOSTLY_Q4_K_M = 15, MOSTLY_Q5_K_S = 16, MOSTLY_Q5_K_M = 17, MOSTLY_Q6_K = 18,
  MOSTLY_IQ4_NL = 25, MOSTLY_IQ4_XS = 30, MOSTLY_BF16 = 32,
};

// Pure Q3_K / Q4_K / Q5_K (every weight one type, as llama-quantize --pure makes them) carry the file type
// llama.cpp's loader guesses for a file of mostly that type.
constexpr std::array kTargets = {
    QuantTarget{"F32", ALL_F32, TensorType::F32, false},
    QuantTarget{"F16", MOSTLY_F16, TensorType::F16, false},
    QuantTarget{"BF16", MOSTLY_BF16, TensorType::BF16, false},
    QuantTarget{"Q4_0", MOSTLY_Q4_0, TensorType::Q4_0, true},
    QuantTarget{"Q4_1", MOSTLY_Q4_1, TensorType::Q4_1, true},
    QuantTarget{"Q5_0", MOSTLY_Q5_0, TensorType::Q5_0, true},
    QuantTarget{"Q5_1", MOSTLY_Q5_1, TensorType::Q5_1, true},
    QuantTarget{"Q8_0", MOSTLY_Q8_0, TensorType::Q8_0, true},
    QuantTarget{"Q2_K", MOSTLY_Q2_K, TensorType::Q2_K, true},
    QuantTarget{"Q3_K", MOSTLY_Q3_K_M, TensorType::Q3_K, false},
    QuantTarget{"Q4_K", MOSTLY_Q4_K_M, TensorType::Q4_K, false},
    QuantTarget{"Q5_K", MOSTLY_Q5_K_M, TensorType::Q5_K, false},
    QuantTarget{"Q6_K", MOSTLY_Q6_K, TensorType::Q6_K, true},
    QuantTarget{"IQ4_NL", MOSTLY_IQ4_NL, TensorType::IQ4_NL, true},
    QuantTarget{"IQ4_XS", MOSTLY_IQ4_XS, TensorType::IQ4_XS, true},
    QuantTarget{"Q3_K_S", MOSTLY_Q3_K_S, TensorType::Q3_K, true},
    QuantTarget{"Q3_K_M", MOSTLY_Q3_K_M, TensorType::Q3_K, true},
    QuantTarget{"Q3_K_L", MOSTLY_Q3_K_L, TensorType::Q3_K, true},
    QuantTarget{"Q4_K_S", MOSTLY_Q4_K_S, TensorType::Q4_K, true},
    QuantTarget{"Q4_K_M", MOSTLY_Q4_K_M, TensorType::Q4_K, true},
    QuantTarget{"Q5_K_S", MOSTLY_Q5_K_S, TensorType::Q5_K, true},
    QuantTarget{"Q5_K_M", MOSTLY_Q5_K_M, TensorType::Q5_K, true},
};

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

// The N of "blk.N.", or -1.
int64_t layer_of(std::string_view name) {
  if (!name.starts_with("blk.")) return -1;
  int64_t layer = 0;
  size_t i = 4;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) layer = layer * 10 + (name[i] - '0');
  return i > 4 && i < name.size() && name[i] == '.' ? layer : -1;
}

// llama.cpp gives these layers more bits: the first and last eighth and every third layer between.
bool use_more_bits(int64_t layer, int64_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

bool is_block_quantized(TensorType type) { return tensor_type_info(type).block_elements > 1; }

// llama.cpp's llama_tensor_get_type_impl for the file types above and a dense (not mixture-of-experts) model.
TensorType mixed_type(uint32_t ftype, TensorType type, const ModelFacts& facts, std::string_view name,
                      uint64_t row_length) {
  const int64_t layer = layer_of(name);
  const int64_t n_layers = facts.n_layers;
  const bool is_output = name == "output.weight";
  const bool is_token_embd = name == "token_embd.weight";
  if (is_output || (facts.tied_embeddings && is_token_embd)) {
    if (row_length % tensor_type_info(type).block_elements != 0) return TensorType::Q8_0;
    return type == TensorType::Q8_0 ? type : TensorType::Q6_K;
  }
  if (is_token_embd) return type;
  if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight")) {
    if (ftype == MOSTLY_Q2_K) type = facts.n_gqa >= 4 ? TensorType::Q4_K : TensorType::Q3_K;
    else if (ftype == MOSTLY_Q3_K_M) type = layer < 2 ? TensorType::Q5_K : TensorType::Q4_K;
    else if (ftype == MOSTLY_Q3_K_L) type = TensorType::Q5_K;
    else if ((ftype == MOSTLY_IQ4_NL || ftype == MOSTLY_IQ4_XS) && facts.n_gqa >= 4) type = TensorType::Q5_K;
    else if ((ftype == MOSTLY_Q4_K_M || ftype == MOSTLY_Q5_K_M) && use_more_bits(layer, n_layers)) type = TensorType::Q6_K;
    else if (ftype == MOSTLY_Q4_K_S && layer < 4) type = TensorType::Q5_K;
    // Llama 70B shares each attn_v among 8 heads: the tensor is small and worth more bits.
    const bool llama_70b = facts.architecture == "llama" && n_layers == 80 && facts.n_gqa > 1;
    if (llama_70b && (type == TensorType::Q3_K || type == TensorType::Q4_K)) type = TensorType::Q5_K;
    return type;
  }
  if (contains(name, "ffn_down")) {
    if (ftype == MOSTLY_Q2_K) return TensorType::Q3_K;
    if (ftype == MOSTLY_Q3_K_M) return layer < n_layers / 16 ? TensorType::Q5_K : TensorType::Q4_K;
    if (ftype == MOSTLY_Q3_K_L) return TensorType::Q5_K;
    if ((ftype == MOSTLY_Q4_K_M || ftype == MOSTLY_Q5_K_M) && use_more_bits(layer, n_layers)) return TensorType::Q6_K;
    if ((ftype == MOSTLY_IQ4_NL || ftype == MOSTLY_IQ4_XS) && layer < n_layers / 8) return TensorType::Q5_K;
    if (ftype == MOSTLY_Q4_K_S && layer < n_layers / 8) return TensorType::Q5_K;
    return type;
  }
  if (contains(name, "attn_output.weight")) {
    if (ftype == MOSTLY_Q2_K) return TensorType::Q3_K;
    if (ftype == MOSTLY_Q3_K_M) return TensorType::Q4_K;
    if (ftype == MOSTLY_Q3_K_L) return TensorType::Q5_K;
    return type;
  }
  return type;
}

// llama.cpp's tensor_type_fallback: a type of 32-element blocks for rows that are not whole 256-element
// blocks. Where even that does not fit, llama.cpp uses F16 (it refuses 32-element types outright; F16 is the
// useful answer there too).
TensorType fallback_type(TensorType type, uint64_t row_length) {
  if (row_length % tensor_type_info(type).block_elements == 0) return type;
  TensorType fallback = TensorType::F16;
  switch (type) {
    case TensorType::IQ4_XS: fallback = TensorType::IQ4_NL; break;
    case TensorType::Q2_K: case TensorType::Q3_K: fallback = TensorType::Q4_0; break;
    case TensorType::Q4_K: fallback = TensorType::Q5_0; break;
    case TensorType::Q5_K: fallback = TensorType::Q5_1; break;
    case TensorType::Q6_K: fallback = TensorType::Q8_0; break;
    default: break;
  }
  return row_length % tensor_type_info(fallback).block_elements == 0 ? fallback : TensorType::F16;
}

}  // namespace

std::string_view file_type_name(uint32_t file_type) {
  auto it = std::ranges::find(kFileTypeNames, file_type, &FileTypeName::id);
  return it == kFileTypeNames.end() ? std::string_view{} : it->name;
}

const QuantTarget& find_quant_target(std::string_view name) {
  auto equal_ignoring_case = [](std::string_view a, std::string_view b) {
    return std::ranges::equal(a, b, [](char x, char y) { return std::toupper(x) == std::toupper(y); });
  };
  for (const QuantTarget& target : kTargets)
    if (equal_ignoring_case(target.name, name)) return target;
  fail("unknown type '{}' (known: {})", name, quant_target_names());
}

std::string quant_target_names() {
  std::vector<std::string_view> names;
  for (const QuantTarget& target : kTargets) names.push_back(target.name);
  return fmt::format("{}", fmt::join(names, " "));
}

ModelFacts model_facts(const gguf::File& file) {
  ModelFacts facts;
  facts.architecture = file.architecture();
  auto integer = [&](const std::string& key) -> int64_t {
    const gguf::Value* value = file.find(key);
    return value && value->is_integer() ? value->to_int() : 0;
  };
  facts.n_layers = integer(facts.architecture + ".block_count");
  const int64_t n_head = integer(facts.architecture + ".attention.head_count");
  const int64_t n_head_kv = integer(facts.architecture + ".attention.head_count_kv");
  facts.n_gqa = n_head > 0 && n_head_kv > 0 ? n_head / n_head_kv : 1;
  facts.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  return facts;
}

bool is_quantizable(std::string_view name, uint32_t n_dims) {
  return n_dims >= 2 && name.ends_with("weight") && !contains(name, "_norm.weight") &&
         !contains(name, "ffn_gate_inp.weight");
}

TensorType choose_tensor_type(const QuantTarget& target, const ModelFacts& facts, std::string_view name,
                              uint64_t row_length) {
  if (!is_block_quantized(target.default_type)) return target.default_type;
  TensorType type = target.default_type;
  if (target.mixed) type = mixed_type(target.file_type, type, facts, name, row_length);
  return fallback_type(type, row_length);
}

void set_file_type(gguf::Writer& writer, const QuantTarget& target) {
  writer.set<uint32_t>("general.quantization_version", 2);
  writer.set<uint32_t>("general.file_type", target.file_type);
}

}  // namespace rf::cli
