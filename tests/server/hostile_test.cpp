// Requests no client should send, each answered with its 4xx and an OpenAI error object naming the field at fault
// (or none, where the body as a whole is wrong), by one server that then still answers a normal request.
#include <optional>
#include <string>
#include <vector>

#include "server/server_process.h"

namespace rf::test {
namespace {

struct Hostile {
  std::string method;
  std::string path;
  std::string body;
  int status;
  std::optional<std::string> param;  // the field the error names; none: null
};

// A body of `base` with `changes` merged in (RFC 7386: a null removes the field).
std::string with(json base, const json& changes) {
  base.merge_patch(changes);
  return base.dump();
}

std::string completion(const json& changes) {
  return with({{"prompt", "Once upon a time"}, {"max_tokens", 4}}, changes);
}

std::string chat(const json& changes) {
  return with({{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4}}, changes);
}

std::string generate(const json& changes) { return with({{"prompt", "Once upon a time"}, {"max_tokens", 4}}, changes); }

std::vector<Hostile> hostile_requests() {
  const std::string long_text = [] {
    std::string text;
    for (int i = 0; i < 3000; ++i) text += "word ";
    return text;
  }();
  const std::string too_large = R"({"prompt": ")" + std::string(size_t{9} << 20, 'a') + R"("})";
  const auto messages_of = [](const json& message) { return json{{"messages", json::array({message})}}; };
  const auto message = [&](const json& fields) { return chat(messages_of(fields)); };
  return {
      // The body as a whole.
      {"POST", "/v1/completions", R"({"prompt": "a", )", 400, std::nullopt},
      {"POST", "/v1/completions", "[1, 2, 3]", 400, std::nullopt},
      {"POST", "/v1/completions", too_large, 413, std::nullopt},
      {"POST", "/v1/completions", "{\"prompt\": \"\xff\xfe\", \"max_tokens\": 4}", 400, std::nullopt},
      {"POST", "/v1/completions", R"({"prompt": "\ud800", "max_tokens": 4})", 400, std::nullopt},
      {"POST", "/v1/completions", R"({"prompt": "a", "temperature": NaN})", 400, std::nullopt},
      {"POST", "/v1/completions", R"({"prompt": "a", "temperature": 1e999})", 400, std::nullopt},
      // Completions' fields.
      {"POST", "/v1/completions", completion({{"prompt", nullptr}}), 400, "prompt"},
      {"POST", "/v1/completions", completion({{"prompt", 7}}), 400, "prompt"},
      {"POST", "/v1/completions", completion({{"prompt", json::array()}}), 400, "prompt"},
      {"POST", "/v1/completions", completion({{"prompt", {"a", 5}}}), 400, "prompt[1]"},
      {"POST", "/v1/completions", completion({{"prompt", {999999}}}), 400, "prompt"},
      {"POST", "/v1/completions", completion({{"prompt", {1, -1}}}), 400, "prompt"},
      {"POST", "/v1/completions", completion({{"prompt", long_text}}), 400, "prompt"},
      {"POST", "/v1/completions", completion({{"max_tokens", "many"}}), 400, "max_tokens"},
      {"POST", "/v1/completions", completion({{"max_tokens", 0}}), 400, "max_tokens"},
      {"POST", "/v1/completions", completion({{"max_tokens", -5}}), 400, "max_tokens"},
      {"POST", "/v1/completions", completion({{"max_tokens", 1.5}}), 400, "max_tokens"},
      {"POST", "/v1/completions", completion({{"max_tokens", 5000}}), 400, "max_tokens"},
      {"POST", "/v1/completions", completion({{"temperature", -1}}), 400, "temperature"},
      {"POST", "/v1/completions", completion({{"temperature", "hot"}}), 400, "temperature"},
      {"POST", "/v1/completions", completion({{"top_p", 0}}), 400, "top_p"},
      {"POST", "/v1/completions", completion({{"top_p", 1.5}}), 400, "top_p"},
      {"POST", "/v1/completions", completion({{"top_k", -3}}), 400, "top_k"},
      {"POST", "/v1/completions", completion({{"min_p", 2}}), 400, "min_p"},
      {"POST", "/v1/completions", completion({{"frequency_penalty", 3}}), 400, "frequency_penalty"},
      {"POST", "/v1/completions", completion({{"presence_penalty", -3}}), 400, "presence_penalty"},
      {"POST", "/v1/completions", completion({{"repetition_penalty", 0}}), 400, "repetition_penalty"},
      {"POST", "/v1/completions", completion({{"n", 0}}), 400, "n"},
      {"POST", "/v1/completions", completion({{"n", 17}}), 400, "n"},
      {"POST", "/v1/completions", completion({{"n", "2"}}), 400, "n"},
      {"POST", "/v1/completions", completion({{"seed", "x"}}), 400, "seed"},
      {"POST", "/v1/completions", completion({{"logit_bias", {{"999999", 5}}}}), 400, "logit_bias"},
      {"POST", "/v1/completions", completion({{"logit_bias", {{"abc", 1}}}}), 400, "logit_bias"},
      {"POST", "/v1/completions", completion({{"logit_bias", {{"5", 500}}}}), 400, "logit_bias"},
      {"POST", "/v1/completions", completion({{"logit_bias", {1, 2}}}), 400, "logit_bias"},
      {"POST", "/v1/completions", completion({{"logprobs", 21}}), 400, "logprobs"},
      {"POST", "/v1/completions", completion({{"logprobs", -1}}), 400, "logprobs"},
      {"POST", "/v1/completions", completion({{"stop", 5}}), 400, "stop"},
      {"POST", "/v1/completions", completion({{"stop", {""}}}), 400, "stop"},
      {"POST", "/v1/completions", completion({{"stop", {"a", 3}}}), 400, "stop"},
      {"POST", "/v1/completions", completion({{"stream", "yes"}}), 400, "stream"},
      {"POST", "/v1/completions", completion({{"stream_options", "x"}}), 400, "stream_options"},
      {"POST", "/v1/completions", completion({{"stream_options", {{"include_usage", 1}}}}), 400,
       "stream_options.include_usage"},
      {"POST", "/v1/completions", completion({{"model", "gpt-4"}}), 404, "model"},
      {"POST", "/v1/completions", completion({{"echo", true}}), 400, "echo"},
      // Chat's.
      {"POST", "/v1/chat/completions", chat({{"messages", nullptr}}), 400, "messages"},
      {"POST", "/v1/chat/completions", chat({{"messages", json::array()}}), 400, "messages"},
      {"POST", "/v1/chat/completions", chat({{"messages", "hi"}}), 400, "messages"},
      {"POST", "/v1/chat/completions", chat(messages_of("hi")), 400, "messages[0]"},
      {"POST", "/v1/chat/completions", message({{"role", "wizard"}, {"content", "Hi"}}), 400, "messages[0].role"},
      {"POST", "/v1/chat/completions", message({{"content", "Hi"}}), 400, "messages[0].role"},
      {"POST", "/v1/chat/completions", message({{"role", "user"}, {"content", 5}}), 400, "messages[0].content"},
      {"POST", "/v1/chat/completions", message({{"role", "user"}}), 400, "messages[0].content"},
      {"POST", "/v1/chat/completions",
       message({{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}), 400,
       "messages[0].content[0].type"},
      {"POST", "/v1/chat/completions", message({{"role", "user"}, {"content", long_text}}), 400, "messages"},
      {"POST", "/v1/chat/completions", chat({{"chat_template", "no-such-template"}}), 400, "chat_template"},
      {"POST", "/v1/chat/completions", chat({{"logprobs", true}, {"top_logprobs", 21}}), 400, "top_logprobs"},
      {"POST", "/v1/chat/completions", chat({{"top_logprobs", 2}}), 400, "top_logprobs"},
      {"POST", "/v1/chat/completions", chat({{"max_completion_tokens", 0}}), 400, "max_completion_tokens"},
      {"POST", "/v1/chat/completions", chat({{"model", "nope"}}), 404, "model"},
      // The native routes'.
      {"POST", "/generate", generate({{"top_logprobs", 99}}), 400, "top_logprobs"},
      {"POST", "/generate", generate({{"max_tokens", 0}}), 400, "max_tokens"},
      {"POST", "/generate", generate({{"choices", 0}}), 400, "choices"},
      {"POST", "/generate", generate({{"stop_strings", "x"}}), 400, "stop_strings"},
      {"POST", "/generate", generate({{"deadline_ms", 0}}), 400, "deadline_ms"},
      {"POST", "/generate/stream", generate({{"prompt", json::object()}}), 400, "prompt"},
      {"POST", "/detokenize", R"({"tokens": [1, 999999]})", 400, "tokens"},
      {"POST", "/detokenize", "{}", 400, "tokens"},
      {"POST", "/tokenize", "{}", 400, "prompt"},
      {"POST", "/tokenize", R"({"prompt": 3})", 400, "prompt"},
      {"GET", "/status/no-such-id", "", 404, "id"},
      {"POST", "/cancel/no-such-id", "{}", 404, "id"},
      // Methods and paths.
      {"GET", "/v1/completions", "", 405, std::nullopt},
      {"DELETE", "/v1/chat/completions", "", 405, std::nullopt},
      {"PUT", "/v1/models", "{}", 405, std::nullopt},
      {"POST", "/status/x", "{}", 405, std::nullopt},
      {"GET", "/v2/nothing", "", 404, std::nullopt},
      {"POST", "/v1/completions/extra", "{}", 404, std::nullopt},
  };
}

httplib::Result send(httplib::Client& client, const Hostile& request) {
  if (request.method == "GET") return client.Get(request.path.c_str());
  if (request.method == "PUT") return client.Put(request.path.c_str(), request.body, "application/json");
  if (request.method == "DELETE") return client.Delete(request.path.c_str());
  return client.Post(request.path.c_str(), request.body, "application/json");
}

TEST(HostileTest, EachGetsItsErrorAndTheServerGoesOn) {
  ServerProcess server(serve_args(kStories));
  httplib::Client client = server.client();
  const std::vector<Hostile> requests = hostile_requests();
  EXPECT_GE(requests.size(), 40u);
  for (const Hostile& request : requests) {
    SCOPED_TRACE(fmt::format("{} {} {:.200}", request.method, request.path, request.body));
    const httplib::Result result = send(client, request);
    ASSERT_TRUE(result) << httplib::to_string(result.error());
    EXPECT_EQ(result->status, request.status) << result->body;
    const json body = json::parse(result->body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << result->body;
    const json& error = body["error"];
    ASSERT_TRUE(error.is_object()) << result->body;
    EXPECT_TRUE(error["message"].is_string() && !error["message"].get<std::string>().empty());
    EXPECT_TRUE(error["type"].is_string());
    EXPECT_TRUE(error.contains("code"));
    EXPECT_EQ(error["param"], request.param ? json(*request.param) : json(nullptr)) << error["message"];
  }
  const JsonResponse normal = post(client, "/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 4}});
  EXPECT_EQ(normal.status, 200) << normal.body;
  EXPECT_EQ(normal.body["usage"]["completion_tokens"], 4);
  EXPECT_EQ(get(client, "/health").status, 200);
}

}  // namespace
}  // namespace rf::test
