// A read-only memory map of a whole file. Mapping touches no page: bytes are read from disk only when used.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace rf {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  int fd() const { return fd_; }

  // Hints the kernel to read [offset, offset + length) ahead of use.
  void will_need(size_t offset, size_t length) const;

 private:
  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace rf
