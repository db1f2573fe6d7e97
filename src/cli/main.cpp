// rocmforge: the command-line front end. Each command is one file (see commands.h); this file wires them up
// and turns every failure into one `error: ...` line on stderr and a non-zero exit status.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.h"
#include "util/error.h"

namespace {

std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "GCC " __VERSION__;
#else
  return "unknown";
#endif
}

std::string version_text() {
  return fmt::format("rocmforge {}\nbuild type: {}\nGPU backend: {}\ncompiler: {}", ROCMFORGE_VERSION,
                     ROCMFORGE_BUILD_TYPE, ROCMFORGE_GPU_BACKEND, compiler());
}

// Every command, in the order --help lists them. Each is defined in its own file (see commands.h).
constexpr void (*kCommands[])(CLI::App&) = {
    rf::cli::add_inspect_command,
    rf::cli::add_quantize_command,
    rf::cli::add_gen_model_command,
    rf::cli::add_eval_command,
    rf::cli::add_run_command,
    rf::cli::add_chat_command,
    rf::cli::add_tokenize_command,
    rf::cli::add_perplexity_command,
    rf::cli::add_bench_command,
    rf::cli::add_serve_command,
};

int report(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ROCmForge: LLM inference for GGUF models", "rocmforge"};
  app.set_version_flag("--version", version_text(), "Print the version and build options, then exit");
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("error: {} (see --help)\n", e.what());
  });

  for (auto add_command : kCommands) add_command(app);

  // CLI11 would report an unknown command as a missing one; name it and the known ones instead.
  if (argc > 1 && argv[1][0] != '-' &&
      app.get_subcommands([&](CLI::App* command) { return command->get_name() == argv[1]; }).empty()) {
    std::vector<std::string> known;
    for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; })) known.push_back(command->get_name());
    return report(fmt::format("unknown command '{}' (commands: {})", argv[1], fmt::join(known, ", ")));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    return report(e.what());
  }
  return 0;
}
