#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/residency.h"
#include "error_of.h"
#include "model/execution_plan.h"
#include "model_variant.h"

namespace rf {
namespace {

using model::ModelConfig;
using model::RopeScaling;
using test::error_of;
using test::ModelEdits;
using test::TempModel;

ModelConfig config_of(const std::string& path) { return model::read_config(*gguf::File::open(path)); }

model::ExecutionPlan plan_of(const std::string& path) {
  return model::ExecutionPlan::build(gguf::File::open(path), std::make_shared<cpu::MappedResidency>());
}

// stories260K with edited keys.
TempModel with_keys(ModelEdits::Edit edit) { return TempModel("stories260K", ModelEdits().edit_keys(std::move(edit))); }

TEST(ConfigTest, Stories260K) {
  const ModelConfig c = config_of(test::shared_model("stories260K"));
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.n_ff, 172);
  EXPECT_EQ(c.vocab_size, 512);  // no llama.vocab_size key: from the tokenizer
  EXPECT_EQ(c.context_length, 2048);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_base, 10000.0f);  // no freq_base key: llama.cpp's default
  EXPECT_EQ(c.rope_dims, 8);
  EXPECT_EQ(c.rope_style, model::RopeStyle::Normal);
  EXPECT_EQ(c.rope_scaling, RopeScaling::None);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.heads_per_kv_head(), 2);
}

TEST(ConfigTest, TinyStoriesIsTied) {
  const ModelConfig c = config_of(test::shared_model("TinyStories-656K-Q8_0"));
  EXPECT_EQ(c.n_embd, 128);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_ff, 384);
  EXPECT_EQ(c.vocab_size, 2048);
  EXPECT_EQ(c.context_length, 512);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.rope_dims, 16);
  EXPECT_TRUE(c.tied_embeddings);
  const model::ExecutionPlan plan = plan_of(test::shared_model("TinyStories-656K-Q8_0"));
  EXPECT_EQ(&plan.output().info(), &plan.token_embd().info());
}

TEST(ConfigTest, LlamaTinyRandom) {
  const ModelConfig c = config_of(test::shared_model("llama-2-tiny-random"));
  EXPECT_EQ(c.n_embd, 8);
  EXPECT_EQ(c.n_layers, 1);
  EXPECT_EQ(c.n_heads, 2);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.n_ff, 32);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.context_length, 4096);
  EXPECT_EQ(c.rope_dims, 4);
  EXPECT_FALSE(c.tied_embeddings);
}

TEST(ConfigTest, EverySyntheticModelPlans) {
  for (const char* type : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M",
                           "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS"}) {
    SCOPED_TRACE(type);
    const model::ExecutionPlan plan = plan_of(test::shared_model(std::string("synth-tiny256-") + type));
    const ModelConfig& c = plan.config();
    EXPECT_EQ(c.n_embd, 256);
    EXPECT_EQ(c.n_layers, 4);
    EXPECT_EQ(c.n_heads, 4);
    EXPECT_EQ(c.n_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.n_ff, 768);
    EXPECT_EQ(c.vocab_size, 512);
    EXPECT_EQ(c.rope_dims, 64);
    EXPECT_FALSE(c.tied_embeddings);
    EXPECT_EQ(plan.layers().size(), 4u);
  }
}

std::string arch_model(const std::string& arch) {
  return test::shared_path("arch/models/synth-" + arch + "-Q4_K_M.gguf");
}

TEST(ConfigTest, Gemma2SlidesEveryOtherLayerAndCaps) {
  const ModelConfig c = config_of(arch_model("gemma2"));
  EXPECT_EQ(c.arch->ffn, model::FfnKind::GeluGated);
  EXPECT_EQ(c.rope_style, model::RopeStyle::NeoX);
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_TRUE(c.sliding(0));
  EXPECT_FALSE(c.sliding(1));
  EXPECT_TRUE(c.sliding(2));
  EXPECT_FLOAT_EQ(c.attention_cap, 10.0f);
  EXPECT_FLOAT_EQ(c.logits_cap, 5.0f);
  EXPECT_FLOAT_EQ(c.embedding_scale, 16.0f);  // sqrt(256)
  EXPECT_FLOAT_EQ(c.attention_scale, 0.125f);  // 1 / sqrt(head_dim 64)
  EXPECT_FALSE(c.sliding_layers_rotate_apart());  // one rope base for every layer
}

TEST(ConfigTest, Gemma3SlidingLayersHaveTheirOwnRopeBase) {
  const ModelConfig c = config_of(arch_model("gemma3"));
  EXPECT_TRUE(c.sliding(0));
  EXPECT_TRUE(c.sliding(1));
  EXPECT_FALSE(c.sliding(2));
  EXPECT_FLOAT_EQ(c.rope_base, 1e6f);
  EXPECT_FLOAT_EQ(c.rope_base_sliding, 1e4f);
  EXPECT_TRUE(c.sliding_layers_rotate_apart());
  EXPECT_EQ(c.attention_cap, 0.0f);  // llama.cpp caps Gemma 2 only
  EXPECT_DOUBLE_EQ(c.rope_inverse_frequencies(true, nullptr)[1], std::pow(1e4, -2.0 / 64));
  EXPECT_DOUBLE_EQ(c.rope_inverse_frequencies(false, nullptr)[1], std::pow(1e6, -2.0 / 64));
}

// As llama.cpp: a Gemma 2 file without the window's key slides over 4096 positions; Gemma 3 must have the key.
TEST(ConfigTest, SlidingWindowKeyDefaultsOrIsRequired) {
  const auto without_window = [](const std::string& arch) {
    return TempModel(arch_model(arch), ModelEdits().edit_keys([arch](gguf::Writer& w) {
      w.remove(arch + ".attention.sliding_window");
    }));
  };
  const TempModel gemma2 = without_window("gemma2");
  EXPECT_EQ(config_of(gemma2.path()).sliding_window, 4096);
  const TempModel gemma3 = without_window("gemma3");
  const std::string message = error_of([&] { config_of(gemma3.path()); });
  EXPECT_NE(message.find("gemma3.attention.sliding_window"), std::string::npos) << message;
}

TEST(ConfigTest, PartialRotaryAndLearnedPositions) {
  const ModelConfig phi2 = config_of(arch_model("phi2"));
  EXPECT_EQ(phi2.arch->norm, model::NormKind::Layer);
  EXPECT_EQ(phi2.rope_dims, 32);
  EXPECT_EQ(phi2.head_dim, 64);
  const ModelConfig gpt2 = config_of(arch_model("gpt2"));
  EXPECT_FALSE(gpt2.rotary());
  EXPECT_EQ(gpt2.n_kv_heads, 4);
  EXPECT_TRUE(gpt2.tied_embeddings);
}

TEST(PlanTest, FusedTensorsAreSlicedWithoutCopies) {
  const model::ExecutionPlan phi3 = plan_of(arch_model("phi3"));
  const model::LayerPlan& layer = phi3.layer(1);
  EXPECT_EQ(layer.attn_q.name(), "blk.1.attn_qkv.weight");
  EXPECT_EQ(layer.attn_k.first(), 256);
  EXPECT_EQ(layer.attn_k.rows(), 128);
  EXPECT_EQ(layer.attn_v.first(), 384);
  EXPECT_EQ(layer.attn_v.stored_offset(), 384 * layer.attn_v.row_bytes());
  EXPECT_EQ(layer.ffn_gate.first(), 0);
  EXPECT_EQ(layer.ffn_up.first(), 768);
  EXPECT_EQ(layer.ffn_up.rows(), 768);
  // The loader reads each stored tensor once: qkv, not three slices of it.
  EXPECT_EQ(layer.tensors().size(), 6u);
  const model::ExecutionPlan chatglm = plan_of(arch_model("chatglm"));
  EXPECT_EQ(chatglm.layer(0).attn_v_bias.first(), 384);
  EXPECT_EQ(chatglm.layer(0).attn_v_bias.cols(), 128);
}

TEST(ConfigErrorTest, MissingKeyIsNamed) {
  const TempModel file = with_keys([](gguf::Writer& w) { w.remove("llama.embedding_length"); });
  EXPECT_NE(error_of([&] { config_of(file.path()); }).find("llama.embedding_length"), std::string::npos);
}

TEST(ConfigErrorTest, KvHeadsMustDivideHeads) {
  const TempModel file = with_keys([](gguf::Writer& w) { w.set<uint32_t>("llama.attention.head_count_kv", 3); });
  const std::string message = error_of([&] { config_of(file.path()); });
  EXPECT_NE(message.find("llama.attention.head_count_kv"), std::string::npos) << message;
}

TEST(ConfigErrorTest, ZeroCountIsNamed) {
  const TempModel file = with_keys([](gguf::Writer& w) { w.set<uint32_t>("llama.block_count", 0); });
  const std::string message = error_of([&] { config_of(file.path()); });
  EXPECT_NE(message.find("llama.block_count"), std::string::npos) << message;
}

TEST(ConfigErrorTest, RopeDimsLargerThanHead) {
  const TempModel file = with_keys([](gguf::Writer& w) { w.set<uint32_t>("llama.rope.dimension_count", 16); });
  const std::string message = error_of([&] { config_of(file.path()); });
  EXPECT_NE(message.find("llama.rope.dimension_count"), std::string::npos) << message;
}

TEST(ConfigErrorTest, UnsupportedArchitectureIsNamed) {
  const TempModel file = with_keys([](gguf::Writer& w) { w.set_string("general.architecture", "mamba"); });
  const std::string message = error_of([&] { config_of(file.path()); });
  EXPECT_NE(message.find("'mamba'"), std::string::npos) << message;
}

TEST(ConfigErrorTest, UnsupportedRopeScalingIsNamed) {
  const TempModel file = with_keys([](gguf::Writer& w) { w.set_string("llama.rope.scaling.type", "yarn"); });
  const std::string message = error_of([&] { config_of(file.path()); });
  EXPECT_NE(message.find("llama.rope.scaling.type"), std::string::npos) << message;
  EXPECT_NE(message.find("yarn"), std::string::npos) << message;
}

TEST(ConfigErrorTest, MixtureOfExpertsIsRejected) {
  const TempModel file = with_keys([](gguf::Writer& w) { w.set<uint32_t>("llama.expert_count", 8); });
  const std::string message = error_of([&] { config_of(file.path()); });
  EXPECT_NE(message.find("llama.expert_count"), std::string::npos) << message;
}

TEST(ConfigErrorTest, VocabularyOnlyFile) {
  const std::string message = error_of([] { config_of(test::shared_path("vocab/ggml-vocab-llama-spm.gguf")); });
  EXPECT_NE(message.find("no tensors"), std::string::npos) << message;
}

TEST(ConfigTest, LinearRopeScaling) {
  const TempModel file = with_keys([](gguf::Writer& w) {
    w.set_string("llama.rope.scaling.type", "linear");
    w.set<float>("llama.rope.scaling.factor", 4.0f);
  });
  const ModelConfig c = config_of(file.path());
  EXPECT_EQ(c.rope_scaling, RopeScaling::Linear);
  EXPECT_FLOAT_EQ(c.rope_scale_factor, 4.0f);
}

TEST(ConfigTest, Llama3RopeFrequencies) {
  const TempModel file("stories260K", ModelEdits().add_tensors([](gguf::Writer& w) {
    test::add_zero_tensor(w, "rope_freqs.weight", TensorType::F32, {4});
  }));
  const model::ExecutionPlan plan = plan_of(file.path());
  EXPECT_EQ(plan.config().rope_scaling, RopeScaling::Llama3);
  ASSERT_TRUE(plan.rope_freqs());
  EXPECT_EQ(plan.rope_freqs().cols(), 4);
}

TEST(PlanErrorTest, MisshapenTensorIsNamed) {
  const TempModel file("stories260K", ModelEdits().drop_tensor("blk.2.attn_k.weight").add_tensors([](gguf::Writer& w) {
    test::add_zero_tensor(w, "blk.2.attn_k.weight", TensorType::F32, {64, 16});
  }));
  const std::string message = error_of([&] { plan_of(file.path()); });
  EXPECT_NE(message.find("blk.2.attn_k.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("[64, 32]"), std::string::npos) << message;
}

TEST(PlanErrorTest, MissingTensorIsNamed) {
  const TempModel file("stories260K", ModelEdits().drop_tensor("blk.4.ffn_up.weight"));
  const std::string message = error_of([&] { plan_of(file.path()); });
  EXPECT_NE(message.find("blk.4.ffn_up.weight"), std::string::npos) << message;
}

TEST(PlanErrorTest, UnknownTensorIsNamed) {
  const TempModel file("stories260K", ModelEdits().add_tensors([](gguf::Writer& w) {
    test::add_zero_tensor(w, "blk.0.attn_sinks.weight", TensorType::F32, {8});
  }));
  const std::string message = error_of([&] { plan_of(file.path()); });
  EXPECT_NE(message.find("tensor 'blk.0.attn_sinks.weight' is not part of the llama architecture"), std::string::npos)
      << message;
}

TEST(PlanErrorTest, VocabularyMismatchNamesTheEmbedding) {
  const TempModel file = with_keys([](gguf::Writer& w) { w.set<uint32_t>("llama.vocab_size", 500); });
  const std::string message = error_of([&] { plan_of(file.path()); });
  EXPECT_NE(message.find("token_embd.weight"), std::string::npos) << message;
}

TEST(PlanErrorTest, UnsupportedTypeIsNamedWhenMaterialized) {
  // Q8_1 is a valid GGUF type that the CPU kernels do not compute with: planning succeeds, use fails.
  const TempModel file("stories260K", ModelEdits().drop_tensor("blk.1.attn_q.weight").add_tensors([](gguf::Writer& w) {
    test::add_zero_tensor(w, "blk.1.attn_q.weight", TensorType::Q8_1, {64, 64});
  }));
  const model::ExecutionPlan plan = plan_of(file.path());
  plan.preload_layers(0, 0);
  const std::string message = error_of([&] { plan.preload_layers(1, 1); });
  EXPECT_NE(message.find("blk.1.attn_q.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("Q8_1"), std::string::npos) << message;
}

}  // namespace
}  // namespace rf
