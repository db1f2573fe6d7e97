// The reader against real files (checked by an independent walk of their bytes) and against key/values of
// every value type appended to a real file.
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf_test_util.h"

namespace rf::test {
namespace {

using gguf::ValueType;

TEST(TensorTypes, RegistryMatchesGgml) {
  EXPECT_EQ(tensor_type_info(TensorType::Q4_K).block_bytes, 144u);
  EXPECT_EQ(tensor_type_info(TensorType::Q6_K).block_bytes, 210u);
  EXPECT_EQ(tensor_type_info(TensorType::IQ4_XS).block_bytes, 136u);
  EXPECT_EQ(tensor_type_info(TensorType::Q8_0).block_elements, 32u);
  EXPECT_EQ(tensor_type_name(TensorType::BF16), "BF16");
  EXPECT_EQ(tensor_type_from_name("q5_k"), TensorType::Q5_K);
  EXPECT_FALSE(tensor_type_from_name("Q4_2").has_value());
  EXPECT_EQ(find_tensor_type(4), nullptr);
  EXPECT_EQ(find_tensor_type(40), nullptr);
  EXPECT_EQ(row_bytes(TensorType::Q4_0, 64), 36u);
  EXPECT_THROW(row_bytes(TensorType::Q4_K, 100), Error);
}

// Every shared file parses, and its key/values and tensor table agree with an independent walk of its bytes.
TEST(Reader, EverySharedFileMatchesItsBytes) {
  int files = 0;
  for (const char* folder : {"models", "vocab"}) {
    for (const auto& entry : std::filesystem::directory_iterator(shared_path(folder))) {
      if (entry.path().extension() != ".gguf") continue;
      SCOPED_TRACE(entry.path().string());
      const auto bytes = read_bytes(entry.path());
      const GgufLayout layout = map_layout(bytes);
      auto file = gguf::File::open(entry.path());
      ++files;
      EXPECT_EQ(file->version(), 3u);
      EXPECT_EQ(file->file_size(), bytes.size());
      ASSERT_EQ(file->metadata().size(), layout.kvs.size());
      for (size_t i = 0; i < layout.kvs.size(); ++i) {
        const auto& kv = file->metadata()[i];
        EXPECT_EQ(kv.key, layout.kvs[i].key);
        EXPECT_EQ(static_cast<uint32_t>(kv.value.type()), layout.kvs[i].value_type);
        EXPECT_EQ(file->find(kv.key), &kv.value);
      }
      ASSERT_EQ(file->tensors().size(), layout.tensors.size());
      if (!layout.tensors.empty()) {
        EXPECT_EQ(file->data_offset(), layout.data_start);
      }
      for (size_t i = 0; i < layout.tensors.size(); ++i) {
        const auto& info = file->tensors()[i];
        const auto& walked = layout.tensors[i];
        EXPECT_EQ(info.name, walked.name);
        EXPECT_EQ(info.n_dims, walked.dims.size());
        for (size_t d = 0; d < walked.dims.size(); ++d) EXPECT_EQ(info.ne[d], detail::u64_at(bytes, walked.dims[d].offset));
        EXPECT_EQ(static_cast<uint32_t>(info.type()), detail::u32_at(bytes, walked.type.offset));
        EXPECT_EQ(info.offset, walked.data_offset);
        const auto data = file->tensor_data(info);
        EXPECT_EQ(data.data(), file->mapping()->data() + layout.data_start + walked.data_offset);
        EXPECT_EQ(data.size(), info.rows() * row_bytes(info.type(), info.ne[0]));
        EXPECT_EQ(file->find_tensor(info.name), &info);
      }
    }
  }
  EXPECT_EQ(files, 24);
}

TEST(Reader, TypedAccessorsOnARealModel) {
  auto file = gguf::File::open(shared_path("models/stories260K.gguf"));
  EXPECT_EQ(file->architecture(), "llama");
  EXPECT_EQ(file->get<uint32_t>("llama.block_count"), 5u);
  EXPECT_EQ(file->get_int("llama.embedding_length"), 64);
  EXPECT_EQ(file->get<std::string_view>("tokenizer.ggml.model"), "llama");
  const auto& tokens = file->get_value("tokenizer.ggml.tokens").strings();
  EXPECT_EQ(tokens.size(), 512u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(file->get_value("tokenizer.ggml.scores").array<float>().size(), 512u);
  EXPECT_EQ(file->get_or<uint32_t>("no.such.key", 42u), 42u);
  const auto& embedding = file->tensor("token_embd.weight");
  EXPECT_EQ(embedding.shape(), (std::vector<uint64_t>{64, 512}));
  EXPECT_EQ(embedding.type(), TensorType::F32);
}

TEST(Reader, AccessorErrorsNameTheKey) {
  auto file = gguf::File::open(shared_path("models/stories260K.gguf"));
  try {
    file->get<uint32_t>("llama.no_such_key");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing key 'llama.no_such_key'"), std::string::npos) << e.what();
  }
  try {
    file->get<float>("llama.block_count");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key 'llama.block_count' has type UINT32, expected FLOAT32"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(file->get_int("tokenizer.ggml.model"), Error);
  EXPECT_THROW(file->get_value("tokenizer.ggml.scores").strings(), Error);
  EXPECT_THROW(file->get_value("tokenizer.ggml.tokens").array<float>(), Error);
  try {
    file->tensor("blk.9.attn_q.weight");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'blk.9.attn_q.weight'"), std::string::npos);
  }
}

// Appends one key/value of every type, arrays of every type, and nested arrays; reads them all back.
TEST(Reader, EveryValueTypeAndNestedArrays) {
  const auto original = read_bytes(shared_path("models/stories260K.gguf"));
  auto add = [](std::vector<uint8_t> bytes, auto&& encode) {
    Encoder kv;
    encode(kv);
    return with_key_value(bytes, kv.bytes);
  };
  auto bytes = original;
  bytes = add(bytes, [](Encoder& e) { e.string("t.u8").type(ValueType::UINT8).scalar<uint8_t>(200); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.i8").type(ValueType::INT8).scalar<int8_t>(-100); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.u16").type(ValueType::UINT16).scalar<uint16_t>(60000); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.i16").type(ValueType::INT16).scalar<int16_t>(-30000); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.u32").type(ValueType::UINT32).scalar<uint32_t>(4000000000u); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.i32").type(ValueType::INT32).scalar<int32_t>(-2000000000); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.f32").type(ValueType::FLOAT32).scalar<float>(1.5f); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.bool").type(ValueType::BOOL).scalar<uint8_t>(1); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.str").type(ValueType::STRING).string("h\xc3\xa9llo"); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.u64").type(ValueType::UINT64).scalar<uint64_t>(UINT64_MAX); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.i64").type(ValueType::INT64).scalar<int64_t>(INT64_MIN); });
  bytes = add(bytes, [](Encoder& e) { e.string("t.f64").type(ValueType::FLOAT64).scalar<double>(-2.25); });
  bytes = add(bytes, [](Encoder& e) {
    e.string("t.i16s").type(ValueType::ARRAY).type(ValueType::INT16).scalar<uint64_t>(3);
    e.scalar<int16_t>(-1).scalar<int16_t>(2).scalar<int16_t>(-3);
  });
  bytes = add(bytes, [](Encoder& e) {
    e.string("t.bools").type(ValueType::ARRAY).type(ValueType::BOOL).scalar<uint64_t>(2);
    e.scalar<uint8_t>(0).scalar<uint8_t>(1);
  });
  bytes = add(bytes, [](Encoder& e) {
    e.string("t.empty").type(ValueType::ARRAY).type(ValueType::FLOAT64).scalar<uint64_t>(0);
  });
  bytes = add(bytes, [](Encoder& e) {
    // [[ "a", "bc" ], [ ]] : an array of two arrays of strings
    e.string("t.nested").type(ValueType::ARRAY).type(ValueType::ARRAY).scalar<uint64_t>(2);
    e.type(ValueType::STRING).scalar<uint64_t>(2).string("a").string("bc");
    e.type(ValueType::STRING).scalar<uint64_t>(0);
  });
  auto file = parse_bytes(bytes);
  EXPECT_EQ(file->get<uint8_t>("t.u8"), 200);
  EXPECT_EQ(file->get<int8_t>("t.i8"), -100);
  EXPECT_EQ(file->get<uint16_t>("t.u16"), 60000);
  EXPECT_EQ(file->get<int16_t>("t.i16"), -30000);
  EXPECT_EQ(file->get<uint32_t>("t.u32"), 4000000000u);
  EXPECT_EQ(file->get<int32_t>("t.i32"), -2000000000);
  EXPECT_EQ(file->get<float>("t.f32"), 1.5f);
  EXPECT_TRUE(file->get<bool>("t.bool"));
  EXPECT_EQ(file->get<std::string>("t.str"), "h\xc3\xa9llo");
  EXPECT_EQ(file->get<uint64_t>("t.u64"), UINT64_MAX);
  EXPECT_EQ(file->get<int64_t>("t.i64"), INT64_MIN);
  EXPECT_EQ(file->get<double>("t.f64"), -2.25);
  EXPECT_EQ(file->get_int("t.u8"), 200);
  EXPECT_EQ(file->get_int("t.i64"), INT64_MIN);
  EXPECT_THROW(file->get_int("t.u64"), Error);  // does not fit int64
  EXPECT_EQ(file->get_value("t.u64").to_double(), 18446744073709551615.0);  // found by fuzz_gguf
  EXPECT_EQ(file->get_value("t.i16s").array<int16_t>(), (std::vector<int16_t>{-1, 2, -3}));
  EXPECT_EQ(file->get_value("t.bools").array<bool>(), (std::vector<bool>{false, true}));
  EXPECT_TRUE(file->get_value("t.empty").array<double>().empty());
  const auto& nested = file->get_value("t.nested");
  EXPECT_EQ(nested.element_type(), ValueType::ARRAY);
  ASSERT_EQ(nested.items().size(), 2u);
  EXPECT_EQ(nested.items()[0].strings(), (std::vector<std::string_view>{"a", "bc"}));
  EXPECT_TRUE(nested.items()[1].strings().empty());
  // The original content is intact after the appended keys.
  auto reference = parse_bytes(original);
  EXPECT_EQ(file->tensors().size(), reference->tensors().size());
  EXPECT_EQ(file->get<uint32_t>("llama.block_count"), 5u);
}

// A valid file with a type we cannot compute (IQ2_XXS) stays inspectable.
TEST(Reader, TensorTypeWeCannotComputeStaysInspectable) {
  auto bytes = read_bytes(shared_path("models/synth-tiny256-Q4_K_M.gguf"));
  const auto layout = map_layout(bytes);
  auto file = parse_bytes(bytes);
  for (const auto& t : layout.tensors) {
    if (file->tensor(t.name).type() != TensorType::Q4_K) continue;
    // Q4_K (144 bytes) and IQ2_XXS (66) differ in size: the relabelled tensor shrinks and stays in bounds.
    put<uint32_t>(bytes, t.type.offset, static_cast<uint32_t>(TensorType::IQ2_XXS));
    auto relabelled = parse_bytes(bytes);
    EXPECT_EQ(relabelled->tensor(t.name).type_info->name, "IQ2_XXS");
    return;
  }
  FAIL() << "no Q4_K tensor";
}

}  // namespace
}  // namespace rf::test
