#include "loader/host_sink.h"

#include <cstring>

#include "util/error.h"

namespace rf::loader {

HostSink::HostSink(const gguf::File& file) {
  for (const gguf::TensorInfo& info : file.tensors())
    copies_.emplace(&info, std::make_unique_for_overwrite<uint8_t[]>(info.bytes));
}

void HostSink::consume(const Chunk& chunk) {
  for (const Piece& piece : chunk.pieces) {
    const std::span<const uint8_t> bytes = chunk.bytes(piece);
    std::memcpy(copies_.at(piece.tensor).get() + piece.tensor_offset, bytes.data(), bytes.size());
  }
}

std::span<const uint8_t> HostSink::tensor(const gguf::TensorInfo& tensor) const {
  const auto found = copies_.find(&tensor);
  if (found == copies_.end()) fail("host sink: tensor '{}' is not one of its file's", tensor.name);
  return {found->second.get(), tensor.bytes};
}

}  // namespace rf::loader
