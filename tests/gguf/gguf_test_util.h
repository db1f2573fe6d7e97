// Byte-level helpers for building and corrupting GGUF files in tests.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf_layout.h"
#include "test_paths.h"

namespace rf::test {

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void put(std::vector<uint8_t>& bytes, uint64_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

// Appends GGUF encodings to a byte vector.
struct Encoder {
  std::vector<uint8_t> bytes;
  template <typename T>
  Encoder& scalar(T value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(T));
    return *this;
  }
  Encoder& string(std::string_view s) {
    scalar<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Encoder& type(gguf::ValueType t) { return scalar<uint32_t>(static_cast<uint32_t>(t)); }
};

// The file with one more key/value (already encoded: key, type, payload) after the existing ones; the
// tensor infos and data follow, re-aligned, so the result stays valid apart from what `kv` brings.
inline std::vector<uint8_t> with_key_value(const std::vector<uint8_t>& original, const std::vector<uint8_t>& kv) {
  const GgufLayout layout = map_layout(original);
  const uint64_t kv_end = layout.kvs.empty() ? 24 : layout.kvs.back().value.offset + layout.kvs.back().value.size;
  std::vector<uint8_t> out(original.begin(), original.begin() + static_cast<long>(kv_end));
  out.insert(out.end(), kv.begin(), kv.end());
  out.insert(out.end(), original.begin() + static_cast<long>(kv_end),
             original.begin() + static_cast<long>(layout.tensor_infos_end));
  if (!layout.tensors.empty()) {
    out.resize((out.size() + 31) / 32 * 32, 0);
    out.insert(out.end(), original.begin() + static_cast<long>(layout.data_start), original.end());
  }
  put<uint64_t>(out, 16, layout.kvs.size() + 1);
  return out;
}

inline std::unique_ptr<gguf::File> parse_bytes(const std::vector<uint8_t>& bytes) {
  return gguf::File::parse(bytes, "test.gguf");
}

// Expects parsing to fail with `kind`, and a message naming the file and containing `fragment`.
inline void expect_format_error(const std::vector<uint8_t>& bytes, gguf::ErrorKind kind, const std::string& fragment) {
  try {
    parse_bytes(bytes);
    ADD_FAILURE() << "parsed without error; expected " << gguf::error_kind_name(kind);
  } catch (const gguf::FormatError& e) {
    EXPECT_EQ(e.kind(), kind) << "got " << gguf::error_kind_name(e.kind()) << ": " << e.what();
    const std::string message = e.what();
    EXPECT_NE(message.find("test.gguf: "), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << "message lacks '" << fragment << "': " << message;
  }
}

}  // namespace rf::test
