// Reading GGUF files (versions 2 and 3, little-endian). Opening maps the file and parses the header, the
// key/values and the tensor infos; no tensor byte is read or touched. Everything a file claims is validated
// at open, and a violation is a FormatError that names the file, what is wrong and where.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "gguf/tensor_type.h"
#include "util/error.h"
#include "util/mapped_file.h"

namespace rf::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view value_type_name(ValueType type);

// What exactly is wrong with a file; tests and tools can tell errors apart by it.
enum class ErrorKind {
  BadMagic, UnsupportedVersion, Truncated, LengthPastEnd, CountTooLarge, InvalidValueType, NestingTooDeep,
  DuplicateKey, BadAlignment, InvalidTensorType, InvalidDimCount, ElementCountOverflow, BadShape,
  DuplicateTensor, TensorOutOfFile, TensorMisaligned, TensorOverlap,
};
std::string_view error_kind_name(ErrorKind kind);

class FormatError : public Error {
 public:
  FormatError(ErrorKind kind, const std::string& message) : Error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// One metadata value. Strings and numeric arrays are views into the mapped file; string arrays are a vector
// of views; arrays of arrays hold their items.
class Value {
 public:
  ValueType type() const { return type_; }
  bool is_array() const { return type_ == ValueType::ARRAY; }
  bool is_integer() const;
  // "UINT32", "an array of STRING": the type as messages name it.
  std::string describe() const;

  // Scalars. as<T>() requires the stored type to be exactly T's GGUF type (uint8_t..double, bool,
  // std::string_view); to_int / to_double accept any integer / numeric type.
  template <typename T>
  T as() const;
  int64_t to_int() const;
  double to_double() const;
  std::string_view str() const;  // requires STRING

  // Arrays.
  ValueType element_type() const { return element_type_; }
  uint64_t size() const { return count_; }
  template <typename T>
  std::vector<T> array() const;                             // numeric arrays of exactly T
  const std::vector<std::string_view>& strings() const;     // arrays of strings
  const std::vector<Value>& items() const { return items_; }  // arrays of arrays
  std::span<const uint8_t> raw() const { return raw_; }      // numeric array bytes / scalar bytes

 private:
  friend class Parser;
  ValueType type_ = ValueType::UINT8;
  ValueType element_type_ = ValueType::UINT8;
  uint64_t count_ = 0;
  std::span<const uint8_t> raw_;
  std::vector<std::string_view> strings_;
  std::vector<Value> items_;
};

struct KeyValue {
  std::string_view key;
  Value value;
  uint64_t offset;  // file offset of the key, for messages
};

struct TensorInfo {
  std::string_view name;
  const TensorTypeInfo* type_info;  // never null: unknown ids are rejected at open
  uint32_t n_dims;
  std::array<uint64_t, 4> ne;  // GGUF order, ne[0] is the contiguous dimension; 1 beyond n_dims
  uint64_t offset;             // relative to the data section, as stored
  uint64_t bytes;

  TensorType type() const { return type_info->type; }
  uint64_t elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  uint64_t rows() const { return ne[1] * ne[2] * ne[3]; }
  std::vector<uint64_t> shape() const { return {ne.begin(), ne.begin() + n_dims}; }
};

class File {
 public:
  // Maps and parses a file.
  static std::unique_ptr<File> open(const std::string& path);
  // Parses bytes the caller keeps alive (fuzzing, tests); `name` is used in messages.
  static std::unique_ptr<File> parse(std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return bytes_.size(); }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::vector<KeyValue>& metadata() const { return metadata_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // The value of `key` as exactly T; a missing key or another type is an Error naming the key.
  template <typename T>
  T get(std::string_view key) const;
  template <typename T>
  T get_or(std::string_view key, T fallback) const {
    return has(key) ? get<T>(key) : fallback;
  }
  // Any integer type (files disagree on u32 vs u64 for counts); missing or non-integer is an Error.
  int64_t get_int(std::string_view key) const;
  const Value& get_value(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  const TensorInfo& tensor(std::string_view name) const;  // Error "missing tensor 'name'"
  // The tensor's bytes in the mapping; taking the span reads nothing.
  std::span<const uint8_t> tensor_data(const TensorInfo& info) const {
    return bytes_.subspan(data_offset_ + info.offset, info.bytes);
  }
  const MappedFile* mapping() const { return mapping_.get(); }

  // Elements and bytes of all tensors together (the parameter count and the size of the weights).
  uint64_t parameter_count() const;
  uint64_t tensor_bytes() const;

  // "llama", from general.architecture ("" when absent).
  std::string_view architecture() const;

 private:
  friend class Parser;
  std::unique_ptr<MappedFile> mapping_;
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> key_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

// Calls X(T) for every numeric C++ type a GGUF value can have: the explicit instantiations of the reader's
// and the writer's typed templates.
#define RF_GGUF_NUMERIC_TYPES(X) \
  X(uint8_t) X(int8_t) X(uint16_t) X(int16_t) X(uint32_t) X(int32_t) X(uint64_t) X(int64_t) X(float) X(double) X(bool)

// Value type of a C++ type, for typed accessors and the writer.
template <typename T>
constexpr ValueType value_type_of() {
  if constexpr (std::is_same_v<T, uint8_t>) return ValueType::UINT8;
  else if constexpr (std::is_same_v<T, int8_t>) return ValueType::INT8;
  else if constexpr (std::is_same_v<T, uint16_t>) return ValueType::UINT16;
  else if constexpr (std::is_same_v<T, int16_t>) return ValueType::INT16;
  else if constexpr (std::is_same_v<T, uint32_t>) return ValueType::UINT32;
  else if constexpr (std::is_same_v<T, int32_t>) return ValueType::INT32;
  else if constexpr (std::is_same_v<T, float>) return ValueType::FLOAT32;
  else if constexpr (std::is_same_v<T, bool>) return ValueType::BOOL;
  else if constexpr (std::is_same_v<T, std::string_view> || std::is_same_v<T, std::string>) return ValueType::STRING;
  else if constexpr (std::is_same_v<T, uint64_t>) return ValueType::UINT64;
  else if constexpr (std::is_same_v<T, int64_t>) return ValueType::INT64;
  else if constexpr (std::is_same_v<T, double>) return ValueType::FLOAT64;
  else static_assert(sizeof(T) == 0, "not a GGUF value type");
}

}  // namespace rf::gguf
