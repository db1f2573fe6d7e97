// Running the built `rocmforge` binary from tests, and what those tests share: a scratch folder per test,
// the shared GGUF files, and comparing two files' metadata and tensors.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "test_paths.h"

namespace rf::test {

namespace fs = std::filesystem;

// Debug and sanitized builds quantize some 20 times slower: there the tests that quantize take the cheaper
// types only, to stay within seconds; optimized builds run every type.
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
inline constexpr bool kOptimizedBuild = true;
#else
inline constexpr bool kOptimizedBuild = false;
#endif

struct RunResult {
  int status;  // the exit status; -1 when killed by a signal
  std::string out;
  std::string err;
};

inline std::string read_text(const fs::path& path) {
  std::string text(fs::file_size(path), '\0');
  std::ifstream(path, std::ios::binary).read(text.data(), static_cast<std::streamsize>(text.size()));
  return text;
}

inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    result.push_back(text.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return result;
}

// A test's own scratch folder, removed at the end.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           fmt::format("rf_cli_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Runs `rocmforge ARGS` (ARGS as a shell would split them) with `input` on stdin and stdout and stderr
  // captured.
  RunResult run(const std::string& args, const std::string& input = "") const {
    const std::string in = path(".stdin"), out = path(".stdout"), err = path(".stderr");
    std::ofstream(in, std::ios::binary) << input;
    const std::string command = fmt::format("'{}' {} <'{}' >'{}' 2>'{}'", cli_path(), args, in, out, err);
    const int raw = std::system(command.c_str());
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, read_text(out), read_text(err)};
  }

  // Runs a command that must succeed quietly: exit 0 and nothing on stderr (no progress bar off a terminal).
  std::string run_ok(const std::string& args) const {
    const RunResult result = run(args);
    EXPECT_EQ(result.status, 0) << "rocmforge " << args << "\n" << result.err;
    EXPECT_EQ(result.err, "") << "rocmforge " << args;
    return result.out;
  }

  // Runs a command that must fail with exactly one line on stderr, "error: ...", which contains `mention`.
  void expect_error(const std::string& args, const std::string& mention) const {
    SCOPED_TRACE(fmt::format("rocmforge {}", args));
    const RunResult result = run(args);
    EXPECT_NE(result.status, 0);
    EXPECT_GT(result.status, 0) << "killed by a signal";
    const auto err_lines = lines(result.err);
    ASSERT_EQ(err_lines.size(), 1u) << result.err;
    EXPECT_EQ(err_lines[0].rfind("error: ", 0), 0u) << result.err;
    EXPECT_NE(result.err.find(mention), std::string::npos) << result.err;
  }

  fs::path dir_;
};

inline std::string model_path(const std::string& name) { return shared_path(fmt::format("models/{}", name)); }

// Every GGUF file in shared/models and shared/vocab, sorted.
inline std::vector<std::string> shared_gguf_files() {
  std::vector<std::string> paths;
  for (const char* dir : {"models", "vocab"})
    for (const auto& entry : fs::directory_iterator(shared_path(dir)))
      if (entry.path().extension() == ".gguf") paths.push_back(entry.path().string());
  std::sort(paths.begin(), paths.end());
  return paths;
}

inline bool same_value(const gguf::Value& a, const gguf::Value& b) {
  if (a.type() != b.type()) return false;
  if (a.type() == gguf::ValueType::STRING) return a.str() == b.str();
  if (!a.is_array()) return std::ranges::equal(a.raw(), b.raw());
  if (a.element_type() != b.element_type() || a.size() != b.size()) return false;
  if (a.element_type() == gguf::ValueType::STRING) return a.strings() == b.strings();
  if (a.element_type() == gguf::ValueType::ARRAY) return std::ranges::equal(a.items(), b.items(), same_value);
  return std::ranges::equal(a.raw(), b.raw());
}

// Same keys with the same values (in any order), and the same tensors by name: type, shape and, when
// `compare_data`, bytes.
inline void expect_same_model(const gguf::File& actual, const gguf::File& expected, bool compare_data = true) {
  EXPECT_EQ(actual.metadata().size(), expected.metadata().size());
  for (const auto& kv : expected.metadata()) {
    const gguf::Value* value = actual.find(kv.key);
    if (!value) {
      ADD_FAILURE() << "missing key " << kv.key;
      continue;
    }
    EXPECT_TRUE(same_value(*value, kv.value)) << kv.key;
  }
  EXPECT_EQ(actual.tensors().size(), expected.tensors().size());
  for (const auto& want : expected.tensors()) {
    const gguf::TensorInfo* got = actual.find_tensor(want.name);
    if (!got) {
      ADD_FAILURE() << "missing tensor " << want.name;
      continue;
    }
    EXPECT_EQ(got->type_info->name, want.type_info->name) << want.name;
    EXPECT_EQ(got->shape(), want.shape()) << want.name;
    if (compare_data && got->type() == want.type()) {
      const auto got_data = actual.tensor_data(*got), want_data = expected.tensor_data(want);
      EXPECT_TRUE(got_data.size() == want_data.size() &&
                  std::memcmp(got_data.data(), want_data.data(), got_data.size()) == 0)
          << want.name;
    }
  }
}

}  // namespace rf::test
