#include "gguf/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "util/error.h"

namespace rf::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF is little-endian; values are copied as they are");

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" as a little-endian u32
constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr std::string_view kAlignmentKey = "general.alignment";

void put_bytes(std::vector<uint8_t>& out, const void* bytes, size_t size) {
  const size_t at = out.size();
  out.resize(at + size);
  if (size > 0) std::memcpy(out.data() + at, bytes, size);
}

void put_bytes(std::vector<uint8_t>& out, std::span<const uint8_t> bytes) { put_bytes(out, bytes.data(), bytes.size()); }

template <typename T>
void put(std::vector<uint8_t>& out, T value) {
  put_bytes(out, &value, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

void put_type(std::vector<uint8_t>& out, ValueType type) { put<uint32_t>(out, static_cast<uint32_t>(type)); }

// Everything after a value's type id. An array item of an array of arrays is encoded the same way.
void put_payload(std::vector<uint8_t>& out, const Value& value) {
  if (value.type() == ValueType::STRING) return put_string(out, value.str());
  if (!value.is_array()) return put_bytes(out, value.raw());
  put_type(out, value.element_type());
  put<uint64_t>(out, value.size());
  if (value.element_type() == ValueType::STRING) {
    for (std::string_view s : value.strings()) put_string(out, s);
  } else if (value.element_type() == ValueType::ARRAY) {
    for (const Value& item : value.items()) put_payload(out, item);
  } else {
    put_bytes(out, value.raw());
  }
}

uint64_t align_up(uint64_t value, uint64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

// A file written through a buffer; every failed system call is an Error naming the file.
class OutputFile {
 public:
  explicit OutputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("{}: cannot create: {}", path, std::strerror(errno));
    buffer_.reserve(kBufferBytes);
  }
  ~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(std::span<const uint8_t> bytes) {
    if (buffer_.size() + bytes.size() > kBufferBytes) flush();
    if (bytes.size() >= kBufferBytes) return write_through(bytes);
    buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
  }

  void write_zeros(uint64_t count) {
    static constexpr uint8_t zeros[256] = {};
    for (; count > 0; count -= std::min<uint64_t>(count, sizeof(zeros)))
      write({zeros, std::min<uint64_t>(count, sizeof(zeros))});
  }

  void truncate(uint64_t size) {
    flush();
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
      fail("{}: cannot extend to {} bytes: {}", path_, size, std::strerror(errno));
  }

  void close() {
    flush();
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("{}: cannot write: {}", path_, std::strerror(errno));
  }

 private:
  static constexpr size_t kBufferBytes = 4 << 20;

  void flush() {
    write_through(buffer_);
    buffer_.clear();
  }

  void write_through(std::span<const uint8_t> bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("{}: cannot write: {}", path_, std::strerror(errno));
      bytes = bytes.subspan(static_cast<size_t>(n));
    }
  }

  std::string path_;
  int fd_ = -1;
  std::vector<uint8_t> buffer_;
};

}  // namespace

template <typename T>
void Writer::set(std::string_view key, T value) {
  std::vector<uint8_t> encoded;
  put_type(encoded, value_type_of<T>());
  put<T>(encoded, value);
  set_encoded(key, std::move(encoded));
}

void Writer::set_string(std::string_view key, std::string_view value) {
  std::vector<uint8_t> encoded;
  put_type(encoded, ValueType::STRING);
  put_string(encoded, value);
  set_encoded(key, std::move(encoded));
}

template <typename T>
void Writer::set_array(std::string_view key, std::span<const T> values) {
  std::vector<uint8_t> encoded;
  put_type(encoded, ValueType::ARRAY);
  put_type(encoded, value_type_of<T>());
  put<uint64_t>(encoded, values.size());
  for (const T& value : values) put<T>(encoded, value);
  set_encoded(key, std::move(encoded));
}

void Writer::set_string_array(std::string_view key, std::span<const std::string> values) {
  std::vector<uint8_t> encoded;
  put_type(encoded, ValueType::ARRAY);
  put_type(encoded, ValueType::STRING);
  put<uint64_t>(encoded, values.size());
  for (const std::string& s : values) put_string(encoded, s);
  set_encoded(key, std::move(encoded));
}

void Writer::set_value(std::string_view key, const Value& value) {
  std::vector<uint8_t> encoded;
  put_type(encoded, value.type());
  put_payload(encoded, value);
  set_encoded(key, std::move(encoded));
}

#define RF_GGUF_INSTANTIATE(T)                                 \
  template void Writer::set<T>(std::string_view key, T value); \
  template void Writer::set_array<T>(std::string_view key, std::span<const T> values);
RF_GGUF_NUMERIC_TYPES(RF_GGUF_INSTANTIATE)
#undef RF_GGUF_INSTANTIATE

void Writer::set_encoded(std::string_view key, std::vector<uint8_t> value) {
  auto it = std::ranges::find(metadata_, key, &KeyValue::key);
  if (it != metadata_.end()) {
    it->value = std::move(value);
  } else {
    metadata_.push_back({std::string(key), std::move(value)});
  }
}

bool Writer::remove(std::string_view key) { return std::erase_if(metadata_, [&](auto& kv) { return kv.key == key; }) > 0; }

void Writer::add_tensor(std::string name, TensorType type, std::vector<uint64_t> shape, TensorProducer producer) {
  if (std::ranges::find(tensors_, name, &Tensor::name) != tensors_.end()) fail("tensor '{}' is added twice", name);
  if (shape.empty() || shape.size() > 4)
    fail("tensor '{}' has {} dimensions (1 to 4 are allowed)", name, shape.size());
  const TensorTypeInfo& info = tensor_type_info(type);
  uint64_t elements = 1;
  for (uint64_t dim : shape)
    if (dim == 0 || __builtin_mul_overflow(elements, dim, &elements) || elements > uint64_t{INT64_MAX})
      fail("tensor '{}' has an invalid shape (a dimension is 0 or the element count overflows)", name);
  if (shape[0] % info.block_elements != 0)
    fail("tensor '{}' of type {} has rows of {} elements, not a whole number of {}-element blocks", name, info.name,
         shape[0], info.block_elements);
  const uint64_t bytes = elements / info.block_elements * info.block_bytes;
  tensors_.push_back({std::move(name), type, std::move(shape), bytes, std::move(producer)});
}

uint64_t Writer::alignment() const {
  auto it = std::ranges::find(metadata_, kAlignmentKey, &KeyValue::key);
  if (it == metadata_.end()) return kDefaultAlignment;
  uint32_t type, value = 0;
  std::memcpy(&type, it->value.data(), sizeof(type));
  if (type != static_cast<uint32_t>(ValueType::UINT32))
    fail("{} must be a UINT32, not {}", kAlignmentKey, value_type_name(static_cast<ValueType>(type)));
  std::memcpy(&value, it->value.data() + sizeof(type), sizeof(value));
  if (!std::has_single_bit(value)) fail("{} is {}, not a power of two", kAlignmentKey, value);
  return value;
}

Writer::Layout Writer::layout() const {
  const uint64_t alignment = this->alignment();
  Layout layout;
  std::vector<uint8_t>& header = layout.header;
  put<uint32_t>(header, kMagic);
  put<uint32_t>(header, kVersion);
  put<uint64_t>(header, tensors_.size());
  put<uint64_t>(header, metadata_.size());
  for (const KeyValue& kv : metadata_) {
    put_string(header, kv.key);
    put_bytes(header, kv.value);
  }
  uint64_t offset = 0;
  for (const Tensor& tensor : tensors_) {
    put_string(header, tensor.name);
    put<uint32_t>(header, static_cast<uint32_t>(tensor.shape.size()));
    for (uint64_t dim : tensor.shape) put<uint64_t>(header, dim);
    put<uint32_t>(header, static_cast<uint32_t>(tensor.type));
    put<uint64_t>(header, offset);
    layout.offsets.push_back(offset);
    offset += align_up(tensor.bytes, alignment);  // every tensor is padded, the last one too, as llama.cpp does
  }
  header.resize(align_up(header.size(), alignment), 0);
  layout.size = header.size() + offset;
  return layout;
}

uint64_t Writer::file_size() const { return layout().size; }

void Writer::write(const std::string& path) const { write_file(path, true); }

void Writer::write_without_data(const std::string& path) const { write_file(path, false); }

void Writer::write_file(const std::string& path, bool with_data) const {
  if (with_data)
    for (const Tensor& tensor : tensors_)
      if (!tensor.producer) fail("tensor '{}' has no data to write", tensor.name);
  const Layout layout = this->layout();
  const uint64_t alignment = this->alignment();
  const std::string temporary = path + ".partial";
  try {
    OutputFile out(temporary);
    out.write(layout.header);
    if (with_data) {
      for (const Tensor& tensor : tensors_) {
        uint64_t written = 0;
        const ByteSink sink = [&](std::span<const uint8_t> bytes) {
          if (bytes.size() > tensor.bytes - written)
            fail("tensor '{}': its producer wrote more than the tensor's {} bytes", tensor.name, tensor.bytes);
          written += bytes.size();
          out.write(bytes);
        };
        tensor.producer(sink);
        if (written != tensor.bytes)
          fail("tensor '{}': its producer wrote {} of the tensor's {} bytes", tensor.name, written, tensor.bytes);
        out.write_zeros(align_up(tensor.bytes, alignment) - tensor.bytes);
      }
    } else {
      out.truncate(layout.size);
    }
    out.close();
    if (std::rename(temporary.c_str(), path.c_str()) != 0)
      fail("{}: cannot rename {} to it: {}", path, temporary, std::strerror(errno));
  } catch (...) {
    std::remove(temporary.c_str());
    throw;
  }
}

}  // namespace rf::gguf
