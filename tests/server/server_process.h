// The `rocmforge serve` binary as the server tests run it: a child process on a free port (--port 0, its port read
// from the "listening on" line), stdout and stderr in a file (so that its request log never blocks it), stopped with
// SIGTERM by the test or killed at the end; what the tests send it: JSON requests and server-sent-event streams
// through cpp-httplib's client; and the CLI's answers (`rocmforge run --temp 0`, ...) they compare its answers with.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli/cli_run.h"

extern char** environ;

namespace rf::test {

using nlohmann::json;

class ServerProcess {
 public:
  // Starts `rocmforge serve --port 0 ARGS` with ROCMFORGE_API_KEY set to `api_key` (unset when empty) and waits
  // until it listens.
  explicit ServerProcess(const std::vector<std::string>& args, const std::string& api_key = "")
      : log_path_(
            (fs::path(::testing::TempDir()) / fmt::format("rf_serve_{}_{}.log", ::getpid(), next_index())).string()) {
    std::vector<std::string> argv_text = {cli_path(), "serve", "--port", "0"};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_text) argv.push_back(arg.data());
    argv.push_back(nullptr);

    std::vector<std::string> env_text;
    for (char** entry = environ; *entry; ++entry)
      if (!std::string_view(*entry).starts_with("ROCMFORGE_API_KEY=")) env_text.emplace_back(*entry);
    if (!api_key.empty()) env_text.push_back("ROCMFORGE_API_KEY=" + api_key);
    std::vector<char*> envp;
    for (std::string& entry : env_text) envp.push_back(entry.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
    const int spawned = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) {
      ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(spawned);
      pid_ = -1;
      return;
    }
    wait_until_listening();
  }

  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    fs::remove(log_path_);
  }

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  std::string log() const { return fs::exists(log_path_) ? read_text(log_path_) : ""; }

  // A client whose requests go one after another over one kept-alive connection, so that the server has logged (and
  // counted in /metrics) each request before it reads the next. It writes a request's headers and body in two
  // pieces: with Nagle's algorithm the body would wait for the server's delayed acknowledgement of the headers.
  httplib::Client client() const {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(std::chrono::seconds(60));
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);
    return client;
  }

  void signal(int number) const { ::kill(pid_, number); }

  // Waits up to `timeout` for the process to exit; its exit status, or -1 when a signal ended it or it still runs.
  int wait_exit(std::chrono::seconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      int raw = 0;
      if (::waitpid(pid_, &raw, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

 private:
  static int next_index() {
    static int index = 0;
    return index++;
  }

  void wait_until_listening() {
    static constexpr std::string_view kListening = "listening on http://127.0.0.1:";
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < end) {
      const std::string text = log();
      if (const size_t at = text.find(kListening);
          at != std::string::npos && text.find('\n', at) != std::string::npos) {
        port_ = std::stoi(text.substr(at + kListening.size()));
        return;
      }
      int raw = 0;
      if (::waitpid(pid_, &raw, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "rocmforge serve exited before listening:\n" << text;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "rocmforge serve did not listen within 120 s:\n" << log();
  }

  pid_t pid_ = -1;
  std::string log_path_;
  int port_ = 0;
};

// The first value of header `name` (any case), or "".
inline std::string header(const httplib::Headers& headers, const std::string& name) {
  const auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

struct JsonResponse {
  int status = 0;  // 0: no response (connection failed)
  httplib::Headers headers;
  json body;  // discarded (is_discarded()) when the body is not JSON
};

inline JsonResponse to_json_response(const httplib::Result& result) {
  if (!result) return {};
  return {result->status, result->headers, json::parse(result->body, nullptr, false)};
}

inline JsonResponse post(httplib::Client& client, const std::string& path, const std::string& body,
                         const httplib::Headers& headers = {}) {
  return to_json_response(client.Post(path.c_str(), headers, body, "application/json"));
}

inline JsonResponse post(httplib::Client& client, const std::string& path, const json& body,
                         const httplib::Headers& headers = {}) {
  return post(client, path, body.dump(), headers);
}

inline JsonResponse get(httplib::Client& client, const std::string& path, const httplib::Headers& headers = {}) {
  return to_json_response(client.Get(path.c_str(), headers));
}

// A server-sent-event stream as a client reads it: the data of each event in order.
struct Stream {
  int status = 0;  // 0: no response headers came
  httplib::Headers headers;
  std::vector<std::string> events;
  bool ended = false;  // the response was read to its end (not abandoned or broken)
};

// POSTs `body` and reads the stream, handing each event's data to `on_event` as it arrives; returning false there
// abandons the stream (the client closes the connection).
inline Stream post_stream(httplib::Client& client, const std::string& path, const json& body,
                          const std::function<bool(const std::string&)>& on_event = {}) {
  Stream stream;
  std::string pending;
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.body = body.dump();
  request.set_header("Content-Type", "application/json");
  request.response_handler = [&](const httplib::Response& response) {
    stream.status = response.status;
    stream.headers = response.headers;
    return true;
  };
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    pending.append(data, size);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
      const std::string event = pending.substr(0, end);
      if (event.rfind("data: ", 0) != 0) continue;  // a comment or another field
      stream.events.push_back(event.substr(6));
      if (on_event && !on_event(stream.events.back())) return false;
    }
    return true;
  };
  stream.ended = static_cast<bool>(client.send(request));
  return stream;
}

// The value of a Prometheus sample without labels in the text of /metrics, or nullopt.
inline std::optional<double> metric(const std::string& text, const std::string& name) {
  for (const std::string& line : lines(text))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return std::nullopt;
}

inline const std::string kStories = "stories260K.gguf";
inline const std::string kTinyStories = "TinyStories-656K-Q8_0.gguf";

// The arguments that serve `model` on the CPU with two threads (CI's machines have two cores), then `extra`.
inline std::vector<std::string> serve_args(const std::string& model, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"-m", model_path(model), "--device", "cpu", "--threads", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// A scratch folder per test and the ground truth a server's answers are checked against: what the CLI's commands
// give for the same model and request.
class ServerTest : public CliTest {
 protected:
  // `rocmforge tokenize --parse-special` of `text`: what the server's prompts tokenize to.
  size_t token_count(const std::string& model, const std::string& text) {
    const RunResult result =
        run(fmt::format("tokenize -m '{}' --parse-special --jsonl", model_path(model)), json(text).dump() + "\n");
    EXPECT_EQ(result.status, 0) << result.err;
    return json::parse(result.out).size();
  }

  // `rocmforge run --temp 0`'s continuation of `prompt` (it prints the prompt first and a line break last).
  std::string run_greedy(const std::string& model, const std::string& prompt, int tokens) {
    const RunResult result =
        run(fmt::format("run -m '{}' --device cpu --temp 0 -n {} -p '{}'", model_path(model), tokens, prompt));
    EXPECT_EQ(result.status, 0) << result.err;
    EXPECT_EQ(result.out.substr(0, prompt.size()), prompt);
    EXPECT_EQ(result.out.back(), '\n');
    return result.out.substr(prompt.size(), result.out.size() - prompt.size() - 1);
  }

  // `rocmforge chat --temp 0`'s reply to one user message.
  std::string chat_greedy(const std::string& model, const std::string& message, const std::string& chat_template,
                          int tokens) {
    const RunResult result = run(fmt::format("chat -m '{}' --device cpu --temp 0 -n {} --chat-template {}",
                                             model_path(model), tokens, chat_template),
                                 message + "\n");
    EXPECT_EQ(result.status, 0) << result.err;
    EXPECT_EQ(result.out.back(), '\n');
    return result.out.substr(0, result.out.size() - 1);
  }
};

}  // namespace rf::test
