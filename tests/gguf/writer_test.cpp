// The GGUF writer: every value type and tensors of several types read back by rf::gguf::File, the layout
// rules (alignment, padding), its errors, and every shared model re-written byte for byte.
#include "gguf/writer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/cli_run.h"  // same_value, shared_gguf_files
#include "gguf/gguf.h"

namespace rf::gguf {
namespace {

namespace fs = std::filesystem;
using test::same_value;
using test::shared_gguf_files;

class WriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("rf_writer_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::vector<uint8_t> bytes(fs::file_size(path));
  std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

bool same_bytes(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// A producer that writes `bytes` in chunks of `chunk` bytes.
TensorProducer chunked(std::vector<uint8_t> bytes, size_t chunk) {
  return [bytes = std::move(bytes), chunk](const ByteSink& sink) {
    for (size_t at = 0; at < bytes.size(); at += chunk)
      sink(std::span<const uint8_t>(bytes).subspan(at, std::min(chunk, bytes.size() - at)));
  };
}

std::vector<uint8_t> pattern(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 7);
  return bytes;
}

TEST_F(WriterTest, RoundTripsEveryValueTypeAndTensor) {
  Writer writer;
  writer.set<uint8_t>("u8", 250);
  writer.set<int8_t>("i8", -120);
  writer.set<uint16_t>("u16", 65000);
  writer.set<int16_t>("i16", -32000);
  writer.set<uint32_t>("u32", 4000000000u);
  writer.set<int32_t>("i32", -2000000000);
  writer.set<uint64_t>("u64", std::numeric_limits<uint64_t>::max());
  writer.set<int64_t>("i64", std::numeric_limits<int64_t>::min());
  writer.set<float>("f32", 1e-5f);
  writer.set<double>("f64", -2.5e300);
  writer.set<bool>("bool", true);
  writer.set_string("string", std::string_view("caf\xc3\xa9 \0 end", 11));
  writer.set_string("empty string", "");
  const std::vector<int32_t> ints = {-1, 0, 1, 1 << 30};
  writer.set_array<int32_t>("i32 array", ints);
  const std::vector<double> doubles = {0.5, -0.25};
  writer.set_array<double>("f64 array", doubles);
  const std::array<bool, 3> bools = {true, false, true};
  writer.set_array<bool>("bool array", bools);
  writer.set_array<uint8_t>("empty array", std::span<const uint8_t>());
  const std::vector<std::string> strings = {"<s>", "", "\xe2\x96\x81the"};
  writer.set_string_array("string array", strings);

  const std::vector<uint8_t> f32 = pattern(4 * 8 * 3, 1), f16 = pattern(2 * 16, 2), q8_0 = pattern(34 * 2 * 5, 3),
                             q4_k = pattern(144 * 2 * 2 * 3, 4);
  writer.add_tensor("f32.weight", TensorType::F32, {8, 3}, chunked(f32, 1000));
  writer.add_tensor("f16.norm", TensorType::F16, {16}, chunked(f16, 3));
  writer.add_tensor("q8_0.weight", TensorType::Q8_0, {64, 5}, chunked(q8_0, 34));
  writer.add_tensor("q4_k.experts", TensorType::Q4_K, {512, 2, 3}, chunked(q4_k, 100));
  writer.write(path("all.gguf"));

  const auto file = File::open(path("all.gguf"));
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->file_size(), writer.file_size());
  EXPECT_EQ(file->metadata().size(), 18u);
  EXPECT_EQ(file->get<uint8_t>("u8"), 250);
  EXPECT_EQ(file->get<int8_t>("i8"), -120);
  EXPECT_EQ(file->get<uint16_t>("u16"), 65000);
  EXPECT_EQ(file->get<int16_t>("i16"), -32000);
  EXPECT_EQ(file->get<uint32_t>("u32"), 4000000000u);
  EXPECT_EQ(file->get<int32_t>("i32"), -2000000000);
  EXPECT_EQ(file->get<uint64_t>("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(file->get<int64_t>("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(file->get<float>("f32"), 1e-5f);
  EXPECT_EQ(file->get<double>("f64"), -2.5e300);
  EXPECT_EQ(file->get<bool>("bool"), true);
  EXPECT_EQ(file->get<std::string_view>("string"), std::string_view("caf\xc3\xa9 \0 end", 11));
  EXPECT_EQ(file->get<std::string_view>("empty string"), "");
  EXPECT_EQ(file->get_value("i32 array").array<int32_t>(), ints);
  EXPECT_EQ(file->get_value("f64 array").array<double>(), doubles);
  EXPECT_EQ(file->get_value("bool array").array<bool>(), std::vector<bool>(bools.begin(), bools.end()));
  EXPECT_EQ(file->get_value("empty array").element_type(), ValueType::UINT8);
  EXPECT_EQ(file->get_value("empty array").size(), 0u);
  const auto& read_strings = file->get_value("string array").strings();
  EXPECT_TRUE(std::ranges::equal(read_strings, strings));

  struct Expected {
    std::string name;
    TensorType type;
    std::vector<uint64_t> shape;
    const std::vector<uint8_t>* bytes;
  };
  const std::vector<Expected> expected = {{"f32.weight", TensorType::F32, {8, 3}, &f32},
                                          {"f16.norm", TensorType::F16, {16}, &f16},
                                          {"q8_0.weight", TensorType::Q8_0, {64, 5}, &q8_0},
                                          {"q4_k.experts", TensorType::Q4_K, {512, 2, 3}, &q4_k}};
  ASSERT_EQ(file->tensors().size(), expected.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const TensorInfo& tensor = file->tensors()[i];
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(tensor.name, expected[i].name);
    EXPECT_EQ(tensor.type(), expected[i].type);
    EXPECT_EQ(tensor.shape(), expected[i].shape);
    EXPECT_EQ(tensor.offset, offset);  // packed at the next multiple of 32
    EXPECT_TRUE(std::ranges::equal(file->tensor_data(tensor), *expected[i].bytes));
    offset += (tensor.bytes + 31) / 32 * 32;
  }
  EXPECT_EQ(file->data_offset() % 32, 0u);
  EXPECT_EQ(file->file_size(), file->data_offset() + offset);  // the last tensor is padded too
}

// Arrays of arrays cannot be set directly; they are copied from a file as they are.
TEST_F(WriterTest, CopiesNestedArraysFromAFile) {
  std::vector<uint8_t> bytes;
  auto put = [&](auto value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(value));
  };
  put(uint32_t{0x46554747});
  put(uint32_t{3});
  put(uint64_t{0});  // tensors
  put(uint64_t{1});  // key/values
  put(uint64_t{6});
  bytes.insert(bytes.end(), {'n', 'e', 's', 't', 'e', 'd'});
  put(static_cast<uint32_t>(ValueType::ARRAY));
  put(static_cast<uint32_t>(ValueType::ARRAY));
  put(uint64_t{2});
  put(static_cast<uint32_t>(ValueType::UINT16));  // item 0: [7, 8]
  put(uint64_t{2});
  put(uint16_t{7});
  put(uint16_t{8});
  put(static_cast<uint32_t>(ValueType::STRING));  // item 1: ["x"]
  put(uint64_t{1});
  put(uint64_t{1});
  bytes.push_back('x');
  const auto source = File::parse(bytes, "nested");

  Writer writer;
  writer.set_value("nested", source->get_value("nested"));
  writer.write(path("nested.gguf"));
  const auto copy = File::open(path("nested.gguf"));
  EXPECT_TRUE(same_value(copy->get_value("nested"), source->get_value("nested")));
  EXPECT_EQ(copy->get_value("nested").items()[0].array<uint16_t>(), (std::vector<uint16_t>{7, 8}));
}

TEST_F(WriterTest, SettingAKeyAgainReplacesItInPlace) {
  Writer writer;
  writer.set<uint32_t>("a", 1);
  writer.set_string("b", "x");
  writer.set<float>("a", 2.0f);
  EXPECT_TRUE(writer.remove("b"));
  EXPECT_FALSE(writer.remove("b"));
  writer.set_string("c", "y");
  writer.write(path("replace.gguf"));
  const auto file = File::open(path("replace.gguf"));
  ASSERT_EQ(file->metadata().size(), 2u);
  EXPECT_EQ(file->metadata()[0].key, "a");
  EXPECT_EQ(file->get<float>("a"), 2.0f);
  EXPECT_EQ(file->metadata()[1].key, "c");
}

TEST_F(WriterTest, HonoursGeneralAlignment) {
  Writer writer;
  writer.set<uint32_t>("general.alignment", 256);
  writer.add_tensor("a", TensorType::F32, {3}, chunked(pattern(12, 1), 12));
  writer.add_tensor("b", TensorType::F16, {5, 2}, chunked(pattern(20, 2), 7));
  writer.write(path("aligned.gguf"));
  const auto file = File::open(path("aligned.gguf"));
  EXPECT_EQ(file->alignment(), 256u);
  EXPECT_EQ(file->data_offset() % 256, 0u);
  EXPECT_EQ(file->tensor("a").offset, 0u);
  EXPECT_EQ(file->tensor("b").offset, 256u);
  EXPECT_EQ(file->file_size(), file->data_offset() + 512);
  EXPECT_TRUE(std::ranges::equal(file->tensor_data(file->tensor("b")), pattern(20, 2)));
}

TEST_F(WriterTest, RejectsBadAlignment) {
  Writer not_a_power_of_two;
  not_a_power_of_two.set<uint32_t>("general.alignment", 48);
  EXPECT_THROW(not_a_power_of_two.write(path("x.gguf")), Error);
  Writer wrong_type;
  wrong_type.set<uint64_t>("general.alignment", 64);
  EXPECT_THROW(wrong_type.write(path("x.gguf")), Error);
  EXPECT_FALSE(fs::exists(path("x.gguf")));
}

TEST_F(WriterTest, RejectsInvalidTensors) {
  Writer writer;
  writer.add_tensor("t", TensorType::F32, {4}, {});
  EXPECT_THROW(writer.add_tensor("t", TensorType::F32, {4}, {}), Error);
  EXPECT_THROW(writer.add_tensor("no dims", TensorType::F32, {}, {}), Error);
  EXPECT_THROW(writer.add_tensor("five dims", TensorType::F32, {1, 1, 1, 1, 1}, {}), Error);
  EXPECT_THROW(writer.add_tensor("zero", TensorType::F32, {4, 0}, {}), Error);
  EXPECT_THROW(writer.add_tensor("overflow", TensorType::F32, {1ull << 40, 1ull << 40}, {}), Error);
  try {
    writer.add_tensor("partial block", TensorType::Q4_K, {128, 2}, {});
    FAIL() << "a row of half a Q4_K block was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("partial block"), std::string::npos) << e.what();
  }
  EXPECT_THROW(writer.write(path("no data.gguf")), Error);  // "t" has no producer
}

TEST_F(WriterTest, ChecksTheProducersByteCountAndLeavesNoFileOnError) {
  for (size_t produced : {15u, 17u}) {
    SCOPED_TRACE(produced);
    Writer writer;
    writer.add_tensor("sixteen bytes", TensorType::F32, {4}, chunked(pattern(produced, 0), 5));
    try {
      writer.write(path("bad.gguf"));
      FAIL() << "a producer of " << produced << " bytes for 16 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sixteen bytes"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(path("bad.gguf")));
    EXPECT_FALSE(fs::exists(path("bad.gguf.partial")));
  }
}

TEST_F(WriterTest, WritesWithoutDataAsASparseFileOfFullSize) {
  Writer writer;
  writer.set_string("general.architecture", "llama");
  writer.add_tensor("big", TensorType::Q4_0, {4096, 4096}, {});  // 9 MiB never written
  writer.add_tensor("small", TensorType::F32, {7}, {});
  writer.write_without_data(path("sparse.gguf"));
  const auto file = File::open(path("sparse.gguf"));
  EXPECT_EQ(file->file_size(), writer.file_size());
  EXPECT_EQ(file->tensor("big").bytes, 4096u * 4096 / 32 * 18);
  const auto small = file->tensor_data(file->tensor("small"));
  EXPECT_TRUE(std::all_of(small.begin(), small.end(), [](uint8_t b) { return b == 0; }));
}

// Copying every key/value (one call each) and every tensor's bytes reproduces llama.cpp's files exactly.
TEST_F(WriterTest, RewritesEverySharedFileByteIdentically) {
  const auto paths = shared_gguf_files();
  ASSERT_FALSE(paths.empty());
  for (const std::string& source_path : paths) {
    SCOPED_TRACE(source_path);
    const auto source = File::open(source_path);
    Writer writer;
    for (const auto& kv : source->metadata()) writer.set_value(kv.key, kv.value);
    for (const auto& tensor : source->tensors()) {
      const auto data = source->tensor_data(tensor);
      writer.add_tensor(std::string(tensor.name), tensor.type(), tensor.shape(),
                        [data](const ByteSink& sink) { sink(data); });
    }
    writer.write(path("copy.gguf"));
    std::vector<uint8_t> copy_bytes = read_bytes(path("copy.gguf"));
    const std::vector<uint8_t> source_bytes = read_bytes(source_path);
    // gguf-py ends a file without tensors right after its tensor infos; llama.cpp's writer, and this one, pad
    // the header to the alignment all the same.
    if (source->tensors().empty() && copy_bytes.size() > source_bytes.size()) {
      EXPECT_LT(copy_bytes.size() - source_bytes.size(), source->alignment());
      EXPECT_TRUE(std::all_of(copy_bytes.begin() + source_bytes.size(), copy_bytes.end(), [](uint8_t b) { return b == 0; }));
      copy_bytes.resize(source_bytes.size());
    }
    EXPECT_TRUE(copy_bytes == source_bytes);
    const auto copy = File::open(path("copy.gguf"));
    ASSERT_EQ(copy->metadata().size(), source->metadata().size());
    for (size_t i = 0; i < copy->metadata().size(); ++i) {
      EXPECT_EQ(copy->metadata()[i].key, source->metadata()[i].key);
      EXPECT_TRUE(same_value(copy->metadata()[i].value, source->metadata()[i].value)) << source->metadata()[i].key;
    }
    ASSERT_EQ(copy->tensors().size(), source->tensors().size());
    for (size_t i = 0; i < copy->tensors().size(); ++i) {
      const TensorInfo& a = copy->tensors()[i];
      const TensorInfo& b = source->tensors()[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.type(), b.type());
      EXPECT_EQ(a.shape(), b.shape());
      EXPECT_TRUE(same_bytes(copy->tensor_data(a), source->tensor_data(b))) << a.name;
    }
  }
}

}  // namespace
}  // namespace rf::gguf
