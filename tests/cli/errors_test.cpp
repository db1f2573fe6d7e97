// What the user gets wrong: one `error:` line on stderr and a non-zero exit, for every command. And the help
// and version texts.
#include <fstream>

#include "cli/cli_run.h"
#include "gguf/writer.h"

namespace rf::test {
namespace {

class ErrorsTest : public CliTest {
 protected:
  std::string write_file(const std::string& name, const std::string& bytes) {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
};

TEST_F(ErrorsTest, BadCommandLines) {
  const std::string model = model_path("stories260K.gguf");
  expect_error("", "subcommand is required");
  expect_error("frobnicate", "unknown command 'frobnicate' (commands: inspect, quantize, gen-model");
  expect_error("inspect", "file is required");
  expect_error(fmt::format("inspect --bogus '{}'", model), "--bogus");
  expect_error(fmt::format("inspect '{}' --dump output.weight", model), "--out");
  expect_error(fmt::format("quantize '{}'", model), "required");
  expect_error(fmt::format("quantize '{}' '{}' Q4_K --threads -2", model, path("o.gguf")), "--threads");
  expect_error(fmt::format("gen-model --shape tiny-256 '{}'", path("o.gguf")), "required");
}

TEST_F(ErrorsTest, MissingCorruptAndWrongFiles) {
  const std::string model = model_path("stories260K.gguf");
  const std::string bytes = read_text(model);
  expect_error(fmt::format("inspect '{}'", path("missing.gguf")), "missing.gguf: cannot open");
  expect_error(fmt::format("inspect '{}'", write_file("text.gguf", "hello, this is not GGUF")), "not a GGUF file");
  expect_error(fmt::format("inspect '{}'", write_file("truncated.gguf", bytes.substr(0, 5000))), "truncated");
  expect_error(fmt::format("inspect '{}' --json", write_file("cut_data.gguf", bytes.substr(0, bytes.size() - 100))),
               "outside the file");
  expect_error(fmt::format("quantize '{}' '{}' Q8_0", path("missing.gguf"), path("o.gguf")), "cannot open");
  expect_error(fmt::format("inspect '{}' --dump no.such.weight --out '{}'", model, path("t.f32")),
               "missing tensor 'no.such.weight'");
  expect_error(fmt::format("inspect '{}' --dump output.weight --out '{}'", model, path("no/such/folder/t.f32")),
               "cannot create");
}

TEST_F(ErrorsTest, UnknownTypesShapesAndVocabularies) {
  const std::string model = model_path("stories260K.gguf");
  expect_error(fmt::format("quantize '{}' '{}' Q9_9", model, path("o.gguf")), "unknown type 'Q9_9' (known: F32 F16");
  expect_error(fmt::format("gen-model --shape llama9 --type Q4_0 --vocab '{}' '{}'", model, path("o.gguf")),
               "unknown shape 'llama9' (known: llama3-8b");
  gguf::Writer no_tokenizer;
  no_tokenizer.set_string("general.architecture", "llama");
  no_tokenizer.write(path("no_tokenizer.gguf"));
  expect_error(fmt::format("gen-model --shape tiny-256 --type Q4_0 --vocab '{}' '{}'", path("no_tokenizer.gguf"),
                           path("o.gguf")),
               "no_tokenizer.gguf: has no tokenizer.ggml.tokens");
  EXPECT_FALSE(fs::exists(path("o.gguf")));
}

TEST_F(ErrorsTest, HelpAndVersion) {
  for (const char* command : {"", "inspect ", "quantize ", "gen-model "}) {
    SCOPED_TRACE(command);
    const std::string help = run_ok(fmt::format("{}--help", command));
    EXPECT_NE(help.find("Usage"), std::string::npos) << help;
  }
  const std::string version = run_ok("--version");
  for (const char* expected : {"rocmforge 0.1.0", "build type: ", "GPU backend: ", "compiler: "})
    EXPECT_NE(version.find(expected), std::string::npos) << version;
}

}  // namespace
}  // namespace rf::test
