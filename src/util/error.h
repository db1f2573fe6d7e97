// The one exception type of ROCmForge. Every error a user can cause (bad file, bad argument, bad request)
// is an rf::Error whose message names what was wrong; the CLI prints it as one line and exits non-zero.
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace rf {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace rf
