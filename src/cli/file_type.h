// llama.cpp's file types (general.file_type) and its choice of a type per tensor, shared by `inspect` (which
// names the file type), `quantize` and `gen-model` (which pick each tensor's type exactly as llama-quantize
// does, so their files hold the same types as llama.cpp's for the same TYPE).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "gguf/tensor_type.h"

namespace rf::cli {

// The LLAMA_FTYPE name of a general.file_type value without its prefix ("MOSTLY_Q4_K_M" for 15); empty for
// numbers llama.cpp does not define.
std::string_view file_type_name(uint32_t file_type);

// What the TYPE argument of `quantize` and `gen-model` asks for.
struct QuantTarget {
  std::string_view name;
  uint32_t file_type;       // stored as general.file_type
  TensorType default_type;  // of most 2-D weights
  bool mixed;               // llama.cpp's per-tensor choices apply; otherwise every weight is default_type
};
// Case-insensitive; an unknown name is an Error that lists the known ones.
const QuantTarget& find_quant_target(std::string_view name);
std::string quant_target_names();

// What llama.cpp's per-tensor choices depend on besides the tensor itself.
struct ModelFacts {
  std::string architecture;
  int64_t n_layers = 0;
  int64_t n_gqa = 1;             // attention heads per KV head
  bool tied_embeddings = false;  // no output.weight: token_embd doubles as the output matrix
};
ModelFacts model_facts(const gguf::File& file);

// Whether a tensor is converted at all: weight matrices are, norms, biases and other 1-D tensors keep their type.
bool is_quantizable(std::string_view name, uint32_t n_dims);

// The type llama-quantize gives a quantizable tensor with rows of `row_length` elements: the target's default
// type, raised for sensitive tensors by the mixes (output.weight Q6_K, attn_v and ffn_down on some layers, ...),
// then replaced by a type of smaller blocks when a row is not a whole number of blocks.
TensorType choose_tensor_type(const QuantTarget& target, const ModelFacts& facts, std::string_view name,
                              uint64_t row_length);

// Sets general.file_type and general.quantization_version (ggml's block format version, 2) as llama.cpp does.
void set_file_type(gguf::Writer& writer, const QuantTarget& target);

}  // namespace rf::cli
