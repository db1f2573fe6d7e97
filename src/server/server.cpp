#include "server/server.h"

#include <sys/socket.h>

#include <algorithm>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <httplib.h>

#include "server/api_error.h"
#include "server/fields.h"
#include "server/responses.h"
#include "util/error.h"

namespace rf::server {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// How often a request's connection is checked while it waits for its next step.
constexpr auto kWatchInterval = std::chrono::milliseconds(50);
// Connection threads besides those of every running and waiting sequence: for /health, /metrics and the like.
constexpr int64_t kSpareConnections = 16;
// Requests one kept-alive connection may carry (cpp-httplib's default of 5 makes busy clients reconnect).
constexpr size_t kRequestsPerConnection = 1000;
// What shutdown() waits, after cancelling what ran past the grace period, for those answers to end.
constexpr auto kCancelledAnswers = std::chrono::seconds(5);

// When the request being served on this connection thread arrived, for its log line.
thread_local std::optional<Clock::time_point> request_start;

void send_json(httplib::Response& response, const json& body, int status = 200) {
  response.status = status;
  response.set_content(json_text(body), "application/json");
}

void send_error(httplib::Response& response, const ApiError& error) {
  if (error.status() == 503) response.set_header("Retry-After", "1");
  if (error.status() == 401) response.set_header("WWW-Authenticate", "Bearer");
  send_json(response, error.to_json(), error.status());
}

// The path of a request as its log line shows it: as sent (no decoded control characters), without the query.
std::string_view logged_path(const httplib::Request& request) {
  const std::string_view target = request.target.empty() ? std::string_view(request.path) : request.target;
  return target.substr(0, target.find('?'));
}

bool same_in_constant_time(const std::string& given, const std::string& expected) {
  if (given.size() != expected.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < given.size(); ++i) differ |= static_cast<unsigned char>(given[i] ^ expected[i]);
  return differ == 0;
}

std::string_view id_prefix(Api api) {
  switch (api) {
    case Api::Completion:
      return "cmpl-";
    case Api::Chat:
      return "chatcmpl-";
    case Api::Generate:
      break;
  }
  return "gen-";
}

bool write_event(httplib::DataSink& sink, const json& data) {
  const std::string event = fmt::format("data: {}\n\n", json_text(data));
  return sink.write(event.data(), event.size());
}

}  // namespace

// cpp-httplib's server, whose listening socket takes a burst of connections. cpp-httplib 0.11 listens with a
// backlog of 5: when many clients connect at once the rest overflow it, and some of those connections are reset.
class HttpServer : public httplib::Server {
 public:
  // Makes the bound socket's backlog the system's largest (listen() again on a listening socket changes it).
  void widen_backlog() { ::listen(svr_sock_, SOMAXCONN); }
};

// A request's sequences counted as running or waiting, until its answer has been written (or abandoned).
class Server::Admission {
 public:
  Admission(Server& server, int64_t sequences) : server_(server), sequences_(sequences) {}
  ~Admission() {
    {
      const std::lock_guard lock(server_.mutex_);
      server_.sequences_in_flight_ -= sequences_;
      --server_.answers_in_flight_;
    }
    server_.idle_.notify_all();
  }
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

 private:
  Server& server_;
  int64_t sequences_;
};

Server::Server(engine::Engine& engine, engine::Scheduler& scheduler, ServerOptions options)
    : engine_(engine),
      scheduler_(scheduler),
      options_(std::move(options)),
      started_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      metrics_(std::make_shared<Metrics>()),
      http_(std::make_unique<HttpServer>()) {
  model_ = {.id = options_.model_id,
            .names = {options_.model_id, options_.model_file_name},
            .tokenizer = &engine_.tokenizer(),
            .sequence_context = scheduler_.sequence_context(),
            .max_sequences = options_.max_sequences,
            .chat_template = options_.chat_template};

  // A connection holds its thread while its request runs: one for every sequence that may run or wait.
  const auto threads = static_cast<size_t>(options_.max_sequences + options_.max_waiting + kSpareConnections);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_keep_alive_max_count(kRequestsPerConnection);
  // Streams write one small chunk per token: Nagle's algorithm would hold each back for the previous one's ACK.
  http_->set_tcp_nodelay(true);
  // cpp-httplib's default also sets SO_REUSEPORT, with which a second server on the same port binds without error
  // and the kernel splits the connections between the two. SO_REUSEADDR alone lets a restart bind at once.
  http_->set_socket_options([](socket_t socket) {
    const int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http_->set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    request_start = Clock::now();
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_->set_error_handler(
      [this](const httplib::Request& request, httplib::Response& response) { complete_error(request, response); });
  http_->set_logger(
      [this](const httplib::Request& request, const httplib::Response& response) { log(request, response); });

  add_route("GET", "/v1/models", "/v1/models", false, &Server::models);
  add_route("GET", "/v1/models/(.+)", "/v1/models/{model}", false, &Server::model);
  add_route("POST", "/v1/completions", "/v1/completions", false, &Server::completions);
  add_route("POST", "/v1/chat/completions", "/v1/chat/completions", false, &Server::chat_completions);
  add_route("POST", "/generate", "/generate", false, &Server::generate);
  add_route("POST", "/generate/stream", "/generate/stream", false, &Server::generate_stream);
  add_route("GET", "/status/([^/]+)", "/status/{id}", false, &Server::status);
  add_route("POST", "/cancel/([^/]+)", "/cancel/{id}", false, &Server::cancel);
  add_route("POST", "/tokenize", "/tokenize", false, &Server::tokenize);
  add_route("POST", "/detokenize", "/detokenize", false, &Server::detokenize);
  add_route("GET", "/health", "/health", true, &Server::health);
  add_route("GET", "/metrics", "/metrics", false, &Server::metrics);
}

Server::~Server() = default;

void Server::add_route(const std::string& method, const std::string& pattern, const std::string& label, bool open,
                       Handler handler) {
  routes_.push_back({method, std::regex(pattern), label});
  auto serve = [this, open, handler](const httplib::Request& request, httplib::Response& response) {
    try {
      if (!open) require_key(request);
      (this->*handler)(request, response);
    } catch (const ApiError& e) {
      send_error(response, e);
    } catch (const Error& e) {
      send_error(response, ApiError(400, "invalid_request_error", e.what()));
    } catch (const std::exception& e) {
      send_error(response, ApiError(500, "server_error", e.what()));
    }
  };
  if (method == "GET")
    http_->Get(pattern, std::move(serve));
  else
    http_->Post(pattern, std::move(serve));
}

const std::string& Server::route_label(const std::string& path) const {
  static const std::string kOther = "other";
  for (const Route& route : routes_)
    if (std::regex_match(path, route.path)) return route.label;
  return kOther;
}

void Server::require_key(const httplib::Request& request) const {
  if (options_.api_key.empty()) return;
  const std::string given = request.get_header_value("Authorization");
  if (same_in_constant_time(given, "Bearer " + options_.api_key)) return;
  throw ApiError(401, "authentication_error",
                 given.empty() ? "this server needs an API key: send the header Authorization: Bearer KEY"
                               : "the API key is not valid",
                 {}, "invalid_api_key");
}

void Server::complete_error(const httplib::Request& request, httplib::Response& response) const {
  // The handlers send their own error objects; only the HTTP layer's failures come without a body.
  if (!response.body.empty()) return;
  std::vector<std::string> methods;
  for (const Route& route : routes_)
    if (std::regex_match(request.path, route.path)) methods.push_back(route.method);
  const std::string where = fmt::format("{:.10} {:.200}", request.method, logged_path(request));
  if ((response.status == 404 || response.status == 400) && !methods.empty() &&
      std::ranges::find(methods, request.method) == methods.end()) {
    response.set_header("Allow", fmt::format("{}", fmt::join(methods, ", ")));
    send_error(response, ApiError(405, "invalid_request_error",
                                  fmt::format("{} is not allowed: {} takes {}", where, route_label(request.path),
                                              fmt::join(methods, ", ")),
                                  {}, "method_not_allowed"));
  } else if (response.status == 404) {
    send_error(response, ApiError(404, "not_found_error", fmt::format("no route for {}", where), {}, "unknown_url"));
  } else if (response.status == 413) {
    send_error(response, ApiError(413, "invalid_request_error",
                                  fmt::format("the body is larger than the limit of {} bytes", options_.max_body_bytes),
                                  {}, "request_too_large"));
  } else {
    send_error(response,
               ApiError(response.status, "invalid_request_error",
                        fmt::format("{} could not be read as an HTTP request (status {})", where, response.status)));
  }
}

void Server::log(const httplib::Request& request, const httplib::Response& response) {
  const double ms =
      request_start ? std::chrono::duration<double, std::milli>(Clock::now() - *request_start).count() : 0.0;
  request_start.reset();
  metrics_->count_request(route_label(request.path), response.status);
  fmt::print(stderr, "{:.10} {:.200} {} {:.1f} ms\n", request.method, logged_path(request), response.status, ms);
}

std::shared_ptr<Server::Admission> Server::admit(int64_t sequences) {
  const std::lock_guard lock(mutex_);
  if (stopping_) throw ApiError(503, "server_error", "the server is shutting down", {}, "shutting_down");
  const int64_t limit = options_.max_sequences + options_.max_waiting;
  if (sequences_in_flight_ + sequences > limit)
    throw ApiError(503, "server_error",
                   fmt::format("the server is busy: {} sequences run or wait, and it takes {} at most; retry later",
                               sequences_in_flight_, limit),
                   {}, "server_overloaded");
  sequences_in_flight_ += sequences;
  ++answers_in_flight_;
  return std::make_shared<Admission>(*this, sequences);
}

int Server::bind() {
  int port = options_.port;
  if (port == 0)
    port = http_->bind_to_any_port(options_.host);
  else if (!http_->bind_to_port(options_.host, port))
    port = -1;
  if (port < 0)
    fail("cannot listen on {}:{}: the port is in use, or the address is not one of this machine's", options_.host,
         options_.port);
  http_->widen_backlog();
  return port;
}

bool Server::listen() {
  const bool listened = http_->listen_after_bind();
  listen_returned_ = true;
  return listened;
}

void Server::shutdown() {
  std::unique_lock lock(mutex_);
  stopping_ = true;
  if (!idle_.wait_for(lock, options_.shutdown_grace, [this] { return answers_in_flight_ == 0; })) {
    lock.unlock();
    for (const std::shared_ptr<Job>& job : jobs_.unfinished()) job->cancel();
    lock.lock();
    idle_.wait_for(lock, kCancelledAnswers, [this] { return answers_in_flight_ == 0; });
  }
  lock.unlock();
  // cpp-httplib's stop() does nothing before listen() runs its accept loop: a signal may come that early.
  while (!http_->is_running() && !listen_returned_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();
}

json Server::model_json() const {
  return {{"id", model_.id},
          {"object", "model"},
          {"created", started_},
          {"owned_by", "rocmforge"},
          {"max_model_len", model_.sequence_context}};
}

void Server::models(const httplib::Request&, httplib::Response& response) {
  send_json(response, {{"object", "list"}, {"data", json::array({model_json()})}});
}

void Server::model(const httplib::Request& request, httplib::Response& response) {
  const std::string name = request.matches[1];
  if (std::ranges::find(model_.names, name) == model_.names.end())
    throw ApiError(404, "invalid_request_error", fmt::format("the model '{:.80}' does not exist", name), "model",
                   "model_not_found");
  send_json(response, model_json());
}

void Server::completions(const httplib::Request& request, httplib::Response& response) {
  serve_generation(read_completion_request(parse_body(request.body), model_), response);
}

void Server::chat_completions(const httplib::Request& request, httplib::Response& response) {
  serve_generation(read_chat_request(parse_body(request.body), model_), response);
}

void Server::generate(const httplib::Request& request, httplib::Response& response) {
  serve_generation(read_generate_request(parse_body(request.body), model_, false), response);
}

void Server::generate_stream(const httplib::Request& request, httplib::Response& response) {
  serve_generation(read_generate_request(parse_body(request.body), model_, true), response);
}

void Server::serve_generation(GenerationRequest request, httplib::Response& response) {
  const std::shared_ptr<Admission> admission = admit(request.sequences());
  auto job = std::make_shared<Job>(jobs_.new_id(id_prefix(request.api)), request, request.stream, metrics_);
  auto context = std::make_shared<ResponseContext>();
  context->id = job->id();
  context->created = job->created();
  context->model = model_.id;
  context->api = request.api;
  context->choices_per_prompt = request.choices;
  for (const engine::Request& prompt : request.requests)
    context->prompt_tokens.push_back(static_cast<int64_t>(prompt.prompt.size()));
  context->logprobs = request.logprobs();
  context->tokenizer = &engine_.tokenizer();

  job->attach(request.requests);
  try {
    job->start(scheduler_.submit(std::move(request.requests)));
  } catch (const Error& e) {
    // The fields were checked against the same rules: what is left is the scheduler's own word.
    throw ApiError(400, "invalid_request_error", e.what());
  }
  jobs_.add(job);
  response.set_header("X-Request-Id", job->id());
  // An answer that was not written to its end (the client went away first) cancels what it asked for.
  const auto release = [job, admission](bool) { job->cancel(); };
  if (request.stream) {
    response.set_header("Cache-Control", "no-cache");
    response.set_chunked_content_provider(
        "text/event-stream",
        [this, job, context, include_usage = request.include_usage](size_t, httplib::DataSink& sink) {
          return write_stream(*job, *context, include_usage, sink);
        },
        release);
  } else {
    // Written by a content provider too, which watches the connection while the request runs.
    response.set_chunked_content_provider(
        "application/json",
        [this, job, context](size_t, httplib::DataSink& sink) { return write_object(*job, *context, sink); }, release);
  }
}

bool Server::write_object(Job& job, const ResponseContext& context, httplib::DataSink& sink) {
  while (!job.wait_finished(kWatchInterval)) {
    if (!sink.is_writable()) {
      job.cancel();
      return false;
    }
  }
  std::string body;
  try {
    const std::vector<engine::Generation> generations = job.results();
    body = json_text(context.api == Api::Generate ? generate_response(context, generations)
                                                  : openai_response(context, generations));
  } catch (const std::exception& e) {
    // The status line (200) went out with the headers: an error the engine raised while the request ran is the body.
    body = json_text(ApiError(500, "server_error", e.what()).to_json());
  }
  if (!sink.write(body.data(), body.size())) return false;
  sink.done();
  return true;
}

bool Server::write_stream(Job& job, const ResponseContext& context, bool include_usage, httplib::DataSink& sink) {
  OpenAiStream openai(context, include_usage);
  for (bool last = false; !last;) {
    Job::Events taken = job.take_events(kWatchInterval);
    last = taken.last;
    if (taken.events.empty() && !last && !sink.is_writable()) {
      job.cancel();
      return false;
    }
    for (const Job::Event& event : taken.events) {
      const std::vector<json> chunks =
          context.api == Api::Generate ? std::vector{generate_event(context, event)} : openai.chunks(event);
      for (const json& chunk : chunks) {
        if (!write_event(sink, chunk)) {
          job.cancel();
          return false;
        }
      }
    }
  }
  try {
    const std::vector<engine::Generation> generations = job.results();
    if (context.api == Api::Generate) {
      json done = generate_response(context, generations);
      done["done"] = true;
      if (!write_event(sink, done)) return false;
    } else if (include_usage && !write_event(sink, openai.usage_chunk(generations))) {
      return false;
    }
  } catch (const std::exception& e) {
    if (!write_event(sink, ApiError(500, "server_error", e.what()).to_json())) return false;
  }
  if (context.api != Api::Generate) {
    static constexpr std::string_view kDone = "data: [DONE]\n\n";
    if (!sink.write(kDone.data(), kDone.size())) return false;
  }
  sink.done();
  return true;
}

std::shared_ptr<Job> Server::find_job(const httplib::Request& request) {
  const std::string id = request.matches[1];
  std::shared_ptr<Job> job = jobs_.find(id);
  if (!job)
    throw ApiError(404, "not_found_error", fmt::format("no request has the id '{:.80}' (or it finished long ago)", id),
                   "id");
  return job;
}

void Server::status(const httplib::Request& request, httplib::Response& response) {
  send_json(response, find_job(request)->status());
}

void Server::cancel(const httplib::Request& request, httplib::Response& response) {
  const std::shared_ptr<Job> job = find_job(request);
  job->cancel();
  send_json(response, job->status());
}

void Server::tokenize(const httplib::Request& request, httplib::Response& response) {
  const json body = parse_body(request.body);
  const Fields fields(body);
  // The native name, or llama.cpp's.
  std::optional<std::string> text = fields.string("prompt");
  if (!text) text = fields.string("content");
  if (!text) invalid_field("prompt", "prompt is required");
  const Tokenizer& tokenizer = engine_.tokenizer();
  // By default tokenized as the completions and /generate tokenize a prompt, so that the counts agree.
  const std::vector<int32_t> ids = tokenizer.encode(*text, fields.boolean("add_special").value_or(true),
                                                    fields.boolean("parse_special").value_or(true));
  json tokens = ids;
  if (fields.boolean("with_pieces").value_or(false)) {
    tokens = json::array();
    for (const int32_t id : ids) tokens.push_back({{"id", id}, {"piece", tokenizer.token_to_piece(id, true)}});
  }
  send_json(response, {{"tokens", tokens}});
}

void Server::detokenize(const httplib::Request& request, httplib::Response& response) {
  const json body = parse_body(request.body);
  const Fields fields(body);
  const json* tokens = fields.find("tokens");
  if (!tokens) invalid_field("tokens", "tokens is required");
  const bool none = tokens->is_array() && tokens->empty();
  const std::vector<int32_t> ids =
      none ? std::vector<int32_t>{} : read_token_ids(*tokens, "tokens", engine_.tokenizer());
  send_json(response, {{"text", engine_.tokenizer().decode(ids, fields.boolean("render_special").value_or(false))}});
}

void Server::health(const httplib::Request&, httplib::Response& response) {
  bool stopping = false;
  {
    const std::lock_guard lock(mutex_);
    stopping = stopping_;
  }
  send_json(response, {{"status", stopping ? "stopping" : "ok"}}, stopping ? 503 : 200);
}

void Server::metrics(const httplib::Request&, httplib::Response& response) {
  const LoadState load{.weight_bytes_loaded = engine_.plan().loading_stats().bytes,
                       .weight_bytes = engine_.file().tensor_bytes()};
  response.set_content(metrics_->text(scheduler_.stats(), load), "text/plain; version=0.0.4");
}

}  // namespace rf::server
