// The HTTP server of `rocmforge serve`, on cpp-httplib, over one engine's Scheduler: OpenAI's API (/v1/models,
// /v1/completions, /v1/chat/completions) and the native one (/generate, /generate/stream, /status/{id},
// /cancel/{id}, /tokenize, /detokenize, /health, /metrics); docs/API.md describes every route. Each connection is
// served on a thread of its own: the request is read and checked there (a bad one is a 4xx naming its field before
// the scheduler sees it), submitted, and answered as its steps arrive. The connection is watched while the request
// runs: a client that goes away, mid-prompt or mid-stream, has its request cancelled and its KV blocks freed.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "server/generation_request.h"
#include "server/job.h"
#include "server/metrics.h"
#include "tokenizer/chat_template.h"

namespace httplib {
class Server;
class DataSink;
struct Request;
struct Response;
}  // namespace httplib

namespace rf::server {

class HttpServer;
struct ResponseContext;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: a free port
  // Required as "Authorization: Bearer KEY" on every route but /health; empty: none.
  std::string api_key;
  std::string model_id;         // the name /v1/models lists
  std::string model_file_name;  // a request's model may name this too
  // For chat requests that name none.
  ChatTemplate chat_template = ChatTemplate::ChatML;
  // The scheduler's sequences running at once, and those that may wait for a place: a request that would make
  // more wait is refused (503).
  int32_t max_sequences = 64;
  int64_t max_waiting = 256;
  size_t max_body_bytes = size_t{8} << 20;
  std::chrono::milliseconds shutdown_grace{5000};  // what running requests get to finish after shutdown()
};

class Server {
 public:
  // The engine and the scheduler must outlive the server.
  Server(engine::Engine& engine, engine::Scheduler& scheduler, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket and returns its port (a free one for port 0); an rf::Error when it cannot.
  int bind();
  // Serves connections until shutdown() has stopped them; false when listening failed.
  bool listen();
  // Takes no more requests (503; /health too), lets running ones finish for the grace period, cancels the rest and
  // waits for their answers to end, then stops listening. Called from another thread than listen()'s, which must
  // have been started.
  void shutdown();

 private:
  using Handler = void (Server::*)(const httplib::Request&, httplib::Response&);
  struct Route {
    std::string method;
    std::regex path;
    std::string label;  // the path pattern as docs and metrics name it ("/status/{id}")
  };
  class Admission;

  // Serves `method` on `pattern` (a regex, `label` its name); `open`: without the API key.
  void add_route(const std::string& method, const std::string& pattern, const std::string& label, bool open,
                 Handler handler);
  // The label of the route whose pattern matches `path`, or "other".
  const std::string& route_label(const std::string& path) const;
  void require_key(const httplib::Request& request) const;
  // Fills the error object of a failure the HTTP layer answered (unknown path or method, body too large, bad HTTP).
  void complete_error(const httplib::Request& request, httplib::Response& response) const;
  void log(const httplib::Request& request, const httplib::Response& response);
  // Counts `sequences` as running or waiting until the answer is done; a 503 when too many wait or the server stops.
  std::shared_ptr<Admission> admit(int64_t sequences);

  // The served model as /v1/models lists it.
  nlohmann::json model_json() const;
  void models(const httplib::Request& request, httplib::Response& response);
  void model(const httplib::Request& request, httplib::Response& response);
  void completions(const httplib::Request& request, httplib::Response& response);
  void chat_completions(const httplib::Request& request, httplib::Response& response);
  void generate(const httplib::Request& request, httplib::Response& response);
  void generate_stream(const httplib::Request& request, httplib::Response& response);
  void status(const httplib::Request& request, httplib::Response& response);
  void cancel(const httplib::Request& request, httplib::Response& response);
  void tokenize(const httplib::Request& request, httplib::Response& response);
  void detokenize(const httplib::Request& request, httplib::Response& response);
  void health(const httplib::Request& request, httplib::Response& response);
  void metrics(const httplib::Request& request, httplib::Response& response);

  // Checks and submits a generation request, then answers it as a stream or, once it has finished, as one object.
  void serve_generation(GenerationRequest request, httplib::Response& response);
  // The answer's writers, called by the HTTP layer after the handler returned; false when the client went away.
  bool write_object(Job& job, const ResponseContext& context, httplib::DataSink& sink);
  bool write_stream(Job& job, const ResponseContext& context, bool include_usage, httplib::DataSink& sink);
  std::shared_ptr<Job> find_job(const httplib::Request& request);

  engine::Engine& engine_;
  engine::Scheduler& scheduler_;
  ServerOptions options_;
  ServedModel model_;
  int64_t started_;  // Unix seconds, /v1/models' created
  std::shared_ptr<Metrics> metrics_;
  JobRegistry jobs_;
  std::vector<Route> routes_;

  std::mutex mutex_;  // guards the counts below and stopping_
  std::condition_variable idle_;
  int64_t sequences_in_flight_ = 0;
  int64_t answers_in_flight_ = 0;
  bool stopping_ = false;
  std::atomic<bool> listen_returned_ = false;

  std::unique_ptr<HttpServer> http_;  // last: its threads call the members above until it is gone
};

}  // namespace rf::server
