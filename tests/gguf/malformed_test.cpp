// Malformed input: corruptions generated from real files, each aimed at one field, each expected to give its
// own specific error (kind and message), never a crash. Runs under ASan/UBSan in `make test`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "gguf_test_util.h"

namespace rf::test {
namespace {

using gguf::ErrorKind;
using gguf::ValueType;

class Malformed : public ::testing::Test {
 protected:
  // stories260K: F32 tensors, string/float/int arrays, 19 keys, 48 tensors.
  // TinyStories: Q8_0 tensors (block size 32), so shape errors can be aimed at a quantized row.
  void SetUp() override {
    original = read_bytes(shared_path("models/stories260K.gguf"));
    layout = map_layout(original);
    ASSERT_GT(layout.tensors.size(), 2u);
    bytes = original;
  }
  const KeyValueLayout& kv_of_type(uint32_t type, uint32_t element_type = ~0u) const {
    for (const auto& kv : layout.kvs)
      if (kv.value_type == type && (element_type == ~0u || detail::u32_at(original, kv.array_element_type.offset) == element_type))
        return kv;
    throw std::runtime_error("no such key in the test file");
  }
  std::vector<uint8_t> original, bytes;
  GgufLayout layout;
};

TEST_F(Malformed, OriginalParses) { EXPECT_NO_THROW(parse_bytes(original)); }

// --- header --------------------------------------------------------------------------------------------------

TEST_F(Malformed, BadMagic) {
  bytes[0] = 'X';
  expect_format_error(bytes, ErrorKind::BadMagic, "not a GGUF file");
}

TEST_F(Malformed, EmptyInput) { expect_format_error({}, ErrorKind::Truncated, "the magic"); }

TEST_F(Malformed, VersionOne) {
  put<uint32_t>(bytes, 4, 1);
  expect_format_error(bytes, ErrorKind::UnsupportedVersion, "version 1 is not supported");
}

TEST_F(Malformed, FutureVersion) {
  put<uint32_t>(bytes, 4, 4);
  expect_format_error(bytes, ErrorKind::UnsupportedVersion, "unsupported GGUF version 4");
}

TEST_F(Malformed, BigEndianVersion) {
  put<uint32_t>(bytes, 4, 0x03000000);
  expect_format_error(bytes, ErrorKind::UnsupportedVersion, "big-endian");
}

TEST_F(Malformed, HugeKeyValueCount) {
  put<uint64_t>(bytes, 16, uint64_t{1} << 60);
  expect_format_error(bytes, ErrorKind::CountTooLarge, "the key/value count at byte 16");
}

TEST_F(Malformed, HugeTensorCount) {
  put<uint64_t>(bytes, 8, uint64_t{1} << 40);
  expect_format_error(bytes, ErrorKind::CountTooLarge, "the tensor count at byte 8");
}

TEST_F(Malformed, MaxTensorCount) {
  put<uint64_t>(bytes, 8, UINT64_MAX);
  expect_format_error(bytes, ErrorKind::CountTooLarge, "the tensor count");
}

// --- key/values ----------------------------------------------------------------------------------------------

TEST_F(Malformed, KeyLengthPastEnd) {
  put<uint64_t>(bytes, layout.kvs[1].key_length.offset, bytes.size());
  expect_format_error(bytes, ErrorKind::LengthPastEnd, "the key of key/value 1");
}

TEST_F(Malformed, KeyLengthMaxU64) {
  put<uint64_t>(bytes, layout.kvs[0].key_length.offset, UINT64_MAX);
  expect_format_error(bytes, ErrorKind::LengthPastEnd, "past the end of the file");
}

TEST_F(Malformed, StringValueLengthPastEnd) {
  const auto& kv = kv_of_type(8);
  put<uint64_t>(bytes, kv.value.offset, uint64_t{1} << 50);
  expect_format_error(bytes, ErrorKind::LengthPastEnd, "the string of key '" + kv.key + "'");
}

TEST_F(Malformed, InvalidValueType) {
  put<uint32_t>(bytes, layout.kvs[2].type.offset, 13);
  expect_format_error(bytes, ErrorKind::InvalidValueType, "invalid value type id 13");
}

TEST_F(Malformed, InvalidValueTypeMax) {
  put<uint32_t>(bytes, layout.kvs[0].type.offset, UINT32_MAX);
  expect_format_error(bytes, ErrorKind::InvalidValueType, "invalid value type id 4294967295");
}

TEST_F(Malformed, InvalidArrayElementType) {
  const auto& kv = kv_of_type(9);
  put<uint32_t>(bytes, kv.array_element_type.offset, 77);
  expect_format_error(bytes, ErrorKind::InvalidValueType, "the element type of key '" + kv.key + "'");
}

TEST_F(Malformed, HugeStringArrayCount) {
  const auto& kv = kv_of_type(9, 8);
  put<uint64_t>(bytes, kv.array_count.offset, uint64_t{1} << 61);
  expect_format_error(bytes, ErrorKind::CountTooLarge, "the length of key '" + kv.key + "'");
}

TEST_F(Malformed, HugeFloatArrayCount) {
  const auto& kv = kv_of_type(9, 6);
  put<uint64_t>(bytes, kv.array_count.offset, (UINT64_MAX / 4) + 2);  // count * 4 would wrap around
  expect_format_error(bytes, ErrorKind::CountTooLarge, "the length of key '" + kv.key + "'");
}

TEST_F(Malformed, ArrayStringLengthPastEnd) {
  const auto& kv = kv_of_type(9, 8);
  put<uint64_t>(bytes, kv.first_string_length.offset, bytes.size());
  expect_format_error(bytes, ErrorKind::LengthPastEnd, "string 0 of key '" + kv.key + "'");
}

TEST_F(Malformed, ArrayStringLengthMaxU64) {
  const auto& kv = kv_of_type(9, 8);
  put<uint64_t>(bytes, kv.first_string_length.offset, UINT64_MAX - 3);
  expect_format_error(bytes, ErrorKind::LengthPastEnd, "string 0 of key '" + kv.key + "'");
}

// Two keys of one length: the second is renamed to the first.
TEST_F(Malformed, DuplicateKey) {
  for (size_t i = 0; i < layout.kvs.size(); ++i)
    for (size_t j = i + 1; j < layout.kvs.size(); ++j)
      if (layout.kvs[i].key.size() == layout.kvs[j].key.size()) {
        std::copy(layout.kvs[i].key.begin(), layout.kvs[i].key.end(), bytes.begin() + layout.kvs[j].key_bytes.offset);
        expect_format_error(bytes, ErrorKind::DuplicateKey, "duplicate key '" + layout.kvs[i].key + "'");
        return;
      }
  FAIL() << "no two keys of equal length";
}

TEST_F(Malformed, DuplicateKeyAppended) {
  Encoder kv;
  kv.string(layout.kvs[0].key).type(ValueType::UINT32).scalar<uint32_t>(7);
  expect_format_error(with_key_value(original, kv.bytes), ErrorKind::DuplicateKey, layout.kvs[0].key);
}

TEST_F(Malformed, ArraysNestedTooDeep) {
  Encoder kv;
  kv.string("test.deep").type(ValueType::ARRAY);
  for (int depth = 0; depth < 9; ++depth) kv.type(ValueType::ARRAY).scalar<uint64_t>(1);
  kv.type(ValueType::UINT8).scalar<uint64_t>(1).scalar<uint8_t>(1);
  expect_format_error(with_key_value(original, kv.bytes), ErrorKind::NestingTooDeep, "test.deep");
}

TEST_F(Malformed, AlignmentZero) {
  Encoder kv;
  kv.string("general.alignment").type(ValueType::UINT32).scalar<uint32_t>(0);
  expect_format_error(with_key_value(original, kv.bytes), ErrorKind::BadAlignment, "not a power of two");
}

TEST_F(Malformed, AlignmentNotPowerOfTwo) {
  Encoder kv;
  kv.string("general.alignment").type(ValueType::UINT32).scalar<uint32_t>(48);
  expect_format_error(with_key_value(original, kv.bytes), ErrorKind::BadAlignment, "general.alignment is 48");
}

TEST_F(Malformed, AlignmentWrongType) {
  Encoder kv;
  kv.string("general.alignment").type(ValueType::STRING).string("32");
  expect_format_error(with_key_value(original, kv.bytes), ErrorKind::BadAlignment, "has type STRING");
}

// A larger alignment that the stored offsets do not honour.
TEST_F(Malformed, OffsetsBreakLargerAlignment) {
  Encoder kv;
  kv.string("general.alignment").type(ValueType::UINT32).scalar<uint32_t>(1u << 20);
  expect_format_error(with_key_value(original, kv.bytes), ErrorKind::TensorMisaligned, "not a multiple of the alignment");
}

// --- tensor infos --------------------------------------------------------------------------------------------

TEST_F(Malformed, TensorNameLengthPastEnd) {
  put<uint64_t>(bytes, layout.tensors[3].name_length.offset, uint64_t{1} << 62);
  expect_format_error(bytes, ErrorKind::LengthPastEnd, "the name of tensor 3");
}

TEST_F(Malformed, ZeroDimensions) {
  put<uint32_t>(bytes, layout.tensors[0].n_dims.offset, 0);
  expect_format_error(bytes, ErrorKind::InvalidDimCount, "has 0 dimensions");
}

TEST_F(Malformed, FiveDimensions) {
  put<uint32_t>(bytes, layout.tensors[1].n_dims.offset, 5);
  expect_format_error(bytes, ErrorKind::InvalidDimCount, "has 5 dimensions");
}

TEST_F(Malformed, HugeDimensionCount) {
  put<uint32_t>(bytes, layout.tensors[1].n_dims.offset, UINT32_MAX);
  expect_format_error(bytes, ErrorKind::InvalidDimCount, "'" + layout.tensors[1].name + "'");
}

TEST_F(Malformed, DimensionAboveInt64) {
  put<uint64_t>(bytes, layout.tensors[0].dims[0].offset, uint64_t{1} << 63);
  expect_format_error(bytes, ErrorKind::ElementCountOverflow, "element count overflows");
}

TEST_F(Malformed, ElementCountOverflow) {
  const auto& t = *std::find_if(layout.tensors.begin(), layout.tensors.end(), [](auto& x) { return x.dims.size() == 2; });
  put<uint64_t>(bytes, t.dims[0].offset, uint64_t{1} << 32);
  put<uint64_t>(bytes, t.dims[1].offset, uint64_t{1} << 32);
  expect_format_error(bytes, ErrorKind::ElementCountOverflow, "'" + t.name + "'");
}

TEST_F(Malformed, ByteCountOverflow) {
  // 2^62 F32 elements fit in int64, their 2^64 bytes do not fit in u64.
  const auto& t = layout.tensors[0];
  ASSERT_EQ(parse_bytes(original)->tensor(t.name).type(), TensorType::F32);
  put<uint64_t>(bytes, t.dims[0].offset, uint64_t{1} << 62);
  for (size_t d = 1; d < t.dims.size(); ++d) put<uint64_t>(bytes, t.dims[d].offset, 1);
  expect_format_error(bytes, ErrorKind::ElementCountOverflow, "byte count overflows");
}

TEST_F(Malformed, InvalidTensorTypeId) {
  put<uint32_t>(bytes, layout.tensors[2].type.offset, 99);
  expect_format_error(bytes, ErrorKind::InvalidTensorType, "invalid tensor type id 99");
}

TEST_F(Malformed, RetiredTensorTypeId) {
  put<uint32_t>(bytes, layout.tensors[2].type.offset, 4);  // Q4_2, removed from ggml
  expect_format_error(bytes, ErrorKind::InvalidTensorType, "invalid tensor type id 4");
}

TEST_F(Malformed, RowNotWholeBlocks) {
  // An F32 tensor relabelled Q4_K: its rows are not a multiple of 256 elements.
  put<uint32_t>(bytes, layout.tensors[0].type.offset, static_cast<uint32_t>(TensorType::Q4_K));
  expect_format_error(bytes, ErrorKind::BadShape, "not a multiple of its block size 256");
}

TEST_F(Malformed, DuplicateTensorName) {
  for (size_t i = 0; i < layout.tensors.size(); ++i)
    for (size_t j = i + 1; j < layout.tensors.size(); ++j)
      if (layout.tensors[i].name.size() == layout.tensors[j].name.size()) {
        const auto& name = layout.tensors[i].name;
        std::copy(name.begin(), name.end(), bytes.begin() + layout.tensors[j].name_bytes.offset);
        expect_format_error(bytes, ErrorKind::DuplicateTensor, "duplicate tensor name '" + name + "'");
        return;
      }
  FAIL() << "no two tensor names of equal length";
}

TEST_F(Malformed, TensorDataPastEnd) {
  put<uint64_t>(bytes, layout.tensors.back().offset.offset, uint64_t{1} << 40);
  expect_format_error(bytes, ErrorKind::TensorOutOfFile, "lies outside the file");
}

TEST_F(Malformed, TensorOffsetMaxAligned) {
  put<uint64_t>(bytes, layout.tensors[0].offset.offset, UINT64_MAX & ~uint64_t{31});
  expect_format_error(bytes, ErrorKind::TensorOutOfFile, "'" + layout.tensors[0].name + "'");
}

TEST_F(Malformed, TensorEndPastEnd) {
  // Move the largest tensor so it starts inside the file but ends outside it.
  const uint64_t data_size = bytes.size() - layout.data_start;
  put<uint64_t>(bytes, layout.tensors[0].offset.offset, (data_size - 32) / 32 * 32);
  expect_format_error(bytes, ErrorKind::TensorOutOfFile, "'" + layout.tensors[0].name + "'");
}

TEST_F(Malformed, TensorMisaligned) {
  put<uint64_t>(bytes, layout.tensors[1].offset.offset, layout.tensors[1].data_offset + 4);
  expect_format_error(bytes, ErrorKind::TensorMisaligned, "is not a multiple of the alignment 32");
}

TEST_F(Malformed, TensorsOverlap) {
  put<uint64_t>(bytes, layout.tensors[1].offset.offset, layout.tensors[0].data_offset);
  expect_format_error(bytes, ErrorKind::TensorOverlap, "overlaps tensor");
}

TEST_F(Malformed, TensorsOverlapPartly) {
  // Find a tensor larger than one alignment unit and start another 32 bytes into it.
  const auto file = parse_bytes(original);
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const auto& info = file->tensor(layout.tensors[i].name);
    if (info.bytes > 64) {
      const size_t other = i == 0 ? 1 : 0;
      put<uint64_t>(bytes, layout.tensors[other].offset.offset, info.offset + 32);
      expect_format_error(bytes, ErrorKind::TensorOverlap, "overlaps");
      return;
    }
  }
  FAIL() << "no tensor larger than 64 bytes";
}

// --- truncation at every structural boundary -------------------------------------------------------------------

TEST_F(Malformed, TruncatedAtEveryBoundary) {
  std::set<uint64_t> cuts(layout.boundaries.begin(), layout.boundaries.end());
  for (uint64_t cut : layout.boundaries) {
    if (cut > 0) cuts.insert(cut - 1);
    cuts.insert(cut + 1);
  }
  cuts.insert(layout.data_start);
  cuts.insert(original.size() - 1);  // inside the last tensor's data
  int checked = 0;
  for (uint64_t cut : cuts) {
    if (cut >= original.size()) continue;
    std::vector<uint8_t> truncated(original.begin(), original.begin() + static_cast<long>(cut));
    try {
      parse_bytes(truncated);
      ADD_FAILURE() << "truncation at byte " << cut << " parsed";
    } catch (const gguf::FormatError& e) {
      const auto kind = e.kind();
      EXPECT_TRUE(kind == ErrorKind::Truncated || kind == ErrorKind::LengthPastEnd || kind == ErrorKind::CountTooLarge ||
                  kind == ErrorKind::TensorOutOfFile)
          << "cut at " << cut << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("test.gguf: "), std::string::npos);
    }
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

// Cut inside the fixed-size fields: the message says truncated and names the field.
TEST_F(Malformed, TruncatedInsideVersion) {
  bytes.resize(6);
  expect_format_error(bytes, ErrorKind::Truncated, "the version");
}

TEST_F(Malformed, TruncatedInsideTensorCount) {
  bytes.resize(12);
  expect_format_error(bytes, ErrorKind::Truncated, "the tensor count");
}

TEST_F(Malformed, TruncatedInsideValueType) {
  bytes.resize(layout.kvs[3].type.offset + 2);
  expect_format_error(bytes, ErrorKind::Truncated, "the type of key '" + layout.kvs[3].key + "'");
}

TEST_F(Malformed, TruncatedInsideDimension) {
  bytes.resize(layout.tensors.back().dims[0].offset + 3);
  expect_format_error(bytes, ErrorKind::Truncated, "dimension 0 of tensor '" + layout.tensors.back().name + "'");
}

TEST_F(Malformed, TruncatedInsideTensorData) {
  bytes.resize(bytes.size() - 100);
  expect_format_error(bytes, ErrorKind::TensorOutOfFile, "lies outside the file");
}

// On disk through open(): the same errors, and an empty file.
TEST_F(Malformed, OpenReportsPathOfTruncatedFile) {
  const std::string path = ::testing::TempDir() + "truncated.gguf";
  bytes.resize(layout.tensor_infos_end - 5);
  write_bytes(path, bytes);
  try {
    gguf::File::open(path);
    ADD_FAILURE() << "opened a truncated file";
  } catch (const gguf::FormatError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Truncated);
    EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
  }
  write_bytes(path, {});
  EXPECT_THROW(gguf::File::open(path), gguf::FormatError);
  std::remove(path.c_str());
}

TEST_F(Malformed, OpenMissingFile) {
  try {
    gguf::File::open("/nonexistent/model.gguf");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf: cannot open"), std::string::npos) << e.what();
  }
}

TEST_F(Malformed, OpenDirectory) { EXPECT_THROW(gguf::File::open("/tmp"), Error); }

// A quantized file: Q8_0 rows must be whole 32-element blocks.
TEST(MalformedQuantized, Q8RowNotWholeBlocks) {
  auto bytes = read_bytes(shared_path("models/TinyStories-656K-Q8_0.gguf"));
  const auto layout = map_layout(bytes);
  auto file = parse_bytes(bytes);
  for (const auto& t : layout.tensors)
    if (file->tensor(t.name).type() == TensorType::Q8_0) {
      put<uint64_t>(bytes, t.dims[0].offset, detail::u64_at(bytes, t.dims[0].offset) - 1);
      expect_format_error(bytes, ErrorKind::BadShape, "type Q8_0");
      return;
    }
  FAIL() << "no Q8_0 tensor";
}

}  // namespace
}  // namespace rf::test
