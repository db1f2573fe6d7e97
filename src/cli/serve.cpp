// rocmforge serve -m MODEL [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--max-seqs N] [--max-waiting N]
// [--ctx N] [--device auto|cpu|gpu] [--alias NAME] [--chat-template NAME]: an OpenAI-compatible and a native HTTP
// API (src/server, docs/API.md) over a Scheduler on a paged KV cache. It listens as soon as the engine and the
// scheduler exist and logs one line per request on stderr. SIGTERM or SIGINT stops taking requests, lets the running
// ones finish for a few seconds, cancels the rest and exits 0.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "server/server.h"
#include "tokenizer/chat_template.h"

namespace rf::cli {
namespace {

constexpr int64_t kMaxSequences = 1024;  // --max-seqs at most, as bench --parallel
constexpr int64_t kMaxWaiting = 1024;    // --max-waiting at most: each waiting request holds a connection thread

struct ServeOptions {
  std::string model;
  std::string alias;
  std::string chat_template;
  int64_t max_sequences = 64;
  engine::EngineOptions engine;
  server::ServerOptions server;
};

// http://HOST:PORT, with an IPv6 address in brackets.
std::string url(const std::string& host, int port) {
  return host.find(':') == std::string::npos ? fmt::format("http://{}:{}", host, port)
                                             : fmt::format("http://[{}]:{}", host, port);
}

void serve(ServeOptions options) {
  // SIGTERM and SIGINT are taken by sigwait() below, on this thread: blocked before any other thread starts, so
  // that every thread inherits the mask and none is ended by them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // A client that went away is a failed write, not the end of the process.
  std::signal(SIGPIPE, SIG_IGN);

  // The paged KV cache is shared by every sequence: its --ctx may exceed the model's context, which bounds each.
  options.engine.paged = true;
  engine::Engine engine(gguf::File::open(options.model), options.engine);
  engine::Scheduler scheduler(engine, {.max_sequences = options.max_sequences});

  const std::string file_name = std::filesystem::path(options.model).filename().string();
  server::ServerOptions& server_options = options.server;
  server_options.model_id = options.alias.empty() ? file_name : options.alias;
  server_options.model_file_name = file_name;
  server_options.chat_template = choose_chat_template(options.chat_template, engine.tokenizer());
  server_options.max_sequences = static_cast<int32_t>(options.max_sequences);
  server::Server server(engine, scheduler, server_options);
  const int port = server.bind();

  fmt::print(stderr, "backend: {}\n", backend_text(engine));
  fmt::print(stderr,
             "serving {} as '{}': {} template, KV cache of {} positions, {} per sequence, {} sequences at once\n",
             options.model, server_options.model_id, chat_template_name(server_options.chat_template), engine.context(),
             scheduler.sequence_context(), options.max_sequences);
  fmt::print(stderr, "listening on {}\n", url(server_options.host, port));

  std::atomic<bool> listen_failed = false;
  std::thread listener([&] {
    // listen() returns on its own only when it fails; then the process stops as if told to.
    if (!server.listen()) {
      listen_failed = true;
      kill(getpid(), SIGTERM);
    }
  });
  int received = 0;
  sigwait(&stop_signals, &received);
  if (!listen_failed) fmt::print(stderr, "{}: finishing the running requests, then stopping\n", strsignal(received));
  server.shutdown();
  listener.join();
  if (listen_failed) fail("stopped listening on {}", url(server_options.host, port));
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* command =
      app.add_subcommand("serve", "Serve the model over HTTP: OpenAI's API and a native one (see docs/API.md)");
  command->add_option("-m,--model", options->model, "GGUF model file")->required();
  command->add_option("--host", options->server.host, "Address to listen on")->capture_default_str();
  command->add_option("--port", options->server.port, "Port to listen on (0: a free one)")
      ->transform(integer_in(0, 65535))
      ->capture_default_str();
  command
      ->add_option("--api-key", options->server.api_key,
                   "Require 'Authorization: Bearer KEY' on every route but /health (the environment variable keeps "
                   "the key out of the process list)")
      ->envname("ROCMFORGE_API_KEY")
      ->type_name("KEY");
  command->add_option("--max-seqs", options->max_sequences, "Sequences running at once")
      ->transform(integer_in<int64_t>(1, kMaxSequences))
      ->capture_default_str();
  command
      ->add_option("--max-waiting", options->server.max_waiting,
                   "Sequences that may wait for a place; a request that would make more is refused (503)")
      ->transform(integer_in<int64_t>(0, kMaxWaiting))
      ->capture_default_str();
  command
      ->add_option(
          "-c,--ctx", options->engine.context,
          "KV cache positions all sequences share, may exceed the model's context (0: the engine's default; on "
          "the CPU the model's context, capped to a quarter of RAM)")
      ->transform(integer_in<int64_t>(0));
  command->add_option("--alias", options->alias, "Model name the API shows (default: the file's name)");
  command->add_option(
      "--chat-template", options->chat_template,
      "Chat template when a request names none (chatml, llama3, ...; default: the model's, else chatml)");
  add_threads_option(*command, options->engine.threads, "one per physical core");
  add_device_options(*command, options->engine);
  command->callback([options] { serve(*options); });
}

}  // namespace rf::cli
