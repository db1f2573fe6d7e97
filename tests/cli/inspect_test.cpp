// `rocmforge inspect`: the JSON of every shared file against rf::gguf::File, the text view, and --dump.
#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "cli/cli_run.h"
#include "quant/quant.h"

namespace rf::test {
namespace {

using gguf::Value;
using gguf::ValueType;
using nlohmann::json;

class InspectTest : public CliTest {};

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// Plain comparisons, one verdict per key: a vocabulary has hundreds of thousands of items, too many for one
// gtest assertion each in a sanitized debug build.
bool scalar_matches(const json& actual, ValueType type, const uint8_t* p) {
  switch (type) {
    case ValueType::UINT8: return actual == load<uint8_t>(p);
    case ValueType::INT8: return actual == load<int8_t>(p);
    case ValueType::UINT16: return actual == load<uint16_t>(p);
    case ValueType::INT16: return actual == load<int16_t>(p);
    case ValueType::UINT32: return actual == load<uint32_t>(p);
    case ValueType::INT32: return actual == load<int32_t>(p);
    case ValueType::UINT64: return actual == load<uint64_t>(p);
    case ValueType::INT64: return actual == load<int64_t>(p);
    case ValueType::BOOL: return actual == (*p != 0);
    case ValueType::FLOAT32:
    case ValueType::FLOAT64: {
      const double expected = type == ValueType::FLOAT32 ? load<float>(p) : load<double>(p);
      // Exact: a float's double prints and parses back. JSON has no NaN or infinity: they print as null.
      return std::isfinite(expected) ? actual.is_number() && actual.get<double>() == expected : actual.is_null();
    }
    default: return false;
  }
}

bool is_valid_utf8(std::string_view s) {
  try {
    (void)json(std::string(s)).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

// Strings that are not valid UTF-8 are printed with the bad bytes replaced: only their presence is checked.
bool string_matches(const json& actual, std::string_view expected) {
  return actual.is_string() && (actual.get_ref<const std::string&>() == expected || !is_valid_utf8(expected));
}

bool value_matches(const json& actual, const Value& expected) {
  if (expected.type() == ValueType::STRING) return string_matches(actual, expected.str());
  if (!expected.is_array()) return scalar_matches(actual, expected.type(), expected.raw().data());
  if (!actual.is_array() || actual.size() != expected.size()) return false;
  for (uint64_t i = 0; i < expected.size(); ++i) {
    bool same = false;
    switch (expected.element_type()) {
      case ValueType::STRING: same = string_matches(actual[i], expected.strings()[i]); break;
      case ValueType::ARRAY: same = value_matches(actual[i], expected.items()[i]); break;
      default: {
        const uint64_t size = expected.raw().size() / expected.size();
        same = scalar_matches(actual[i], expected.element_type(), expected.raw().data() + i * size);
      }
    }
    if (!same) return false;
  }
  return true;
}

TEST_F(InspectTest, JsonOfEverySharedFileMatchesTheReader) {
  for (const std::string& file_path : shared_gguf_files()) {
    SCOPED_TRACE(file_path);
    const json out = json::parse(run_ok(fmt::format("inspect --json '{}'", file_path)));
    const auto file = gguf::File::open(file_path);
    EXPECT_EQ(out["version"], file->version());
    EXPECT_EQ(out["architecture"], std::string(file->architecture()));
    const json& metadata = out["metadata"];
    EXPECT_EQ(metadata.size(), file->metadata().size());
    for (const auto& kv : file->metadata()) {
      const std::string key(kv.key);
      ASSERT_TRUE(metadata.contains(key)) << key;
      EXPECT_TRUE(value_matches(metadata[key], kv.value)) << key;
    }
    const json& tensors = out["tensors"];
    ASSERT_EQ(tensors.size(), file->tensors().size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const gguf::TensorInfo& tensor = file->tensors()[i];
      EXPECT_EQ(tensors[i]["name"], std::string(tensor.name));
      EXPECT_EQ(tensors[i]["type"], std::string(tensor.type_info->name));
      EXPECT_EQ(tensors[i]["shape"], tensor.shape());
      EXPECT_EQ(tensors[i]["offset"], tensor.offset);
      EXPECT_EQ(tensors[i]["bytes"], tensor.bytes);
    }
  }
}

TEST_F(InspectTest, TextShowsSummaryKeysAndTensors) {
  const std::string out = run_ok(fmt::format("inspect '{}'", model_path("synth-tiny256-Q4_K_M.gguf")));
  for (const char* expected : {"GGUF version  3", "architecture  llama", "parameters    3.41M (3410176)",
                               "file type     MOSTLY_Q4_K_M (15)", "Q6_K         5 tensors",
                               "general.name", "\"synthetic-tiny-256\"", "[STRING x 512] \"<unk>\", \"<s>\"",
                               "llama.attention.layer_norm_rms_epsilon  FLOAT32  1e-05", "blk.3.ffn_down.weight",
                               "[768, 256]"})
    EXPECT_NE(out.find(expected), std::string::npos) << expected << "\n" << out;
}

TEST_F(InspectTest, DumpWritesTheDequantizedTensor) {
  struct Case {
    const char* model;
    const char* tensor;
  };
  for (const Case& c : {Case{"TinyStories-656K-Q8_0.gguf", "blk.1.attn_q.weight"},
                        Case{"synth-tiny256-Q4_K_M.gguf", "blk.3.ffn_down.weight"},  // Q6_K
                        Case{"synth-tiny256-Q4_K_M.gguf", "token_embd.weight"},      // Q4_K
                        Case{"llama-2-tiny-random.gguf", "token_embd.weight"},       // F16
                        Case{"stories260K.gguf", "output_norm.weight"}}) {
    SCOPED_TRACE(fmt::format("{} {}", c.model, c.tensor));
    run_ok(fmt::format("inspect '{}' --dump {} --out '{}'", model_path(c.model), c.tensor, path("t.f32")));
    const auto file = gguf::File::open(model_path(c.model));
    const gguf::TensorInfo& tensor = file->tensor(c.tensor);
    std::vector<float> expected(tensor.elements());
    quant::dequantize(tensor.type(), file->tensor_data(tensor).data(), expected.data(),
                      static_cast<int64_t>(expected.size()));
    const std::string dumped = read_text(path("t.f32"));
    ASSERT_EQ(dumped.size(), expected.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(dumped.data(), expected.data(), dumped.size()), 0);
  }
}

}  // namespace
}  // namespace rf::test
