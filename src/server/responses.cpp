#include "server/responses.h"

#include <cmath>

namespace rf::server {
namespace {

using engine::FinishReason;
using nlohmann::json;

// OpenAI's stand-in for the log-probability of an impossible token (JSON has no infinities).
constexpr double kLowestLogprob = -9999.0;

double finite_logprob(double logprob) { return std::isfinite(logprob) ? logprob : kLowestLogprob; }

// A token as logprobs show it: its text, control tokens by name.
std::string piece(const Tokenizer& tokenizer, int32_t id) { return tokenizer.token_to_piece(id, true); }

json byte_values(const std::string& text) {
  json bytes = json::array();
  for (const char byte : text) bytes.push_back(static_cast<uint8_t>(byte));
  return bytes;
}

// Completions' logprobs (the legacy shape): token texts, their log-probabilities, the top ones as objects from text
// to log-probability, and each token's offset in the text from `text_offset` on (advanced past them).
json completion_logprobs(const Tokenizer& tokenizer, std::span<const sampling::Logprobs> entries, size_t& text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  for (const sampling::Logprobs& entry : entries) {
    const std::string text = piece(tokenizer, entry.chosen.id);
    tokens.push_back(text);
    token_logprobs.push_back(finite_logprob(entry.chosen.logprob));
    json top = json::object();
    for (const sampling::TokenLogprob& candidate : entry.top)
      top[piece(tokenizer, candidate.id)] = finite_logprob(candidate.logprob);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += text.size();
  }
  return {
      {"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", offsets}};
}

json chat_token_logprob(const Tokenizer& tokenizer, const sampling::TokenLogprob& token) {
  const std::string text = piece(tokenizer, token.id);
  return {{"token", text}, {"logprob", finite_logprob(token.logprob)}, {"bytes", byte_values(text)}};
}

// Chat's logprobs: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
json chat_logprobs(const Tokenizer& tokenizer, std::span<const sampling::Logprobs> entries) {
  json content = json::array();
  for (const sampling::Logprobs& entry : entries) {
    json token = chat_token_logprob(tokenizer, entry.chosen);
    token["top_logprobs"] = json::array();
    for (const sampling::TokenLogprob& candidate : entry.top)
      token["top_logprobs"].push_back(chat_token_logprob(tokenizer, candidate));
    content.push_back(std::move(token));
  }
  return {{"content", content}};
}

// The native shape: token ids and log-probabilities under the engine's names.
json native_logprobs(const sampling::Logprobs& entry) {
  json top = json::array();
  for (const sampling::TokenLogprob& candidate : entry.top)
    top.push_back({{"id", candidate.id}, {"logprob", finite_logprob(candidate.logprob)}});
  return {{"id", entry.chosen.id}, {"logprob", finite_logprob(entry.chosen.logprob)}, {"top", top}};
}

}  // namespace

std::string_view openai_finish_reason(FinishReason reason) {
  switch (reason) {
    case FinishReason::EndOfGeneration:
    case FinishReason::StopString:
      return "stop";
    case FinishReason::Length:
    case FinishReason::ContextFull:
      return "length";
    case FinishReason::Cancelled:
    case FinishReason::Deadline:
      break;
  }
  return "abort";
}

std::string_view finish_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::EndOfGeneration:
      return "end_of_generation";
    case FinishReason::StopString:
      return "stop_string";
    case FinishReason::Length:
      return "length";
    case FinishReason::ContextFull:
      return "context_full";
    case FinishReason::Cancelled:
      return "cancelled";
    case FinishReason::Deadline:
      break;
  }
  return "deadline";
}

json usage_json(const ResponseContext& context, const std::vector<engine::Generation>& generations) {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (size_t i = 0; i < context.prompt_tokens.size(); ++i) {
    prompt += context.prompt_tokens[i];
    // Every choice of a prompt shares its cached prefix: the first choice's count is the prompt's.
    cached += generations[i * static_cast<size_t>(context.choices_per_prompt)].reused_tokens;
  }
  for (const engine::Generation& generation : generations) completion += static_cast<int64_t>(generation.tokens.size());
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json openai_response(const ResponseContext& context, const std::vector<engine::Generation>& generations) {
  const bool chat = context.api == Api::Chat;
  json choices = json::array();
  for (size_t i = 0; i < generations.size(); ++i) {
    const engine::Generation& generation = generations[i];
    json choice = {{"index", i}, {"finish_reason", openai_finish_reason(generation.finish)}};
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", generation.text}};
    else
      choice["text"] = generation.text;
    size_t text_offset = 0;
    if (!context.logprobs)
      choice["logprobs"] = nullptr;
    else if (chat)
      choice["logprobs"] = chat_logprobs(*context.tokenizer, generation.logprobs);
    else
      choice["logprobs"] = completion_logprobs(*context.tokenizer, generation.logprobs, text_offset);
    choices.push_back(std::move(choice));
  }
  return {{"id", context.id},           {"object", chat ? "chat.completion" : "text_completion"},
          {"created", context.created}, {"model", context.model},
          {"choices", choices},         {"usage", usage_json(context, generations)}};
}

OpenAiStream::OpenAiStream(const ResponseContext& context, bool include_usage)
    : context_(context), include_usage_(include_usage) {
  const size_t choices = context.prompt_tokens.size() * static_cast<size_t>(context.choices_per_prompt);
  started_.assign(choices, false);
  text_offset_.assign(choices, 0);
}

json OpenAiStream::chunk(json choice) const {
  const bool chat = context_.api == Api::Chat;
  json chunk = {{"id", context_.id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", context_.created},
                {"model", context_.model},
                {"choices", json::array({std::move(choice)})}};
  // With include_usage every chunk has a usage field, null until the last (OpenAI's shape).
  if (include_usage_) chunk["usage"] = nullptr;
  return chunk;
}

std::vector<json> OpenAiStream::chunks(const Job::Event& event) {
  const bool chat = context_.api == Api::Chat;
  const auto index = static_cast<size_t>(event.choice);
  const engine::Step& step = event.step;
  std::vector<json> chunks;
  if (chat && !started_[index])
    chunks.push_back(chunk({{"index", index},
                            {"delta", {{"role", "assistant"}, {"content", ""}}},
                            {"logprobs", nullptr},
                            {"finish_reason", nullptr}}));
  started_[index] = true;
  if (!step.text.empty() || step.logprobs) {
    json logprobs = nullptr;
    if (step.logprobs) {
      const std::span<const sampling::Logprobs> entries(&*step.logprobs, 1);
      logprobs = chat ? chat_logprobs(*context_.tokenizer, entries)
                      : completion_logprobs(*context_.tokenizer, entries, text_offset_[index]);
    }
    json choice = {{"index", index}, {"logprobs", logprobs}, {"finish_reason", nullptr}};
    if (chat)
      choice["delta"] = {{"content", step.text}};
    else
      choice["text"] = step.text;
    chunks.push_back(chunk(std::move(choice)));
  }
  if (step.finish) {
    json choice = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", openai_finish_reason(*step.finish)}};
    if (chat)
      choice["delta"] = json::object();
    else
      choice["text"] = "";
    chunks.push_back(chunk(std::move(choice)));
  }
  return chunks;
}

json OpenAiStream::usage_chunk(const std::vector<engine::Generation>& generations) const {
  return {{"id", context_.id},
          {"object", context_.api == Api::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", context_.created},
          {"model", context_.model},
          {"choices", json::array()},
          {"usage", usage_json(context_, generations)}};
}

json generate_response(const ResponseContext& context, const std::vector<engine::Generation>& generations) {
  json choices = json::array();
  for (size_t i = 0; i < generations.size(); ++i) {
    const engine::Generation& generation = generations[i];
    json choice = {{"index", i},
                   {"text", generation.text},
                   {"tokens", generation.tokens},
                   {"finish_reason", finish_name(generation.finish)},
                   {"stop_string", generation.stop_string ? json(*generation.stop_string) : json(nullptr)},
                   {"timings",
                    {{"prompt_ms", generation.prompt_seconds * 1e3},
                     {"decode_ms", generation.decode_seconds * 1e3},
                     {"decoded_tokens", generation.decoded_tokens},
                     {"prompt_tokens_per_second", generation.prompt_tokens_per_second()},
                     {"decode_tokens_per_second", generation.decode_tokens_per_second()}}}};
    if (context.logprobs) {
      choice["logprobs"] = json::array();
      for (const sampling::Logprobs& entry : generation.logprobs) choice["logprobs"].push_back(native_logprobs(entry));
    }
    choices.push_back(std::move(choice));
  }
  const json usage = usage_json(context, generations);
  return {{"id", context.id},
          {"model", context.model},
          {"choices", choices},
          {"usage",
           {{"prompt_tokens", usage["prompt_tokens"]},
            {"reused_tokens", usage["prompt_tokens_details"]["cached_tokens"]},
            {"completion_tokens", usage["completion_tokens"]}}}};
}

json generate_event(const ResponseContext& context, const Job::Event& event) {
  const engine::Step& step = event.step;
  // The token that ended the generation (end of generation) or none (cancelled) is not part of the output.
  const bool output = step.token != kNoToken && step.finish != FinishReason::EndOfGeneration;
  json out = {{"index", event.choice},
              {"token", output ? json(step.token) : json(nullptr)},
              {"text", step.text},
              {"finish_reason", step.finish ? json(finish_name(*step.finish)) : json(nullptr)}};
  if (context.logprobs) out["logprobs"] = step.logprobs ? native_logprobs(*step.logprobs) : json(nullptr);
  return out;
}

}  // namespace rf::server
