// Where tests find ../shared (the project's reference data, never copied into the repository) and the CLI.
#pragma once
#include <cstdlib>
#include <string>

namespace rf::test {

// ROCMFORGE_SHARED overrides the compiled-in location, e.g. when the build tree moved.
inline std::string shared_path(const std::string& relative) {
  const char* env = std::getenv("ROCMFORGE_SHARED");
  return std::string(env ? env : ROCMFORGE_SHARED_DIR) + "/" + relative;
}

inline std::string cli_path() { return ROCMFORGE_CLI_PATH; }

}  // namespace rf::test
