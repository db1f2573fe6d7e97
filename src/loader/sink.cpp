#include "loader/sink.h"

#include <cstdlib>

#include "util/error.h"

namespace rf::loader {

namespace {
// Page alignment lets the kernel copy whole pages into the buffer and would allow O_DIRECT reads.
constexpr size_t kStagingAlignment = 4096;
}  // namespace

std::span<uint8_t> Sink::allocate_staging(size_t buffer, size_t bytes) {
  const size_t rounded = (bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
  void* memory = std::aligned_alloc(kStagingAlignment, rounded);
  if (!memory) fail("cannot allocate a staging buffer of {} bytes", bytes);
  return {static_cast<uint8_t*>(memory), bytes};
}

void Sink::release_staging(std::span<uint8_t> buffer) noexcept { std::free(buffer.data()); }

}  // namespace rf::loader
