#include "gguf/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>

namespace rf::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayNesting = 8;
constexpr uint64_t kMaxDims = 4;
// Smallest possible encodings, used to reject counts before allocating for them.
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;             // empty key, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;   // empty name, n_dims, one dim, type, offset

struct ValueTypeInfo {
  std::string_view name;
  uint64_t size;  // bytes of one scalar; for STRING and ARRAY the smallest encoding
};

constexpr ValueTypeInfo kValueTypes[] = {
    {"UINT8", 1}, {"INT8", 1},   {"UINT16", 2}, {"INT16", 2},  {"UINT32", 4}, {"INT32", 4},  {"FLOAT32", 4},
    {"BOOL", 1},  {"STRING", 8}, {"ARRAY", 12}, {"UINT64", 8}, {"INT64", 8},  {"FLOAT64", 8},
};

bool is_valid_value_type(uint32_t id) { return id < std::size(kValueTypes); }
uint64_t encoded_size(ValueType type) { return kValueTypes[static_cast<uint32_t>(type)].size; }

bool is_integer_type(ValueType type) {
  switch (type) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::UINT16: case ValueType::INT16:
    case ValueType::UINT32: case ValueType::INT32: case ValueType::UINT64: case ValueType::INT64:
      return true;
    default:
      return false;
  }
}

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace

std::string_view value_type_name(ValueType type) {
  const auto id = static_cast<uint32_t>(type);
  return is_valid_value_type(id) ? kValueTypes[id].name : "INVALID";
}

std::string_view error_kind_name(ErrorKind kind) {
  static constexpr std::string_view names[] = {
      "BadMagic", "UnsupportedVersion", "Truncated", "LengthPastEnd", "CountTooLarge", "InvalidValueType",
      "NestingTooDeep", "DuplicateKey", "BadAlignment", "InvalidTensorType", "InvalidDimCount",
      "ElementCountOverflow", "BadShape", "DuplicateTensor", "TensorOutOfFile", "TensorMisaligned",
      "TensorOverlap"};
  return names[static_cast<size_t>(kind)];
}

// ---------------------------------------------------------------------------------------------------------
// Value

bool Value::is_integer() const { return is_integer_type(type_); }

std::string Value::describe() const {
  if (type_ != ValueType::ARRAY) return std::string(value_type_name(type_));
  return fmt::format("an array of {}", value_type_name(element_type_));
}

template <typename T>
T Value::as() const {
  constexpr ValueType wanted = value_type_of<T>();
  if (type_ != wanted) fail("value has type {}, not {}", value_type_name(type_), value_type_name(wanted));
  if constexpr (std::is_same_v<T, std::string_view>) {
    return std::string_view(reinterpret_cast<const char*>(raw_.data()), raw_.size());
  } else if constexpr (std::is_same_v<T, std::string>) {
    return std::string(reinterpret_cast<const char*>(raw_.data()), raw_.size());
  } else if constexpr (std::is_same_v<T, bool>) {
    return raw_[0] != 0;
  } else {
    return load<T>(raw_.data());
  }
}

int64_t Value::to_int() const {
  switch (type_) {
    case ValueType::UINT8: return as<uint8_t>();
    case ValueType::INT8: return as<int8_t>();
    case ValueType::UINT16: return as<uint16_t>();
    case ValueType::INT16: return as<int16_t>();
    case ValueType::UINT32: return as<uint32_t>();
    case ValueType::INT32: return as<int32_t>();
    case ValueType::INT64: return as<int64_t>();
    case ValueType::UINT64: {
      const uint64_t value = as<uint64_t>();
      if (value > static_cast<uint64_t>(INT64_MAX)) fail("value {} does not fit in a signed 64-bit integer", value);
      return static_cast<int64_t>(value);
    }
    default: fail("value has type {}, not an integer", value_type_name(type_));
  }
}

double Value::to_double() const {
  if (type_ == ValueType::FLOAT32) return as<float>();
  if (type_ == ValueType::FLOAT64) return as<double>();
  if (type_ == ValueType::UINT64) return static_cast<double>(as<uint64_t>());  // may not fit to_int()
  if (is_integer()) return static_cast<double>(to_int());
  fail("value has type {}, not a number", value_type_name(type_));
}

std::string_view Value::str() const { return as<std::string_view>(); }

template <typename T>
std::vector<T> Value::array() const {
  constexpr ValueType wanted = value_type_of<T>();
  if (type_ != ValueType::ARRAY || element_type_ != wanted)
    fail("value is {}, not an array of {}", describe(), value_type_name(wanted));
  std::vector<T> out(count_);
  if constexpr (std::is_same_v<T, bool>) {
    for (uint64_t i = 0; i < count_; ++i) out[i] = raw_[i] != 0;
  } else if (count_ > 0) {  // an empty array has no bytes to copy from (memcpy from null is undefined)
    std::memcpy(out.data(), raw_.data(), count_ * sizeof(T));
  }
  return out;
}

const std::vector<std::string_view>& Value::strings() const {
  if (type_ != ValueType::ARRAY || element_type_ != ValueType::STRING)
    fail("value is {}, not an array of strings", describe());
  return strings_;
}

#define RF_GGUF_INSTANTIATE(T)        \
  template T Value::as<T>() const;     \
  template T File::get<T>(std::string_view) const;
RF_GGUF_NUMERIC_TYPES(RF_GGUF_INSTANTIATE)
RF_GGUF_INSTANTIATE(std::string_view)
RF_GGUF_INSTANTIATE(std::string)
#undef RF_GGUF_INSTANTIATE

#define RF_GGUF_INSTANTIATE_ARRAY(T) template std::vector<T> Value::array<T>() const;
RF_GGUF_NUMERIC_TYPES(RF_GGUF_INSTANTIATE_ARRAY)
#undef RF_GGUF_INSTANTIATE_ARRAY

// ---------------------------------------------------------------------------------------------------------
// Parser: a cursor over the file's bytes that checks every read against the end of the file.

class Parser {
 public:
  explicit Parser(File& file) : file_(file), bytes_(file.bytes_), name_(file.name_) {}

  void parse() {
    parse_header();
    parse_metadata();
    parse_alignment();
    parse_tensor_infos();
    file_.data_offset_ = align_up(pos_, file_.alignment_);
    validate_tensor_data();
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) const {
    throw FormatError(kind, fmt::format("{}: {}", name_, fmt::format(format, std::forward<Args>(args)...)));
  }

  uint64_t remaining() const { return bytes_.size() - pos_; }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining())
      error(ErrorKind::Truncated, "truncated at byte {} while reading {} ({} bytes needed, {} left)", pos_, what, n,
            remaining());
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T value = load<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return value;
  }

  std::span<const uint8_t> take(uint64_t n) {
    auto span = bytes_.subspan(pos_, n);
    pos_ += n;
    return span;
  }

  std::string_view read_string(std::string_view what) {
    const uint64_t at = pos_;
    const uint64_t length = read<uint64_t>(what);
    if (length > remaining())
      error(ErrorKind::LengthPastEnd, "{} at byte {} has length {}, past the end of the file ({} bytes left)", what,
            at, length, remaining());
    auto span = take(length);
    return {reinterpret_cast<const char*>(span.data()), span.size()};
  }

  // Rejects `count` items of at least `min_bytes` each that cannot fit in what is left of the file, before
  // anything is allocated for them.
  void check_count(uint64_t count, uint64_t min_bytes, uint64_t at, std::string_view what) const {
    if (count > remaining() / min_bytes)
      error(ErrorKind::CountTooLarge, "{} at byte {} is {}, more than the {} bytes left in the file can hold", what,
            at, count, remaining());
  }

  ValueType read_value_type(std::string_view what) {
    const uint64_t at = pos_;
    const uint32_t id = read<uint32_t>(what);
    if (!is_valid_value_type(id)) error(ErrorKind::InvalidValueType, "invalid value type id {} at byte {} ({})", id, at, what);
    return static_cast<ValueType>(id);
  }

  void parse_header() {
    need(4, "the magic");
    if (load<uint32_t>(bytes_.data()) != kMagic) {
      std::string found;
      for (int i = 0; i < 4; ++i) found += fmt::format("{:02x}", bytes_[i]);
      error(ErrorKind::BadMagic, "not a GGUF file (magic bytes are {}, expected 47475546 \"GGUF\")", found);
    }
    pos_ = 4;
    const uint32_t version = read<uint32_t>("the version");
    if (version == 1) error(ErrorKind::UnsupportedVersion, "GGUF version 1 is not supported (versions 2 and 3 are)");
    if (version != 2 && version != 3) {
      if (__builtin_bswap32(version) == 2 || __builtin_bswap32(version) == 3)
        error(ErrorKind::UnsupportedVersion, "big-endian GGUF files are not supported");
      error(ErrorKind::UnsupportedVersion, "unsupported GGUF version {} (versions 2 and 3 are supported)", version);
    }
    file_.version_ = version;
    tensor_count_at_ = pos_;
    tensor_count_ = read<uint64_t>("the tensor count");
    kv_count_at_ = pos_;
    kv_count_ = read<uint64_t>("the key/value count");
  }

  void parse_metadata() {
    check_count(kv_count_, kMinKeyValueBytes, kv_count_at_, "the key/value count");
    file_.metadata_.reserve(kv_count_);
    file_.key_index_.reserve(kv_count_);
    for (uint64_t i = 0; i < kv_count_; ++i) {
      const uint64_t at = pos_;
      KeyValue kv{read_string(fmt::format("the key of key/value {}", i)), Value{}, at};
      const std::string what = fmt::format("key '{}'", kv.key);
      kv.value.type_ = read_value_type(fmt::format("the type of {}", what));
      parse_value(kv.value, what, 0);
      if (!file_.key_index_.emplace(kv.key, file_.metadata_.size()).second)
        error(ErrorKind::DuplicateKey, "duplicate key '{}' at byte {}", kv.key, at);
      file_.metadata_.push_back(std::move(kv));
    }
  }

  // Reads the payload of a value whose type_ is already set.
  void parse_value(Value& value, const std::string& what, int depth) {
    if (value.type_ == ValueType::STRING) {
      value.raw_ = as_bytes(read_string(fmt::format("the string of {}", what)));
      return;
    }
    if (value.type_ != ValueType::ARRAY) {
      const uint64_t size = encoded_size(value.type_);
      need(size, fmt::format("the value of {}", what));
      value.raw_ = take(size);
      return;
    }
    if (depth >= kMaxArrayNesting)
      error(ErrorKind::NestingTooDeep, "{} nests arrays more than {} deep at byte {}", what, kMaxArrayNesting, pos_);
    value.element_type_ = read_value_type(fmt::format("the element type of {}", what));
    const uint64_t count_at = pos_;
    value.count_ = read<uint64_t>(fmt::format("the length of {}", what));
    check_count(value.count_, encoded_size(value.element_type_), count_at, fmt::format("the length of {}", what));
    switch (value.element_type_) {
      case ValueType::STRING: {
        value.strings_.reserve(value.count_);
        for (uint64_t i = 0; i < value.count_; ++i) value.strings_.push_back(read_string_item(what, i));
        break;
      }
      case ValueType::ARRAY: {
        value.items_.resize(value.count_);
        for (uint64_t i = 0; i < value.count_; ++i) {
          value.items_[i].type_ = ValueType::ARRAY;
          parse_value(value.items_[i], fmt::format("item {} of {}", i, what), depth + 1);
        }
        break;
      }
      default:
        value.raw_ = take(value.count_ * encoded_size(value.element_type_));  // fits: checked by check_count
    }
  }

  // Array strings are the bulk of a vocabulary (hundreds of thousands): the message is formatted only on error.
  std::string_view read_string_item(const std::string& what, uint64_t index) {
    if (remaining() < 8 || load<uint64_t>(bytes_.data() + pos_) > remaining() - 8)
      return read_string(fmt::format("string {} of {}", index, what));  // reports the precise error
    const uint64_t length = load<uint64_t>(bytes_.data() + pos_);
    pos_ += 8;
    auto span = take(length);
    return {reinterpret_cast<const char*>(span.data()), span.size()};
  }

  static std::span<const uint8_t> as_bytes(std::string_view s) {
    return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
  }

  void parse_alignment() {
    const Value* alignment = file_.find("general.alignment");
    if (!alignment) return;
    if (alignment->type() != ValueType::UINT32)
      error(ErrorKind::BadAlignment, "general.alignment has type {}, expected UINT32", value_type_name(alignment->type()));
    const uint32_t value = alignment->as<uint32_t>();
    if (value == 0 || !std::has_single_bit(value))
      error(ErrorKind::BadAlignment, "general.alignment is {}, not a power of two", value);
    file_.alignment_ = value;
  }

  void parse_tensor_infos() {
    check_count(tensor_count_, kMinTensorInfoBytes, tensor_count_at_, "the tensor count");
    file_.tensors_.reserve(tensor_count_);
    file_.tensor_index_.reserve(tensor_count_);
    for (uint64_t i = 0; i < tensor_count_; ++i) {
      const uint64_t at = pos_;
      TensorInfo info{};
      info.name = read_string(fmt::format("the name of tensor {}", i));
      const std::string what = fmt::format("tensor '{}'", info.name);
      info.n_dims = read<uint32_t>(fmt::format("the dimension count of {}", what));
      if (info.n_dims == 0 || info.n_dims > kMaxDims)
        error(ErrorKind::InvalidDimCount, "{} at byte {} has {} dimensions (1 to {} are allowed)", what, at,
              info.n_dims, kMaxDims);
      info.ne = {1, 1, 1, 1};
      uint64_t elements = 1;
      for (uint32_t d = 0; d < info.n_dims; ++d) {
        info.ne[d] = read<uint64_t>(fmt::format("dimension {} of {}", d, what));
        if (info.ne[d] > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(elements, info.ne[d], &elements) ||
            elements > static_cast<uint64_t>(INT64_MAX))
          error(ErrorKind::ElementCountOverflow, "{} has dimensions whose element count overflows", what);
      }
      const uint64_t type_at = pos_;
      const uint32_t type_id = read<uint32_t>(fmt::format("the type of {}", what));
      info.type_info = find_tensor_type(type_id);
      if (!info.type_info)
        error(ErrorKind::InvalidTensorType, "{} has invalid tensor type id {} at byte {}", what, type_id, type_at);
      if (info.ne[0] % info.type_info->block_elements != 0)
        error(ErrorKind::BadShape, "{} of type {} has {} elements per row, not a multiple of its block size {}", what,
              info.type_info->name, info.ne[0], info.type_info->block_elements);
      if (__builtin_mul_overflow(elements / info.type_info->block_elements, info.type_info->block_bytes, &info.bytes))
        error(ErrorKind::ElementCountOverflow, "{} is too large: its byte count overflows", what);
      info.offset = read<uint64_t>(fmt::format("the data offset of {}", what));
      if (!file_.tensor_index_.emplace(info.name, file_.tensors_.size()).second)
        error(ErrorKind::DuplicateTensor, "duplicate tensor name '{}' at byte {}", info.name, at);
      file_.tensors_.push_back(info);
    }
  }

  static uint64_t align_up(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

  void validate_tensor_data() {
    const uint64_t data_size = bytes_.size() >= file_.data_offset_ ? bytes_.size() - file_.data_offset_ : 0;
    for (const TensorInfo& info : file_.tensors_) {
      if (info.offset % file_.alignment_ != 0)
        error(ErrorKind::TensorMisaligned, "tensor '{}' data offset {} is not a multiple of the alignment {}", info.name,
              info.offset, file_.alignment_);
      if (info.offset > data_size || info.bytes > data_size - info.offset)
        error(ErrorKind::TensorOutOfFile,
              "tensor '{}' data [{}, +{}) lies outside the file (data section of {} bytes starts at byte {})", info.name,
              info.offset, info.bytes, data_size, file_.data_offset_);
    }
    std::vector<const TensorInfo*> by_offset;
    by_offset.reserve(file_.tensors_.size());
    for (const TensorInfo& info : file_.tensors_) by_offset.push_back(&info);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const TensorInfo& previous = *by_offset[i - 1];
      const TensorInfo& current = *by_offset[i];
      if (previous.offset + previous.bytes > current.offset)
        error(ErrorKind::TensorOverlap, "tensor '{}' data [{}, +{}) overlaps tensor '{}' at offset {}", previous.name,
              previous.offset, previous.bytes, current.name, current.offset);
    }
  }

  File& file_;
  std::span<const uint8_t> bytes_;
  const std::string& name_;
  uint64_t pos_ = 0;
  uint64_t tensor_count_ = 0, kv_count_ = 0;
  uint64_t tensor_count_at_ = 0, kv_count_at_ = 0;
};

// ---------------------------------------------------------------------------------------------------------
// File

std::unique_ptr<File> File::open(const std::string& path) {
  auto mapping = std::make_unique<MappedFile>(path);
  auto file = parse(mapping->bytes(), path);
  file->mapping_ = std::move(mapping);
  return file;
}

std::unique_ptr<File> File::parse(std::span<const uint8_t> bytes, const std::string& name) {
  auto file = std::unique_ptr<File>(new File());
  file->bytes_ = bytes;
  file->name_ = name;
  Parser(*file).parse();
  return file;
}

const Value* File::find(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].value;
}

const Value& File::get_value(std::string_view key) const {
  const Value* value = find(key);
  if (!value) fail("{}: missing key '{}'", name_, key);
  return *value;
}

template <typename T>
T File::get(std::string_view key) const {
  const Value& value = get_value(key);
  if (value.type() != value_type_of<T>())
    fail("{}: key '{}' has type {}, expected {}", name_, key, value_type_name(value.type()),
         value_type_name(value_type_of<T>()));
  return value.as<T>();
}

int64_t File::get_int(std::string_view key) const {
  const Value& value = get_value(key);
  if (!value.is_integer())
    fail("{}: key '{}' has type {}, expected an integer", name_, key, value_type_name(value.type()));
  try {
    return value.to_int();
  } catch (const Error& e) {
    fail("{}: key '{}': {}", name_, key, e.what());
  }
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
  const TensorInfo* info = find_tensor(name);
  if (!info) fail("{}: missing tensor '{}'", name_, name);
  return *info;
}

uint64_t File::parameter_count() const {
  uint64_t count = 0;
  for (const TensorInfo& info : tensors_) count += info.elements();
  return count;
}

uint64_t File::tensor_bytes() const {
  uint64_t bytes = 0;
  for (const TensorInfo& info : tensors_) bytes += info.bytes;
  return bytes;
}

std::string_view File::architecture() const {
  const Value* value = find("general.architecture");
  return value && value->type() == ValueType::STRING ? value->str() : std::string_view{};
}

}  // namespace rf::gguf
