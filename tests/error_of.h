// The message of the rf::Error a piece of code throws, for tests that check what an error names.
#pragma once
#include <string>

#include "util/error.h"

namespace rf::test {

// Runs `f` and returns the rf::Error message it throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace rf::test
