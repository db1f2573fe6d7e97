// rocmforge tokenize -m MODEL [-p TEXT | -f FILE] [--no-bos] [--parse-special] [--jsonl]: the token ids of a
// text, space-separated. With --jsonl every line of stdin is a JSON string and every output line the JSON
// array of its ids, so tools can tokenize many texts with one load. Only the tokenizer is read: a
// vocabulary-only file works.
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace rf::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string prompt;
  std::string file;
  bool no_bos = false;
  bool parse_special = false;
  bool jsonl = false;
};

void tokenize_jsonl(const Tokenizer& tokenizer, bool add_special, bool parse_special) {
  std::string line;
  for (int64_t number = 1; std::getline(std::cin, line); ++number) {
    const nlohmann::json text = nlohmann::json::parse(line, nullptr, false);
    if (!text.is_string()) fail("line {} of stdin is not a JSON string", number);
    const nlohmann::json ids = tokenizer.encode(text.get<std::string>(), add_special, parse_special);
    fmt::print("{}\n", ids.dump());
  }
}

void tokenize(const TokenizeOptions& options) {
  const std::unique_ptr<gguf::File> file = gguf::File::open(options.model);
  const Tokenizer tokenizer(*file);
  const bool add_special = !options.no_bos;
  if (options.jsonl) {
    tokenize_jsonl(tokenizer, add_special, options.parse_special);
    return;
  }
  const std::string text = options.file.empty() ? options.prompt : read_text_file(options.file);
  fmt::print("{}\n", fmt::join(tokenizer.encode(text, add_special, options.parse_special), " "));
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open text file '{}'", path);
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) fail("cannot read text file '{}'", path);
  return text;
}

void add_tokenize_command(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* command = app.add_subcommand("tokenize", "Print the token ids of a text");
  command->add_option("-m,--model", options->model, "GGUF file with a tokenizer (a vocabulary-only file will do)")
      ->required();
  CLI::Option* prompt = command->add_option("-p,--prompt", options->prompt, "Text to tokenize");
  CLI::Option* file = command->add_option("-f,--file", options->file, "File whose whole content is tokenized");
  CLI::Option* jsonl = command->add_flag("--jsonl", options->jsonl,
                                         "Read one JSON string per stdin line, print one JSON array of ids per line");
  prompt->excludes(file);
  jsonl->excludes(prompt)->excludes(file);
  command->add_flag("--no-bos", options->no_bos, "Add no BOS/EOS tokens");
  command->add_flag("--parse-special", options->parse_special, "Turn control tokens written in the text into tokens");
  command->callback([options, prompt, file, jsonl] {
    if (!*prompt && !*file && !*jsonl) fail("tokenize needs a text: -p TEXT, -f FILE or --jsonl");
    tokenize(*options);
  });
}

}  // namespace rf::cli
