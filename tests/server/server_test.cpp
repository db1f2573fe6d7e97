// `rocmforge serve` on the CPU with the shared trained models, talked to over HTTP: completions and chat completions,
// streamed and not, give `rocmforge run --temp 0`'s and `rocmforge chat --temp 0`'s text with usage counts that
// `rocmforge tokenize` confirms; 64 concurrent streams each get what their request gets alone; a client that goes away
// has its request cancelled and its KV blocks returned; the waiting queue, the API key, the native routes and SIGTERM
// behave as docs/API.md says.
#include <algorithm>
#include <atomic>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/server_process.h"
#include "tokenizer/chat_template.h"

namespace rf::test {
namespace {

// The JSON objects of an OpenAI stream's events, which must end with [DONE].
std::vector<json> openai_chunks(const Stream& stream) {
  EXPECT_TRUE(stream.ended);
  EXPECT_FALSE(stream.events.empty());
  if (stream.events.empty()) return {};
  EXPECT_EQ(stream.events.back(), "[DONE]");
  std::vector<json> chunks;
  for (size_t i = 0; i + 1 < stream.events.size(); ++i) chunks.push_back(json::parse(stream.events[i]));
  return chunks;
}

// The text of choice `index` in an OpenAI stream's chunks (completions' text or chat's delta content).
std::string streamed_text(const std::vector<json>& chunks, size_t index = 0) {
  std::string text;
  for (const json& chunk : chunks)
    for (const json& choice : chunk["choices"]) {
      if (choice["index"] != index) continue;
      if (choice.contains("text")) text += choice["text"].get<std::string>();
      if (choice.contains("delta") && choice["delta"].contains("content"))
        text += choice["delta"]["content"].get<std::string>();
    }
  return text;
}

TEST_F(ServerTest, CompletionsGiveRunsGreedyText) {
  for (const std::string& model : {kStories, kTinyStories}) {
    SCOPED_TRACE(model);
    ServerProcess server(serve_args(model));
    httplib::Client client = server.client();
    const std::string prompt = "Once upon a time";
    const std::string expected = run_greedy(model, prompt, 24);
    const json request = {{"model", model}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};

    const JsonResponse response = post(client, "/v1/completions", request);
    ASSERT_EQ(response.status, 200) << response.body;
    const json& body = response.body;
    EXPECT_EQ(body["object"], "text_completion");
    EXPECT_EQ(body["id"].get<std::string>().rfind("cmpl-", 0), 0u);
    EXPECT_EQ(body["model"], model);
    EXPECT_TRUE(body["created"].is_number_integer());
    ASSERT_EQ(body["choices"].size(), 1u);
    EXPECT_EQ(body["choices"][0]["index"], 0);
    EXPECT_EQ(body["choices"][0]["text"], expected);
    EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
    const json& usage = body["usage"];
    EXPECT_EQ(usage["prompt_tokens"], token_count(model, prompt));
    EXPECT_EQ(usage["total_tokens"], usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
    EXPECT_EQ(body["choices"][0]["finish_reason"], usage["completion_tokens"] == 24 ? "length" : "stop");
    EXPECT_TRUE(usage["prompt_tokens_details"]["cached_tokens"].is_number_integer());

    json streamed = request;
    streamed["stream"] = true;
    streamed["stream_options"] = {{"include_usage", true}};
    const Stream stream = post_stream(client, "/v1/completions", streamed);
    ASSERT_EQ(stream.status, 200);
    EXPECT_EQ(header(stream.headers, "Content-Type"), "text/event-stream");
    const std::vector<json> chunks = openai_chunks(stream);
    ASSERT_GE(chunks.size(), 3u);
    EXPECT_EQ(streamed_text(chunks), expected);
    for (const json& chunk : chunks) {
      EXPECT_EQ(chunk["object"], "text_completion");
      EXPECT_EQ(chunk["id"], chunks.front()["id"]);
    }
    // The finish reason in the last chunk with a choice, then the usage chunk without choices.
    EXPECT_EQ(chunks[chunks.size() - 2]["choices"][0]["finish_reason"], body["choices"][0]["finish_reason"]);
    EXPECT_TRUE(chunks.back()["choices"].empty());
    EXPECT_EQ(chunks.back()["usage"]["prompt_tokens"], usage["prompt_tokens"]);
    EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], usage["completion_tokens"]);
  }
}

TEST_F(ServerTest, ChatCompletionsGiveChatsGreedyReply) {
  for (const std::string& model : {kStories, kTinyStories}) {
    SCOPED_TRACE(model);
    // The stories models have no chat template of their own: both sides name one.
    ServerProcess server(serve_args(model));
    httplib::Client client = server.client();
    const std::string message = "Tell me a story about a dog";
    const std::string expected = chat_greedy(model, message, "chatml", 20);
    const json request = {{"messages", {{{"role", "user"}, {"content", message}}}},
                          {"chat_template", "chatml"},
                          {"max_tokens", 20},
                          {"temperature", 0}};

    const JsonResponse response = post(client, "/v1/chat/completions", request);
    ASSERT_EQ(response.status, 200) << response.body;
    const json& body = response.body;
    EXPECT_EQ(body["object"], "chat.completion");
    EXPECT_EQ(body["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
    EXPECT_EQ(body["choices"][0]["message"]["content"], expected);
    const std::vector<ChatMessage> messages = {{"user", message}};
    EXPECT_EQ(body["usage"]["prompt_tokens"],
              token_count(model, apply_chat_template(ChatTemplate::ChatML, messages, true)));

    // Content as a list of text parts is the same message.
    json parts = request;
    parts["messages"][0]["content"] = {{{"type", "text"}, {"text", message}}};
    EXPECT_EQ(post(client, "/v1/chat/completions", parts).body["choices"][0]["message"]["content"], expected);

    json streamed = request;
    streamed["stream"] = true;
    const std::vector<json> chunks = openai_chunks(post_stream(client, "/v1/chat/completions", streamed));
    ASSERT_GE(chunks.size(), 2u);
    EXPECT_EQ(chunks.front()["object"], "chat.completion.chunk");
    EXPECT_EQ(chunks.front()["choices"][0]["delta"]["role"], "assistant");
    EXPECT_EQ(streamed_text(chunks), expected);
    EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], body["choices"][0]["finish_reason"]);
    EXPECT_FALSE(chunks.back().contains("usage"));
  }
}

TEST_F(ServerTest, ChoicesPromptListsAndLogprobs) {
  ServerProcess server(serve_args(kStories, {"--alias", "stories"}));
  httplib::Client client = server.client();
  const JsonResponse models = get(client, "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["object"], "list");
  EXPECT_EQ(models.body["data"][0]["id"], "stories");
  EXPECT_EQ(get(client, "/v1/models/stories").status, 200);
  EXPECT_EQ(get(client, "/v1/models/" + kStories).status, 200);
  EXPECT_EQ(get(client, "/v1/models/other").status, 404);

  // Two prompts of two choices each: choices 0, 1 of the first prompt, then 2, 3 of the second.
  const JsonResponse listed = post(client, "/v1/completions",
                                   json{{"model", kStories},
                                        {"prompt", {"Once upon a time", "The sun was"}},
                                        {"n", 2},
                                        {"max_tokens", 6},
                                        {"temperature", 0},
                                        {"logprobs", 2},
                                        {"user", "ignored"},
                                        {"some_unknown_field", {1, 2}}});
  ASSERT_EQ(listed.status, 200) << listed.body;
  const json& choices = listed.body["choices"];
  ASSERT_EQ(choices.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(choices[i]["index"], i);
  EXPECT_EQ(choices[0]["text"], choices[1]["text"]);  // greedy: every choice alike
  EXPECT_NE(choices[0]["text"], choices[2]["text"]);
  const JsonResponse single =
      post(client, "/v1/completions", json{{"prompt", "The sun was"}, {"max_tokens", 6}, {"temperature", 0}});
  EXPECT_EQ(choices[2]["text"], single.body["choices"][0]["text"]);
  const json& logprobs = choices[0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 6u);
  ASSERT_EQ(logprobs["top_logprobs"].size(), 6u);
  EXPECT_EQ(logprobs["top_logprobs"][0].size(), 2u);
  EXPECT_LE(logprobs["token_logprobs"][0].get<double>(), 0.0);
  EXPECT_EQ(listed.body["usage"]["completion_tokens"], 24);

  const JsonResponse chat = post(
      client, "/v1/chat/completions",
      json{{"messages", {{{"role", "system"}, {"content", "Tell stories."}}, {{"role", "user"}, {"content", "Hi"}}}},
           {"max_completion_tokens", 4},
           {"temperature", 0.7},
           {"seed", 5},
           {"logprobs", true},
           {"top_logprobs", 3}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  const json& content = chat.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), chat.body["usage"]["completion_tokens"].get<size_t>());
  EXPECT_EQ(content[0]["top_logprobs"].size(), 3u);
  EXPECT_TRUE(content[0]["bytes"].is_array());
}

TEST_F(ServerTest, ConcurrentStreamsEachGetTheirOwnOutput) {
  constexpr int kClients = 64;
  ServerProcess server(serve_args(kStories, {"--ctx", "8192", "--max-seqs", "64"}));
  const char* const openings[] = {"Once upon a time", "One day, a little girl named Lily", "The sun was",
                                  "Tom and his dog", "There was a big red ball"};
  const char* const words[] = {" went", " saw", " liked", " found", " wanted", " said", " ran", " was"};
  std::vector<json> requests;
  for (int i = 0; i < kClients; ++i) {
    std::string prompt = openings[i % 5];
    for (int w = 0; w < i % 7; ++w) prompt += words[(i + w) % 8];
    json request = {{"prompt", prompt}, {"max_tokens", 12 + i % 21}, {"seed", 100 + i}};
    request["temperature"] = i % 2 == 0 ? 0.0 : 0.9;
    requests.push_back(request);
  }
  // Each alone first, one after another.
  std::vector<std::string> alone;
  httplib::Client client = server.client();
  for (const json& request : requests) {
    const JsonResponse response = post(client, "/v1/completions", request);
    ASSERT_EQ(response.status, 200) << response.body;
    alone.push_back(response.body["choices"][0]["text"]);
  }

  std::vector<std::string> streamed(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      httplib::Client own = server.client();
      json request = requests[static_cast<size_t>(i)];
      request["stream"] = true;
      const Stream stream = post_stream(own, "/v1/completions", request);
      if (stream.status == 200 && stream.ended && !stream.events.empty() && stream.events.back() == "[DONE]") {
        std::vector<json> chunks;
        for (size_t e = 0; e + 1 < stream.events.size(); ++e) chunks.push_back(json::parse(stream.events[e]));
        streamed[static_cast<size_t>(i)] = streamed_text(chunks);
      }
    });
  for (std::thread& thread : threads) thread.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(streamed[static_cast<size_t>(i)], alone[static_cast<size_t>(i)]) << i;
}

// Reads /metrics until the KV blocks held by sequences are back to 0; whether they are within 30 s.
bool blocks_return(httplib::Client& client) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < end) {
    const httplib::Result result = client.Get("/metrics");
    if (result && metric(result->body, "rocmforge_kv_blocks_used") == 0.0 &&
        metric(result->body, "rocmforge_sequences_running") == 0.0)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST_F(ServerTest, ClientsThatGoAwayHaveTheirRequestsCancelled) {
  ServerProcess server(serve_args(kStories, {"--ctx", "4096"}));
  httplib::Client client = server.client();
  // Long enough that it is still running when the client leaves (ignore_eos: no early end).
  const json request = {{"prompt", "Once upon a time"}, {"max_tokens", 1800}, {"ignore_eos", true}};

  json streamed = request;
  streamed["stream"] = true;
  int events = 0;
  httplib::Client leaving = server.client();
  const Stream stream = post_stream(leaving, "/v1/completions", streamed, [&](const std::string&) {
    return ++events < 3;  // leaves after the third event
  });
  EXPECT_EQ(stream.status, 200);
  EXPECT_FALSE(stream.ended);
  EXPECT_TRUE(blocks_return(client)) << server.log();
  const std::string id = header(stream.headers, "X-Request-Id");
  const JsonResponse status = get(client, "/status/" + id);
  ASSERT_EQ(status.status, 200) << status.body;
  EXPECT_EQ(status.body["state"], "finished");
  EXPECT_EQ(status.body["choices"][0]["finish_reason"], "cancelled");
  EXPECT_LT(status.body["choices"][0]["completion_tokens"], 1800);

  // Not streamed: the client gives up waiting for the whole answer.
  httplib::Client impatient("127.0.0.1", server.port());
  impatient.set_read_timeout(std::chrono::milliseconds(100));
  EXPECT_FALSE(impatient.Post("/v1/completions", request.dump(), "application/json"));
  EXPECT_TRUE(blocks_return(client)) << server.log();
  const std::string metrics = client.Get("/metrics")->body;
  EXPECT_LT(metric(metrics, "rocmforge_generation_tokens_total").value_or(1e9), 2 * 1800);
}

TEST_F(ServerTest, MoreWaitingThanTheQueueHoldsAreRefused) {
  ServerProcess server(serve_args(kStories, {"--max-seqs", "1", "--max-waiting", "1"}));
  const json request = {{"prompt", "Once upon a time"}, {"max_tokens", 1800}, {"ignore_eos", true}, {"stream", true}};
  // One runs and one waits, each until it is cancelled.
  std::vector<std::string> ids(2);
  std::atomic<int> started = 0;
  std::vector<std::thread> streams;
  for (size_t i = 0; i < 2; ++i)
    streams.emplace_back([&, i] {
      httplib::Client own = server.client();
      httplib::Request http;
      http.method = "POST";
      http.path = "/v1/completions";
      http.body = request.dump();
      http.set_header("Content-Type", "application/json");
      http.response_handler = [&](const httplib::Response& response) {
        ids[i] = response.get_header_value("X-Request-Id");
        ++started;
        return true;
      };
      http.content_receiver = [](const char*, size_t, uint64_t, uint64_t) { return true; };
      own.send(http);
    });
  while (started < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));

  httplib::Client client = server.client();
  const JsonResponse refused = post(client, "/v1/completions", json{{"prompt", "Hello"}, {"max_tokens", 4}});
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(header(refused.headers, "Retry-After"), "1");
  EXPECT_EQ(refused.body["error"]["code"], "server_overloaded");
  for (const std::string& id : ids) {
    const JsonResponse cancelled = post(client, "/cancel/" + id, std::string("{}"));
    EXPECT_EQ(cancelled.status, 200) << cancelled.body;
    EXPECT_TRUE(cancelled.body["cancelled"].get<bool>());
  }
  for (std::thread& stream : streams) stream.join();
  // Their places come back once their answers have ended on the server's side too.
  int status = 503;
  for (int i = 0; i < 500 && status == 503; ++i) {
    status = post(client, "/v1/completions", json{{"prompt", "Hello"}, {"max_tokens", 4}}).status;
    if (status == 503) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(status, 200);
  EXPECT_EQ(post(client, "/cancel/no-such-id", std::string("{}")).status, 404);
}

TEST_F(ServerTest, NativeRoutes) {
  ServerProcess server(serve_args(kStories));
  httplib::Client client = server.client();
  const std::string prompt = "Once upon a time";

  EXPECT_EQ(get(client, "/status/gen-unknown").status, 404);
  const JsonResponse health = get(client, "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body["status"], "ok");

  const JsonResponse tokenized = post(client, "/tokenize", json{{"prompt", prompt}});
  ASSERT_EQ(tokenized.status, 200) << tokenized.body;
  EXPECT_EQ(tokenized.body["tokens"].size(), token_count(kStories, prompt));
  const std::vector<int32_t> ids = tokenized.body["tokens"];
  const JsonResponse detokenized = post(client, "/detokenize", json{{"tokens", ids}});
  EXPECT_EQ(detokenized.body["text"], prompt);
  const JsonResponse pieces = post(client, "/tokenize", json{{"content", prompt}, {"with_pieces", true}});
  EXPECT_EQ(pieces.body["tokens"][1]["id"], ids[1]);

  const json request = {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"top_logprobs", 1}};
  const JsonResponse generated = post(client, "/generate", request);
  ASSERT_EQ(generated.status, 200) << generated.body;
  const json& choice = generated.body["choices"][0];
  EXPECT_EQ(choice["text"], run_greedy(kStories, prompt, 16));
  EXPECT_EQ(choice["tokens"].size(), 16u);
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(choice["logprobs"].size(), 16u);
  EXPECT_EQ(choice["logprobs"][0]["id"], choice["tokens"][0]);
  EXPECT_GT(choice["timings"]["decode_ms"], 0.0);
  EXPECT_EQ(generated.body["usage"]["prompt_tokens"], ids.size());
  // The same token ids as a prompt give the same text.
  EXPECT_EQ(post(client, "/generate", json{{"prompt", ids}, {"max_tokens", 16}, {"temperature", 0}})
                .body["choices"][0]["text"],
            choice["text"]);

  const Stream stream = post_stream(client, "/generate/stream", request);
  ASSERT_EQ(stream.status, 200);
  ASSERT_TRUE(stream.ended);
  std::string text;
  for (size_t i = 0; i + 1 < stream.events.size(); ++i) text += json::parse(stream.events[i])["text"];
  EXPECT_EQ(text, choice["text"]);
  const json done = json::parse(stream.events.back());
  EXPECT_TRUE(done["done"].get<bool>());
  EXPECT_EQ(done["choices"][0]["tokens"], choice["tokens"]);

  // A prompt of whole KV blocks the second time takes them from the prefix cache.
  const json story = {{"prompt",
                       "The sun was shining and the birds were singing. Tom and his dog went to the big park "
                       "to play with a red ball."},
                      {"max_tokens", 2}};
  EXPECT_EQ(post(client, "/generate", story).body["usage"]["reused_tokens"], 0);
  EXPECT_GE(post(client, "/generate", story).body["usage"]["reused_tokens"], 16);

  const std::string id = generated.body["id"];
  const JsonResponse status = get(client, "/status/" + id);
  EXPECT_EQ(status.body["state"], "finished");
  EXPECT_EQ(status.body["choices"][0]["completion_tokens"], 16);
  EXPECT_FALSE(status.body["cancelled"].get<bool>());

  const httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  for (const char* name :
       {"rocmforge_prompt_tokens_total", "rocmforge_generation_tokens_total",
        "rocmforge_time_to_first_token_seconds_count", "rocmforge_time_per_output_token_seconds_count",
        "rocmforge_sequences_running", "rocmforge_sequences_waiting", "rocmforge_kv_blocks_used",
        "rocmforge_kv_blocks_total", "rocmforge_prefix_cache_hits_total", "rocmforge_weight_bytes_loaded",
        "rocmforge_load_progress"})
    EXPECT_TRUE(metric(metrics->body, name)) << name;
  EXPECT_EQ(metric(metrics->body, "rocmforge_load_progress"), 1.0);
  EXPECT_GE(metric(metrics->body, "rocmforge_generation_tokens_total"), 48.0);
  EXPECT_GT(metric(metrics->body, "rocmforge_prefix_cache_hits_total").value_or(0), 0.0);
  EXPECT_NE(metrics->body.find("rocmforge_http_requests_total{route=\"/generate\",status=\"200\"} 4"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("rocmforge_http_requests_total{route=\"/status/{id}\",status=\"404\"} 1"),
            std::string::npos);
  // One log line per request: method, path, status, milliseconds. (Each is counted in the metrics as it is logged,
  // once its answer is out: so the counts checked are of requests well before the scrape.)
  EXPECT_NE(server.log().find("POST /generate 200 "), std::string::npos) << server.log();
}

TEST_F(ServerTest, ApiKeyIsRequiredOnEveryRouteButHealth) {
  ServerProcess server(serve_args(kStories), "s3cret");
  httplib::Client client = server.client();
  const httplib::Headers right = {{"Authorization", "Bearer s3cret"}};
  const httplib::Headers wrong = {{"Authorization", "Bearer guess"}};
  const json request = {{"prompt", "Once upon a time"}, {"max_tokens", 4}};
  for (const httplib::Headers& headers : {httplib::Headers{}, wrong}) {
    for (const JsonResponse& response : {get(client, "/v1/models", headers), get(client, "/metrics", headers),
                                         post(client, "/v1/completions", request, headers),
                                         post(client, "/tokenize", json{{"prompt", "a"}}, headers)}) {
      EXPECT_EQ(response.status, 401);
      EXPECT_EQ(response.body["error"]["type"], "authentication_error");
      EXPECT_EQ(response.body["error"]["code"], "invalid_api_key");
      EXPECT_TRUE(response.body["error"]["message"].is_string());
    }
  }
  EXPECT_EQ(get(client, "/health").status, 200);
  EXPECT_EQ(get(client, "/v1/models", right).status, 200);
  EXPECT_EQ(post(client, "/v1/completions", request, right).status, 200);
  // The refused requests cost no engine work: only the one with the key was tokenized and run.
  const std::string metrics = client.Get("/metrics", right)->body;
  EXPECT_EQ(metric(metrics, "rocmforge_prompt_tokens_total"), 5.0);
  EXPECT_NE(metrics.find("rocmforge_http_requests_total{route=\"/v1/completions\",status=\"401\"} 2"),
            std::string::npos)
      << metrics;

  // --api-key on the command line does the same.
  ServerProcess flagged(serve_args(kStories, {"--api-key", "other"}));
  httplib::Client flagged_client = flagged.client();
  EXPECT_EQ(get(flagged_client, "/v1/models").status, 401);
  EXPECT_EQ(get(flagged_client, "/v1/models", {{"Authorization", "Bearer other"}}).status, 200);
}

TEST_F(ServerTest, CommandLineIsChecked) {
  const std::string serve = fmt::format("serve -m '{}' --device cpu ", model_path(kStories));
  expect_error(serve + "--port 70000", "--port");
  expect_error(serve + "--max-seqs 0", "--max-seqs");
  expect_error(serve + "--max-waiting -1", "--max-waiting");
  expect_error(serve + "--ctx nan", "--ctx");
  expect_error(serve + "--threads 100000", "--threads");
  expect_error(serve + "--chat-template no-such-template", "no-such-template");
  // A port another server listens on is an error, not a second server sharing it (which would never return: the
  // timeout ends it).
  ServerProcess running(serve_args(kStories));
  const std::string err = path("taken.err");
  const int status =
      std::system(fmt::format("timeout 60 '{}' {}--port {} 2>'{}'", cli_path(), serve, running.port(), err).c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_NE(read_text(err).find(fmt::format("error: cannot listen on 127.0.0.1:{}", running.port())), std::string::npos)
      << read_text(err);
}

TEST_F(ServerTest, SigtermLetsRunningRequestsFinishThenExitsZero) {
  ServerProcess server(serve_args(kStories));
  httplib::Client client = server.client();
  std::atomic<bool> streaming = false;
  Stream stream;
  std::thread reader([&] {
    httplib::Client own = server.client();
    stream =
        post_stream(own, "/v1/completions",
                    json{{"prompt", "Once upon a time"}, {"max_tokens", 1800}, {"ignore_eos", true}, {"stream", true}},
                    [&](const std::string&) {
                      streaming = true;
                      return true;
                    });
  });
  while (!streaming) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server.signal(SIGTERM);
  // While the stream runs: /health says the server is stopping, and new requests are refused.
  bool stopping = false;
  for (int i = 0; i < 1000 && !stopping; ++i) {
    stopping = get(client, "/health").status == 503;
    if (!stopping) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(stopping);
  const JsonResponse refused = post(client, "/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 2}});
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.body["error"]["code"], "shutting_down");
  reader.join();

  // The running stream was finished (or, past the grace period, cancelled) and ended properly.
  const std::vector<json> chunks = openai_chunks(stream);
  ASSERT_FALSE(chunks.empty());
  const json& finish = chunks.back()["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "length" || finish == "abort") << finish;
  // An idle kept-alive connection would hold the exit back for cpp-httplib's keep-alive timeout (5 s).
  client.stop();
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(30)), 0) << server.log();

  ServerProcess idle(serve_args(kStories));
  idle.signal(SIGINT);
  EXPECT_EQ(idle.wait_exit(std::chrono::seconds(30)), 0) << idle.log();
}

}  // namespace
}  // namespace rf::test
