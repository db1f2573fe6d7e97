// Writing GGUF version 3 files. Key/values are encoded when they are set, so a writer never points into the
// file a value was copied from. Tensors are declared up front with a producer that streams their bytes when
// the file is written: a multi-GB model never sits in memory, and the layout (llama.cpp's: each tensor at the
// next multiple of general.alignment, default 32) is known before the first byte is written.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/tensor_type.h"

namespace rf::gguf {

// Takes the next bytes of a tensor, in order, in chunks of any size.
using ByteSink = std::function<void(std::span<const uint8_t> bytes)>;
// Writes all of one tensor's bytes to the sink; called once by each write().
using TensorProducer = std::function<void(const ByteSink& sink)>;

class Writer {
 public:
  // Setting a key that is already set replaces its value in place (its position in the file stays).
  // T is one of the GGUF scalar types: uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, uint64_t,
  // int64_t, float, double, bool. Strings have their own setter, so a literal is never taken for a bool.
  template <typename T>
  void set(std::string_view key, T value);
  void set_string(std::string_view key, std::string_view value);
  template <typename T>
  void set_array(std::string_view key, std::span<const T> values);
  void set_string_array(std::string_view key, std::span<const std::string> values);
  // A value read from a File, of any type, arrays of arrays included.
  void set_value(std::string_view key, const Value& value);
  bool remove(std::string_view key);

  // `shape` is in GGUF order (ne0, the row length, first), 1 to 4 dimensions; ne0 must be a whole number of
  // blocks of `type`. The producer must write exactly the tensor's byte count. A tensor without a producer
  // can only be written by write_without_data.
  void add_tensor(std::string name, TensorType type, std::vector<uint64_t> shape, TensorProducer producer);

  // general.alignment when set (it must be a UINT32 power of two), else 32.
  uint64_t alignment() const;
  // Bytes of the file that write() produces.
  uint64_t file_size() const;

  // Writes `path` through a temporary file next to it that replaces `path` only once complete, so a failed
  // write leaves no half file behind.
  void write(const std::string& path) const;
  // Writes the header, key/values and tensor infos, then extends the file to its full size without writing
  // tensor data: a sparse file whose tensors read as zeros (for measuring open and inspect on huge models).
  void write_without_data(const std::string& path) const;

 private:
  struct KeyValue {
    std::string key;
    std::vector<uint8_t> value;  // type id and payload, exactly as stored in the file
  };
  struct Tensor {
    std::string name;
    TensorType type;
    std::vector<uint64_t> shape;
    uint64_t bytes;
    TensorProducer producer;
  };
  struct Layout {
    std::vector<uint8_t> header;  // everything before the data section, padding included
    std::vector<uint64_t> offsets;  // of each tensor, relative to the data section
    uint64_t size;
  };

  void set_encoded(std::string_view key, std::vector<uint8_t> value);
  Layout layout() const;
  void write_file(const std::string& path, bool with_data) const;

  std::vector<KeyValue> metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace rf::gguf
