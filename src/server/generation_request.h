// What a generation request asks for, read from its JSON body and checked against the model before anything is
// submitted: OpenAI's completions and chat completions, and the native /generate under the engine's own names.
// Every field is checked here by the rule the engine holds (the sampler's ranges, the vocabulary, the context), so
// that a bad request is a 400 naming its field and the scheduler never sees it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/scheduler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace rf::server {

// The most choices (n) one request may ask for, as vLLM's and llama.cpp's servers cap it.
inline constexpr int32_t kMaxChoices = 16;

// The model a server serves, as requests see it.
struct ServedModel {
  std::string id;                  // the name /v1/models lists
  std::vector<std::string> names;  // the names a request's `model` may give: the id and the file's name
  const Tokenizer* tokenizer = nullptr;
  int64_t sequence_context = 0;  // positions one sequence may reach (Scheduler::sequence_context)
  int32_t max_sequences = 1;     // sequences one request may ask for: every prompt's choices (Scheduler's max)
  ChatTemplate chat_template = ChatTemplate::ChatML;  // for chat requests that name none
};

enum class Api { Completion, Chat, Generate };

struct GenerationRequest {
  Api api = Api::Generate;
  // One per prompt (a completion may give several), each with `choices` choices; on_step is the caller's to set.
  std::vector<engine::Request> requests;
  int32_t choices = 1;
  bool stream = false;
  bool include_usage = false;  // OpenAI's stream_options.include_usage

  int64_t sequences() const { return static_cast<int64_t>(requests.size()) * choices; }
  // Whether the response carries log-probabilities.
  bool logprobs() const { return requests.front().params.top_logprobs.has_value(); }
};

GenerationRequest read_completion_request(const nlohmann::json& body, const ServedModel& model);
GenerationRequest read_chat_request(const nlohmann::json& body, const ServedModel& model);
// `stream`: the route (/generate/stream) asks for server-sent events.
GenerationRequest read_generate_request(const nlohmann::json& body, const ServedModel& model, bool stream);

// A JSON list of token ids of the model's vocabulary, else a 400 naming `param`.
std::vector<int32_t> read_token_ids(const nlohmann::json& value, const std::string& param, const Tokenizer& tokenizer);

}  // namespace rf::server
