// Test-side map of a GGUF file's structure, walked independently of the parser under test, so corruptions
// can be aimed at exact fields of real files: every structural boundary, every length, count and type id.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace rf::test {

struct FieldAt {
  uint64_t offset;  // where the field starts
  uint64_t size;    // its encoded size
};

struct KeyValueLayout {
  std::string key;
  FieldAt key_length, key_bytes, type, value;  // value covers the whole payload
  uint32_t value_type;
  FieldAt array_element_type{}, array_count{};  // arrays only
  FieldAt first_string_length{};                // arrays of strings only
};

struct TensorLayout {
  std::string name;
  FieldAt name_length, name_bytes, n_dims;
  std::vector<FieldAt> dims;
  FieldAt type, offset;
  uint64_t data_offset;  // relative, as stored
};

struct GgufLayout {
  FieldAt magic{0, 4}, version{4, 4}, tensor_count{8, 8}, kv_count{16, 8};
  std::vector<KeyValueLayout> kvs;
  std::vector<TensorLayout> tensors;
  uint64_t tensor_infos_end = 0;
  uint64_t data_start = 0;
  // Every offset at which a structure starts or ends (truncation points), ascending.
  std::vector<uint64_t> boundaries;
};

namespace detail {
inline uint64_t u64_at(const std::vector<uint8_t>& b, uint64_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
inline uint32_t u32_at(const std::vector<uint8_t>& b, uint64_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
inline uint64_t scalar_size(uint32_t type) {
  static const uint64_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return sizes[type];
}
// Skips one value of `type` at `at`, recording string/array boundaries; returns the end offset.
inline uint64_t skip_value(const std::vector<uint8_t>& b, uint32_t type, uint64_t at, std::vector<uint64_t>& marks) {
  if (type == 8) {
    marks.push_back(at + 8);
    return at + 8 + u64_at(b, at);
  }
  if (type != 9) return at + scalar_size(type);
  const uint32_t element_type = u32_at(b, at);
  const uint64_t count = u64_at(b, at + 4);
  marks.push_back(at + 4);
  marks.push_back(at + 12);
  uint64_t pos = at + 12;
  if (element_type != 8 && element_type != 9) return pos + count * scalar_size(element_type);
  for (uint64_t i = 0; i < count; ++i) {
    // Marking every element of a 32000-entry vocabulary adds nothing; the first few cover the structure.
    std::vector<uint64_t> ignored;
    pos = skip_value(b, element_type, pos, i < 2 ? marks : ignored);
    if (i < 2) marks.push_back(pos);
  }
  return pos;
}
}  // namespace detail

inline GgufLayout map_layout(const std::vector<uint8_t>& b, uint64_t alignment = 32) {
  using namespace detail;
  GgufLayout layout;
  auto& marks = layout.boundaries;
  marks = {0, 4, 8, 16, 24};
  const uint64_t tensor_count = u64_at(b, 8);
  const uint64_t kv_count = u64_at(b, 16);
  uint64_t pos = 24;
  for (uint64_t i = 0; i < kv_count; ++i) {
    KeyValueLayout kv;
    const uint64_t key_length = u64_at(b, pos);
    kv.key_length = {pos, 8};
    kv.key_bytes = {pos + 8, key_length};
    kv.key.assign(reinterpret_cast<const char*>(b.data() + pos + 8), key_length);
    pos += 8 + key_length;
    marks.push_back(pos);
    kv.type = {pos, 4};
    kv.value_type = u32_at(b, pos);
    pos += 4;
    marks.push_back(pos);
    if (kv.value_type == 9) {
      kv.array_element_type = {pos, 4};
      kv.array_count = {pos + 4, 8};
      if (u32_at(b, pos) == 8) kv.first_string_length = {pos + 12, 8};
    }
    const uint64_t end = skip_value(b, kv.value_type, pos, marks);
    kv.value = {pos, end - pos};
    pos = end;
    marks.push_back(pos);
    layout.kvs.push_back(kv);
  }
  for (uint64_t i = 0; i < tensor_count; ++i) {
    TensorLayout t;
    const uint64_t name_length = u64_at(b, pos);
    t.name_length = {pos, 8};
    t.name_bytes = {pos + 8, name_length};
    t.name.assign(reinterpret_cast<const char*>(b.data() + pos + 8), name_length);
    pos += 8 + name_length;
    marks.push_back(pos);
    t.n_dims = {pos, 4};
    const uint32_t n_dims = u32_at(b, pos);
    pos += 4;
    marks.push_back(pos);
    for (uint32_t d = 0; d < n_dims; ++d) {
      t.dims.push_back({pos, 8});
      pos += 8;
      marks.push_back(pos);
    }
    t.type = {pos, 4};
    pos += 4;
    marks.push_back(pos);
    t.offset = {pos, 8};
    t.data_offset = u64_at(b, pos);
    pos += 8;
    marks.push_back(pos);
    layout.tensors.push_back(t);
  }
  layout.tensor_infos_end = pos;
  layout.data_start = (pos + alignment - 1) / alignment * alignment;
  return layout;
}

}  // namespace rf::test
