// What the server answers, in the shapes clients expect: OpenAI's completion and chat completion objects and the
// chunks of their streams (https://platform.openai.com/docs/api-reference), and the native API's objects with the
// engine's own names. Only shapes live here; the server decides when each is sent.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/generation_request.h"
#include "server/job.h"

namespace rf::server {

// OpenAI's finish_reason: "stop" for an end-of-generation token or a stop string, "length" for max_tokens or a full
// context, and "abort" (vLLM's word) for a request cancelled or past its deadline.
std::string_view openai_finish_reason(engine::FinishReason reason);
// The engine's name: "end_of_generation", "stop_string", "length", "context_full", "cancelled", "deadline".
std::string_view finish_name(engine::FinishReason reason);

// What every response to one request shares.
struct ResponseContext {
  std::string id;
  int64_t created = 0;  // Unix seconds
  std::string model;
  Api api = Api::Generate;
  int32_t choices_per_prompt = 1;
  std::vector<int64_t> prompt_tokens;  // per prompt
  bool logprobs = false;
  const Tokenizer* tokenizer = nullptr;
};

// OpenAI's usage: prompt tokens (each prompt once, whatever its choices), completion tokens, their total, and the
// prompt tokens taken from the prefix cache.
nlohmann::json usage_json(const ResponseContext& context, const std::vector<engine::Generation>& generations);

// The text_completion or chat.completion object of a finished request.
nlohmann::json openai_response(const ResponseContext& context, const std::vector<engine::Generation>& generations);

// The chunks of an OpenAI stream, made from the steps as they arrive: per choice (chat) a first chunk with the
// assistant's role, then one per step that brings text or log-probabilities, then one with the finish reason.
class OpenAiStream {
 public:
  OpenAiStream(const ResponseContext& context, bool include_usage);
  std::vector<nlohmann::json> chunks(const Job::Event& event);
  // The last chunk when include_usage asked for it: no choices, the usage.
  nlohmann::json usage_chunk(const std::vector<engine::Generation>& generations) const;

 private:
  nlohmann::json chunk(nlohmann::json choice) const;

  const ResponseContext& context_;
  bool include_usage_;
  std::vector<bool> started_;        // per choice: whether its first chunk went out
  std::vector<size_t> text_offset_;  // per choice: bytes of text its chunks' tokens have covered
};

// POST /generate's answer: per choice the text, the token ids, the finish reason and timings.
nlohmann::json generate_response(const ResponseContext& context, const std::vector<engine::Generation>& generations);
// One event of POST /generate/stream: a step of one choice.
nlohmann::json generate_event(const ResponseContext& context, const Job::Event& event);

}  // namespace rf::server
