// rocmforge-load: N concurrent clients streaming completions from `rocmforge serve` (or any server of OpenAI's
// completions API) over HTTP. Each client sends its requests one after another on its own connection: a prompt of
// exactly --prompt-tokens random token ids (the first --shared-prefix of them alike in every request) and
// --output-tokens to generate past end-of-generation tokens. For each client count it reports requests/s, output
// tokens/s, and the median and p99 of time to first token (TTFT), time per output token (TPOT) and latency.
//
//   rocmforge-load [--url http://127.0.0.1:8080] [--clients 1,8,32,64] [--requests 4 | --total-requests M]
//                  [--prompt-tokens 128] [--output-tokens 128] [--shared-prefix K] [--vocab 1000] [--model NAME]
//                  [--api-key KEY] [--json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <latch>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli/options.h"
#include "util/error.h"

namespace {

using Clock = std::chrono::steady_clock;
using rf::fail;

constexpr int64_t kMaxClients = 1024;      // client threads a run starts at most, as `bench --parallel` sequences
constexpr int32_t kFirstOrdinaryToken = 3;  // ids below are often special (unknown, beginning, end of text)
constexpr size_t kMaxErrorText = 300;       // characters of an error body kept in a report
// A request queued behind many others may wait long for its first byte; the server's own limits should end it, not
// the client's (cpp-httplib's default read timeout is 5 seconds).
constexpr std::chrono::seconds kReadTimeout{600};

struct LoadOptions {
  std::string url = "http://127.0.0.1:8080";
  std::vector<int64_t> clients = {1};  // one run per entry, in order
  int64_t requests_per_client = 4;
  int64_t total_requests = 0;  // when given, split over the clients instead of requests_per_client each
  int64_t prompt_tokens = 128;
  int64_t output_tokens = 128;
  int64_t shared_prefix = 0;
  int64_t vocab = 1000;
  std::string model;  // empty: the first model GET /v1/models lists
  std::string api_key;
  bool json = false;
};

// One request's outcome and when each part of its answer came.
struct RequestResult {
  std::string error;  // empty: the stream ended with data: [DONE]
  Clock::time_point sent, first_text, last_text, ended;
  int64_t output_tokens = 0;  // the usage chunk's completion_tokens, else the chunks with text
};

// An error body's message: OpenAI's {"error": {"message"}} when it is one, else the body itself, shortened.
std::string error_message(const std::string& body) {
  const nlohmann::json parsed = nlohmann::json::parse(body, nullptr, false);
  if (parsed.is_object() && parsed.contains("error")) {
    const nlohmann::json& error = parsed["error"];
    if (error.is_object() && error.contains("message") && error["message"].is_string())
      return error["message"].get<std::string>();
    return error.dump();
  }
  return body.size() > kMaxErrorText ? body.substr(0, kMaxErrorText) + "..." : body;
}

// Reads one streamed completion as it arrives: server-sent events whose data are JSON chunks (each choice's text
// one token's), a usage chunk, then [DONE]. OpenAI's server, llama.cpp's and vLLM send each event's data on one
// `data:` line, so each such line is taken alone.
class CompletionStream {
 public:
  // Takes the next bytes of the body, all arrived now; false once the stream is broken (reading stops).
  bool receive(std::string_view bytes) {
    const Clock::time_point now = Clock::now();
    pending_.append(bytes);
    size_t start = 0;
    for (size_t end; error_.empty() && (end = pending_.find('\n', start)) != std::string::npos; start = end + 1)
      take_line(std::string_view(pending_).substr(start, end - start), now);
    pending_.erase(0, start);
    return error_.empty();
  }

  // The request's result, its stream having ended (or broken off) at `ended`.
  RequestResult finish(Clock::time_point sent, Clock::time_point ended) const {
    RequestResult result{.error = error_, .sent = sent, .first_text = first_text_, .last_text = last_text_,
                         .ended = ended, .output_tokens = usage_tokens_.value_or(text_chunks_)};
    if (result.error.empty() && !done_) result.error = "the stream ended before data: [DONE]";
    if (result.error.empty() && text_chunks_ == 0) result.error = "the stream carried no text";
    return result;
  }

 private:
  void take_line(std::string_view line, Clock::time_point now) {
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (done_ || !line.starts_with("data:")) return;  // blank lines end events; comments and other fields say nothing
    line.remove_prefix(5);
    if (line.starts_with(' ')) line.remove_prefix(1);
    if (line == "[DONE]") {
      done_ = true;
      return;
    }
    const std::string payload(line);
    const nlohmann::json chunk = nlohmann::json::parse(payload, nullptr, false);
    if (!chunk.is_object()) {
      error_ = fmt::format("a chunk that is not a JSON object: {}", error_message(payload));
      return;
    }
    if (chunk.contains("error")) {
      error_ = fmt::format("an error in the stream: {}", error_message(payload));
      return;
    }
    try {
      const nlohmann::json choices = chunk.value("choices", nlohmann::json::array());
      if (!choices.empty() && !choices.at(0).value("text", std::string()).empty()) {
        if (text_chunks_++ == 0) first_text_ = now;
        last_text_ = now;
      }
      if (chunk.contains("usage") && !chunk["usage"].is_null())
        usage_tokens_ = chunk["usage"].at("completion_tokens").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      error_ = fmt::format("a malformed chunk ({}): {}", e.what(), error_message(payload));
    }
  }

  std::string pending_;  // bytes after the last whole line
  std::string error_;
  bool done_ = false;
  int64_t text_chunks_ = 0;
  std::optional<int64_t> usage_tokens_;
  Clock::time_point first_text_, last_text_;
};

// A client of one connection, kept alive between requests as OpenAI's client libraries keep theirs. Without
// TCP_NODELAY the request body waits for the acknowledgement of its headers (a delayed ACK, 40 ms on Linux), which
// every time to first token would include.
httplib::Client make_client(const std::string& url) {
  // cpp-httplib takes [scheme://]host[:port] alone: one with a path would connect to a host named by all of it.
  const size_t authority = url.find("://");
  httplib::Client client(url);
  if (url.find('/', authority == std::string::npos ? 0 : authority + 3) != std::string::npos || !client.is_valid())
    fail("--url {} is not http://HOST:PORT or https://HOST:PORT (with nothing after it)", url);
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);
  client.set_read_timeout(kReadTimeout);
  return client;
}

// cpp-httplib names its errors in a word ("Connection", "Read").
std::string connection_error(httplib::Error error) {
  return fmt::format("the connection failed (cpp-httplib: {})", httplib::to_string(error));
}

httplib::Headers request_headers(const LoadOptions& options) {
  if (options.api_key.empty()) return {};
  return {{"Authorization", "Bearer " + options.api_key}};
}

// The model to name in requests: the first that the server lists.
std::string served_model(httplib::Client& client, const httplib::Headers& headers) {
  const httplib::Result result = client.Get("/v1/models", headers);
  if (!result) fail("GET /v1/models: {}", connection_error(result.error()));
  if (result->status != 200) fail("GET /v1/models: HTTP {}: {}", result->status, error_message(result->body));
  const nlohmann::json models = nlohmann::json::parse(result->body, nullptr, false);
  try {
    return models.at("data").at(0).at("id").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    fail("GET /v1/models named no model (give --model): {}", error_message(result->body));
  }
}

std::string completion_body(const std::string& model, const std::vector<int32_t>& prompt, int64_t output_tokens) {
  // Greedy, as `bench --parallel` decodes. ignore_eos is vLLM's and llama.cpp's field and min_tokens vLLM's: either
  // makes every request generate exactly max_tokens, so that all requests cost the same.
  const nlohmann::json body = {{"model", model},
                               {"prompt", prompt},
                               {"max_tokens", output_tokens},
                               {"min_tokens", output_tokens},
                               {"ignore_eos", true},
                               {"temperature", 0.0},
                               {"stream", true},
                               {"stream_options", {{"include_usage", true}}}};
  return body.dump();
}

// Streams one completion; any HTTP status but 200, a connection error or a broken stream is the result's error.
RequestResult send_completion(httplib::Client& client, const httplib::Headers& headers, const std::string& body) {
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.headers = headers;
  request.set_header("Content-Type", "application/json");
  request.body = body;
  int status = 0;
  std::string error_body;
  CompletionStream stream;
  request.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (status == 200) return stream.receive(std::string_view(data, size));
    error_body.append(data, size);
    return true;
  };
  const Clock::time_point sent = Clock::now();
  const httplib::Result result = client.send(request);
  RequestResult outcome = stream.finish(sent, Clock::now());
  // A receiver that stopped reading cancels the request: the stream's own error says why.
  if (status != 0 && status != 200)
    outcome.error = fmt::format("HTTP {}: {}", status, error_message(error_body));
  else if (!result && result.error() != httplib::Error::Canceled)
    outcome.error = connection_error(result.error());
  return outcome;
}

void append_random_tokens(std::vector<int32_t>& tokens, int64_t count, int64_t vocab, std::mt19937_64& random) {
  std::uniform_int_distribution<int32_t> ids(kFirstOrdinaryToken, static_cast<int32_t>(vocab - 1));
  for (int64_t i = 0; i < count; ++i) tokens.push_back(ids(random));
}

// Prompts that start with the shared prefix and go on with random tokens of their own, so that no two requests
// share more than the prefix (seeded from the system, so neither do those of an earlier run against the server).
class PromptSource {
 public:
  PromptSource(const std::vector<int32_t>& prefix, const LoadOptions& options)
      : prefix_(prefix), options_(options), random_(std::random_device{}()) {}

  std::vector<int32_t> next() {
    std::vector<int32_t> prompt = prefix_;
    append_random_tokens(prompt, options_.prompt_tokens - options_.shared_prefix, options_.vocab, random_);
    return prompt;
  }

 private:
  const std::vector<int32_t>& prefix_;
  const LoadOptions& options_;
  std::mt19937_64 random_;
};

struct Quantiles {
  double median = std::numeric_limits<double>::quiet_NaN();
  double p99 = std::numeric_limits<double>::quiet_NaN();
};

// Quantiles interpolated between the nearest ranks (numpy's default); NaN of no values.
Quantiles quantiles_of(std::vector<double> values) {
  if (values.empty()) return {};
  std::ranges::sort(values);
  const auto at = [&](double q) {
    const double rank = q * static_cast<double>(values.size() - 1);
    const auto below = static_cast<size_t>(rank);
    const double above = values[std::min(below + 1, values.size() - 1)];
    return values[below] + (rank - static_cast<double>(below)) * (above - values[below]);
  };
  return {at(0.5), at(0.99)};
}

double to_seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

// One run at one client count, summarised over the requests that completed.
struct RunSummary {
  int64_t clients = 0;
  int64_t completed = 0;
  int64_t failed = 0;
  std::string first_error;  // of the failed request that ended first
  double wall_seconds = 0;  // from the first request sent to the last one ended
  int64_t output_tokens = 0;
  Quantiles time_to_first_token, time_per_output_token, latency;  // seconds
  int64_t other_lengths = 0;  // completed requests whose output tokens were not --output-tokens
  int64_t fewest_tokens = 0, most_tokens = 0;
};

RunSummary summarise(int64_t clients, const std::vector<RequestResult>& requests, int64_t output_tokens) {
  RunSummary summary;
  summary.clients = clients;
  Clock::time_point first_sent = Clock::time_point::max(), last_ended = Clock::time_point::min();
  Clock::time_point first_failure = Clock::time_point::max();
  std::vector<double> ttft, tpot, latency, lengths;
  for (const RequestResult& r : requests) {
    first_sent = std::min(first_sent, r.sent);
    last_ended = std::max(last_ended, r.ended);
    if (!r.error.empty()) {
      ++summary.failed;
      if (r.ended < first_failure) {
        first_failure = r.ended;
        summary.first_error = r.error;
      }
      continue;
    }
    ++summary.completed;
    summary.output_tokens += r.output_tokens;
    summary.other_lengths += r.output_tokens != output_tokens;
    lengths.push_back(static_cast<double>(r.output_tokens));
    ttft.push_back(to_seconds(r.first_text - r.sent));
    if (r.output_tokens > 1)
      tpot.push_back(to_seconds(r.last_text - r.first_text) / static_cast<double>(r.output_tokens - 1));
    latency.push_back(to_seconds(r.ended - r.sent));
  }
  summary.wall_seconds = to_seconds(last_ended - first_sent);
  if (!lengths.empty()) {
    summary.fewest_tokens = static_cast<int64_t>(std::ranges::min(lengths));
    summary.most_tokens = static_cast<int64_t>(std::ranges::max(lengths));
  }
  summary.time_to_first_token = quantiles_of(std::move(ttft));
  summary.time_per_output_token = quantiles_of(std::move(tpot));
  summary.latency = quantiles_of(std::move(latency));
  return summary;
}

// `clients` threads, each with its own connection, sending their requests back to back from the same moment on.
RunSummary run_clients(const LoadOptions& options, const std::string& model, const std::vector<int32_t>& prefix,
                       int64_t clients) {
  const httplib::Headers headers = request_headers(options);
  std::vector<std::vector<RequestResult>> results(clients);
  std::latch connected(clients);
  {
    std::vector<std::jthread> threads;
    for (int64_t c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        httplib::Client client = make_client(options.url);
        // Connected before the start, so that the first request's times hold no connection setup; the answer
        // does not matter (a server without the route still keeps the connection open).
        client.Get("/v1/models", headers);
        PromptSource prompts(prefix, options);
        const int64_t requests = options.total_requests == 0
                                     ? options.requests_per_client
                                     : options.total_requests / clients + (c < options.total_requests % clients);
        connected.arrive_and_wait();
        for (int64_t r = 0; r < requests; ++r)
          results[c].push_back(send_completion(client, headers, completion_body(model, prompts.next(),
                                                                                options.output_tokens)));
      });
  }
  std::vector<RequestResult> requests;
  for (std::vector<RequestResult>& client_results : results)
    requests.insert(requests.end(), client_results.begin(), client_results.end());
  return summarise(clients, requests, options.output_tokens);
}

double per_second(double count, double seconds) { return seconds > 0 ? count / seconds : 0.0; }

// A time of the table in milliseconds; "-" where there was none to measure.
std::string milliseconds_text(double seconds) {
  return std::isnan(seconds) ? "-" : fmt::format("{:.2f}", seconds * 1e3);
}

std::string requests_text(const LoadOptions& options) {
  return options.total_requests == 0 ? fmt::format("{} requests per client", options.requests_per_client)
                                     : fmt::format("{} requests in all", options.total_requests);
}

void print_table(const LoadOptions& options, const std::string& model, const std::vector<RunSummary>& runs) {
  fmt::print("{} ({}), prompts of {} tokens ({} shared), {} output tokens, {}; times in ms (E2E: the whole "
             "request)\n\n", options.url, model, options.prompt_tokens, options.shared_prefix, options.output_tokens,
             requests_text(options));
  fmt::print("| {:>7} | {:>8} | {:>6} | {:>7} | {:>7} | {:>9} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} |\n",
             "clients", "requests", "errors", "wall s", "req/s", "out t/s", "TTFT p50", "TTFT p99", "TPOT p50",
             "TPOT p99", "E2E p50", "E2E p99");
  fmt::print("| {:->6}: | {:->7}: | {:->5}: | {:->6}: | {:->6}: | {:->8}: | {:->7}: | {:->7}: | {:->7}: | {:->7}: "
             "| {:->7}: | {:->7}: |\n", "", "", "", "", "", "", "", "", "", "", "", "");
  for (const RunSummary& r : runs)
    fmt::print("| {:>7} | {:>8} | {:>6} | {:>7.2f} | {:>7.2f} | {:>9.1f} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | "
               "{:>8} |\n",
               r.clients, r.completed, r.failed, r.wall_seconds,
               per_second(static_cast<double>(r.completed), r.wall_seconds),
               per_second(static_cast<double>(r.output_tokens), r.wall_seconds),
               milliseconds_text(r.time_to_first_token.median), milliseconds_text(r.time_to_first_token.p99),
               milliseconds_text(r.time_per_output_token.median), milliseconds_text(r.time_per_output_token.p99),
               milliseconds_text(r.latency.median), milliseconds_text(r.latency.p99));
  for (const RunSummary& r : runs) {
    if (r.failed > 0) fmt::print("\n{} clients: {} requests failed; the first: {}", r.clients, r.failed, r.first_error);
    if (r.other_lengths > 0)
      fmt::print("\n{} clients: {} of {} requests received {} output tokens, not {} (the server may not honour "
                 "ignore_eos or min_tokens)", r.clients, r.other_lengths, r.completed,
                 r.fewest_tokens == r.most_tokens ? fmt::format("{}", r.fewest_tokens)
                                                  : fmt::format("{} to {}", r.fewest_tokens, r.most_tokens),
                 options.output_tokens);
  }
  fmt::print("\n");
}

nlohmann::json milliseconds_json(const Quantiles& q) {
  return {{"median", q.median * 1e3}, {"p99", q.p99 * 1e3}};  // NaN (no values) prints as null
}

void print_json(const LoadOptions& options, const std::string& model, const std::vector<RunSummary>& runs) {
  nlohmann::json rows = nlohmann::json::array();
  for (const RunSummary& r : runs)
    rows.push_back({{"clients", r.clients},
                    {"requests", r.completed},
                    {"errors", r.failed},
                    {"first_error", r.failed > 0 ? nlohmann::json(r.first_error) : nlohmann::json(nullptr)},
                    {"wall_seconds", r.wall_seconds},
                    {"requests_per_second", per_second(static_cast<double>(r.completed), r.wall_seconds)},
                    {"output_tokens", r.output_tokens},
                    {"output_tokens_per_second", per_second(static_cast<double>(r.output_tokens), r.wall_seconds)},
                    {"requests_with_other_output_tokens", r.other_lengths},
                    {"ttft_ms", milliseconds_json(r.time_to_first_token)},
                    {"tpot_ms", milliseconds_json(r.time_per_output_token)},
                    {"latency_ms", milliseconds_json(r.latency)}});
  const nlohmann::json out = {{"url", options.url},
                              {"model", model},
                              {"prompt_tokens", options.prompt_tokens},
                              {"shared_prefix", options.shared_prefix},
                              {"output_tokens", options.output_tokens},
                              {"vocab", options.vocab},
                              {"runs", rows}};
  fmt::print("{}\n", out.dump(2));
}

// Every run in turn, after one untimed request: the first after the server starts may wait for weights still
// loading, and a server that cannot be reached or refuses the request shape is told at once.
int run(const LoadOptions& options) {
  if (options.shared_prefix > options.prompt_tokens)
    fail("--shared-prefix {} is longer than --prompt-tokens {}", options.shared_prefix, options.prompt_tokens);
  if (options.total_requests != 0 && options.total_requests < std::ranges::max(options.clients))
    fail("--total-requests {} leaves some of {} clients nothing to send", options.total_requests,
         std::ranges::max(options.clients));
  httplib::Client client = make_client(options.url);
  const httplib::Headers headers = request_headers(options);
  const std::string model = options.model.empty() ? served_model(client, headers) : options.model;
  std::mt19937_64 random(std::random_device{}());
  std::vector<int32_t> prefix;
  append_random_tokens(prefix, options.shared_prefix, options.vocab, random);
  const std::string warm_up_body = completion_body(model, PromptSource(prefix, options).next(), options.output_tokens);
  const RequestResult warm_up = send_completion(client, headers, warm_up_body);
  if (!warm_up.error.empty()) fail("the first request failed: {}", warm_up.error);

  std::vector<RunSummary> runs;
  for (const int64_t clients : options.clients) runs.push_back(run_clients(options, model, prefix, clients));
  if (options.json)
    print_json(options, model, runs);
  else
    print_table(options, model, runs);
  return std::ranges::any_of(runs, [](const RunSummary& r) { return r.failed > 0; }) ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  LoadOptions options;
  CLI::App app{"Load generator for rocmforge serve: concurrent clients streaming /v1/completions; requests/s, output "
               "tokens/s, time to first token and per output token (median, p99). Exit status 1 when any request "
               "failed.",
               "rocmforge-load"};
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("error: {} (see --help)\n", e.what());
  });
  using rf::cli::integer_in;
  app.add_option("--url", options.url, "The server, scheme://host:port")->capture_default_str();
  app.add_option("--clients", options.clients,
                 "Concurrent clients, each on its own connection; a comma-separated list runs one after another")
      ->delimiter(',')
      ->transform(integer_in<int64_t>(1, kMaxClients))
      ->capture_default_str();
  CLI::Option* per_client = app.add_option("--requests", options.requests_per_client, "Requests each client sends")
                                ->transform(integer_in<int64_t>(1))
                                ->capture_default_str();
  app.add_option("--total-requests", options.total_requests, "Requests of a run in all, split over its clients")
      ->transform(integer_in<int64_t>(1))
      ->excludes(per_client);
  app.add_option("--prompt-tokens", options.prompt_tokens, "Prompt length: random token ids, sent as a list")
      ->transform(integer_in<int64_t>(1))
      ->capture_default_str();
  app.add_option("--output-tokens", options.output_tokens,
                 "Tokens each request generates (max_tokens, with ignore_eos and min_tokens)")
      ->transform(integer_in<int64_t>(1))
      ->capture_default_str();
  app.add_option("--shared-prefix", options.shared_prefix, "Leading prompt tokens alike in every request")
      ->transform(integer_in<int64_t>(0))
      ->capture_default_str();
  app.add_option("--vocab", options.vocab,
                 fmt::format("Prompt token ids are drawn from [{}, VOCAB)", kFirstOrdinaryToken))
      ->transform(integer_in<int64_t>(kFirstOrdinaryToken + 1, std::numeric_limits<int32_t>::max()))
      ->capture_default_str();
  app.add_option("--model", options.model, "Model name sent in requests (default: the first of GET /v1/models)");
  app.add_option("--api-key", options.api_key, "Sent as Authorization: Bearer KEY")->envname("ROCMFORGE_API_KEY");
  app.add_flag("--json", options.json, "Print one JSON object instead of the table");
  try {
    app.parse(argc, argv);
    return run(options);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
