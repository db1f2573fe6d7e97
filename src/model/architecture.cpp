#include "model/architecture.h"

#include <array>

namespace rf::model {
namespace {

// What llama.cpp's graph builders do for each family (src/llama-model.cpp), in this table's terms.
constexpr std::array kArchitectures = {
    Architecture{.name = "llama", .may = kQkvBias | kOutputBias},
    Architecture{.name = "qwen2", .rope_style = RopeStyle::NeoX, .needs = kQkvBias},
    Architecture{.name = "qwen3", .rope_style = RopeStyle::NeoX, .needs = kQkNorm},
    Architecture{.name = "gemma", .rope_style = RopeStyle::NeoX, .ffn = FfnKind::GeluGated, .scale_embeddings = true},
    Architecture{.name = "gemma2",
                 .rope_style = RopeStyle::NeoX,
                 .ffn = FfnKind::GeluGated,
                 .scale_embeddings = true,
                 .default_attention_cap = 50.0f,
                 .default_logits_cap = 30.0f,
                 .default_sliding_pattern = 2,
                 .default_sliding_window = 4096,
                 .needs = kPostNorms},
    Architecture{.name = "gemma3",
                 .rope_style = RopeStyle::NeoX,
                 .ffn = FfnKind::GeluGated,
                 .scale_embeddings = true,
                 .default_sliding_pattern = 6,
                 .needs = kQkNorm | kPostNorms},
    Architecture{.name = "phi2",
                 .norm = NormKind::Layer,
                 .rope_style = RopeStyle::NeoX,
                 .ffn = FfnKind::Gelu,
                 .parallel_blocks = true,
                 .needs = kQkvBias | kOutputBias | kFfnBias | kNormBias | kLogitsBias},
    Architecture{.name = "phi3", .rope_style = RopeStyle::NeoX},
    Architecture{.name = "gpt2",
                 .norm = NormKind::Layer,
                 .positions = Positions::Learned,
                 .ffn = FfnKind::Gelu,
                 .needs = kQkvBias | kOutputBias | kFfnBias | kNormBias | kPositionEmbd},
    Architecture{.name = "glm4", .needs = kPostNorms, .may = kQkvBias},
    Architecture{.name = "chatglm", .may = kQkvBias},
};

}  // namespace

std::span<const Architecture> architectures() { return kArchitectures; }

const Architecture* find_architecture(std::string_view name) {
  for (const Architecture& architecture : kArchitectures)
    if (architecture.name == name) return &architecture;
  return nullptr;
}

std::string supported_architecture_names() {
  std::string names;
  for (const Architecture& architecture : kArchitectures) {
    if (!names.empty()) names += ", ";
    names += architecture.name;
  }
  return names;
}

}  // namespace rf::model
