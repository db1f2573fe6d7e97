// A sink that copies every tensor into host memory of its own: the CPU counterpart of a GPU upload, used by
// the loader's tests and benchmark, and by anything that wants weights off the mapping (e.g. to repack them).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>

#include "gguf/gguf.h"
#include "loader/sink.h"

namespace rf::loader {

class HostSink : public Sink {
 public:
  // Reserves (without touching) memory for every tensor of `file`.
  explicit HostSink(const gguf::File& file);

  void consume(const Chunk& chunk) override;

  // The copy of `tensor`; its bytes are final once the loader reports the tensor's group loaded.
  std::span<const uint8_t> tensor(const gguf::TensorInfo& tensor) const;

 private:
  // Filled in the constructor and only read afterwards, so lookups from any thread are safe.
  std::unordered_map<const gguf::TensorInfo*, std::unique_ptr<uint8_t[]>> copies_;
};

}  // namespace rf::loader
