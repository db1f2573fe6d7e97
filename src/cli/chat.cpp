// rocmforge chat -m MODEL [--system TEXT] [--chat-template NAME]: a conversation on stdin and stdout, one user
// message per line. Each turn renders the whole conversation with the model's chat template; the engine keeps
// the KV cache of the turns before, so only the new turn's tokens are evaluated.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/engine.h"
#include "tokenizer/chat_template.h"

namespace rf::cli {
namespace {

struct ChatOptions {
  std::string model;
  std::string system;
  std::string chat_template;  // a template name; empty: the model's own, else ChatML as llama.cpp
  engine::EngineOptions engine;
  engine::GenerationParams generation;
};

void say_context_full(int64_t context) {
  fmt::print(stderr, "\nthe context of {} tokens is full: start a new chat (or a larger --ctx) to go on\n", context);
}

void chat(const ChatOptions& options) {
  engine::Engine engine(open_model(options.model, options.engine), options.engine);
  const Tokenizer& tokenizer = engine.tokenizer();
  const ChatTemplate chat_template = choose_chat_template(options.chat_template, tokenizer);
  std::vector<ChatMessage> messages;
  if (!options.system.empty()) messages.push_back({"system", options.system});

  const bool interactive = isatty(STDIN_FILENO) != 0;
  if (interactive)
    fmt::print(stderr, "chat with {} ({} template, context {}, {}); end with Ctrl-D\n", options.model,
               chat_template_name(chat_template), engine.context(), backend_text(engine));
  std::string line;
  while (true) {
    if (interactive) fmt::print("> ");
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    messages.push_back({"user", line});
    const std::vector<int32_t> prompt =
        tokenizer.encode(apply_chat_template(chat_template, messages, true), true, true);
    if (static_cast<int64_t>(prompt.size()) > engine.context()) {
      say_context_full(engine.context());
      return;
    }

    const engine::Generation generation = engine.generate(prompt, options.generation, [](const engine::Step& step) {
      fmt::print("{}", step.text);
      std::fflush(stdout);
      return true;
    });
    fmt::print("\n");
    messages.push_back({"assistant", generation.text});
    if (generation.finish == engine::FinishReason::ContextFull) {
      say_context_full(engine.context());
      return;
    }
  }
}

}  // namespace

ChatTemplate choose_chat_template(const std::string& name, const Tokenizer& tokenizer) {
  if (!name.empty()) return chat_template_from_name(name);
  if (!tokenizer.chat_template().empty()) return detect_chat_template(tokenizer.chat_template());
  return ChatTemplate::ChatML;
}

void add_chat_command(CLI::App& app) {
  auto options = std::make_shared<ChatOptions>();
  CLI::App* command = app.add_subcommand("chat", "Chat with a model on stdin/stdout, one message per line");
  command->add_option("-m,--model", options->model, "GGUF model file")->required();
  command->add_option("--system", options->system, "System message that starts the conversation");
  command->add_option("--chat-template", options->chat_template,
                      "Template name (chatml, llama2, llama3, phi3, gemma, ...; default: the model's, else chatml)");
  // A reply ends with the model's turn unless -n says otherwise.
  options->generation.max_tokens = -1;
  add_generation_options(*command, options->engine, options->generation);
  command->callback([options] { chat(*options); });
}

}  // namespace rf::cli
