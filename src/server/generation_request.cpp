#include "server/generation_request.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <limits>
#include <optional>
#include <random>
#include <type_traits>

#include "sampling/logprobs.h"
#include "server/api_error.h"
#include "server/fields.h"
#include "util/error.h"

namespace rf::server {
namespace {

using nlohmann::json;
using sampling::SamplingParams;

constexpr int64_t kMaxDeadlineMs = 24 * 3600 * 1000;

void check_model(const Fields& fields, const ServedModel& model) {
  const std::optional<std::string> name = fields.string("model");
  if (!name || std::ranges::find(model.names, *name) != model.names.end()) return;
  throw ApiError(404, "invalid_request_error",
                 fmt::format("the model '{:.80}' does not exist: this server serves '{}'", *name, model.id), "model",
                 "model_not_found");
}

// OpenAI's features that change what comes back and that this server does not have: refused rather than ignored.
void refuse(const Fields& fields, std::string_view field, bool asked) {
  if (asked) invalid_field(fields.param(field), "{} is not supported by this server", fields.param(field));
}

// One sampling parameter, checked by the sampler's own rule (sampling::check_params) with the others at their
// defaults, so that the error names this field.
template <typename T>
void read_sampling_field(const Fields& fields, std::string_view name, T SamplingParams::*field,
                         SamplingParams& sampling) {
  std::optional<T> value;
  if constexpr (std::is_integral_v<T>) {
    if (const auto given = fields.integer(name, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()))
      value = static_cast<T>(*given);
  } else if (const auto given = fields.number(name)) {
    value = static_cast<T>(*given);
  }
  if (!value) return;
  SamplingParams alone;
  alone.*field = *value;
  try {
    sampling::check_params(alone);
  } catch (const Error& e) {
    invalid_field(fields.param(name), "{}: {}", fields.param(name), e.what());
  }
  sampling.*field = *value;
}

// Any unsigned 64-bit integer; absent, or -1 as llama.cpp's server takes it: a random seed.
uint64_t read_seed(const Fields& fields) {
  const json* value = fields.find("seed");
  if (value && value->is_number_unsigned()) return value->get<uint64_t>();
  if (value && !(value->is_number_integer() && value->get<int64_t>() == -1))
    invalid_field(fields.param("seed"), "{} must be an integer in [0, {}], or -1 for a random one",
                  fields.param("seed"), std::numeric_limits<uint64_t>::max());
  std::random_device random;
  return (static_cast<uint64_t>(random()) << 32) ^ random();
}

// OpenAI's logit_bias: an object from token ids, written as strings (JSON keys are strings), to biases.
void read_logit_bias(const Fields& fields, SamplingParams& sampling, const Tokenizer& tokenizer) {
  const json* value = fields.find("logit_bias");
  if (!value) return;
  const std::string param = fields.param("logit_bias");
  if (!value->is_object()) invalid_field(param, "{} must be an object from token ids (as strings) to biases", param);
  for (const auto& [key, bias] : value->items()) {
    int32_t id = 0;
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (error != std::errc{} || end != key.data() + key.size())
      invalid_field(param, "{} key '{:.20}' is not a token id", param, key);
    if (!bias.is_number()) invalid_field(param, "{} of token {} must be a number, not {}", param, id, bias.type_name());
    sampling.logit_bias[id] = bias.get<float>();
  }
  try {
    sampling::check_logit_bias(sampling.logit_bias, static_cast<size_t>(tokenizer.n_vocab()));
  } catch (const Error& e) {
    invalid_field(param, "{}: {}", param, e.what());
  }
}

// The sampling fields every API shares; `sampling` holds the API's defaults.
void read_sampling(const Fields& fields, SamplingParams& sampling, const Tokenizer& tokenizer) {
  read_sampling_field(fields, "temperature", &SamplingParams::temperature, sampling);
  read_sampling_field(fields, "top_k", &SamplingParams::top_k, sampling);
  read_sampling_field(fields, "top_p", &SamplingParams::top_p, sampling);
  read_sampling_field(fields, "min_p", &SamplingParams::min_p, sampling);
  read_sampling_field(fields, "frequency_penalty", &SamplingParams::frequency_penalty, sampling);
  read_sampling_field(fields, "presence_penalty", &SamplingParams::presence_penalty, sampling);
  // vLLM's name, then llama.cpp's and the engine's.
  read_sampling_field(fields, "repetition_penalty", &SamplingParams::repeat_penalty, sampling);
  read_sampling_field(fields, "repeat_penalty", &SamplingParams::repeat_penalty, sampling);
  read_sampling_field(fields, "penalty_last_n", &SamplingParams::penalty_last_n, sampling);
  sampling.seed = read_seed(fields);
  read_logit_bias(fields, sampling, tokenizer);
}

// Stop strings: a list of non-empty strings, or (`one_allowed`, as OpenAI's stop) a single string.
std::vector<std::string> read_stop_strings(const Fields& fields, std::string_view field, bool one_allowed) {
  const json* value = fields.find(field);
  if (!value) return {};
  const std::string param = fields.param(field);
  std::vector<std::string> stops;
  if (value->is_string() && one_allowed) {
    stops.push_back(value->get<std::string>());
  } else if (value->is_array()) {
    for (const json& stop : *value) {
      if (!stop.is_string()) invalid_field(param, "{} must hold strings, not {}", param, stop.type_name());
      stops.push_back(stop.get<std::string>());
    }
  } else {
    invalid_field(param, "{} must be {}a list of strings, not {}", param, one_allowed ? "a string or " : "",
                  value->type_name());
  }
  if (std::ranges::any_of(stops, [](const std::string& stop) { return stop.empty(); }))
    invalid_field(param, "{} holds an empty string, which would stop before any text", param);
  return stops;
}

int32_t read_choices(const Fields& fields, std::string_view field, const ServedModel& model) {
  return static_cast<int32_t>(fields.integer(field, 1, std::min(kMaxChoices, model.max_sequences)).value_or(1));
}

void read_stream(const Fields& fields, GenerationRequest& request) {
  request.stream = fields.boolean("stream").value_or(false);
  if (const json* options = fields.find("stream_options"))
    request.include_usage = Fields(*options, "stream_options").boolean("include_usage").value_or(false);
}

// OpenAI's prompt: a string, a list of strings, a list of token ids, or a list of such lists; each is one prompt.
// Text is tokenized as llama.cpp's and vLLM's servers do: with BOS, control tokens written in it recognized.
std::vector<std::vector<int32_t>> read_prompts(const Fields& fields, const Tokenizer& tokenizer) {
  const json* value = fields.find("prompt");
  if (!value) invalid_field("prompt", "prompt is required");
  if (value->is_string()) return {tokenizer.encode(value->get<std::string>(), true, true)};
  if (!value->is_array() || value->empty())
    invalid_field("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of such lists");
  if (value->front().is_number()) return {read_token_ids(*value, "prompt", tokenizer)};
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < value->size(); ++i) {
    const json& prompt = (*value)[i];
    const std::string param = fmt::format("prompt[{}]", i);
    if (prompt.is_string())
      prompts.push_back(tokenizer.encode(prompt.get<std::string>(), true, true));
    else if (prompt.is_array())
      prompts.push_back(read_token_ids(prompt, param, tokenizer));
    else
      invalid_field(param, "{} must be a string or a list of token ids, not {}", param, prompt.type_name());
  }
  return prompts;
}

std::string read_content(const Fields& message) {
  const std::string param = message.param("content");
  const json* content = message.find("content");
  if (!content) invalid_field(param, "{} is required", param);
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array())
    invalid_field(param, "{} must be a string or a list of text parts, not {}", param, content->type_name());
  // Text parts joined by line breaks, as vLLM joins them.
  std::string text;
  for (size_t i = 0; i < content->size(); ++i) {
    const Fields part((*content)[i], fmt::format("{}[{}]", param, i));
    if (part.string("type") != "text")
      invalid_field(part.param("type"), "{} must be \"text\": this server reads text parts only", part.param("type"));
    const std::optional<std::string> part_text = part.string("text");
    if (!part_text) invalid_field(part.param("text"), "{} is required", part.param("text"));
    if (i > 0) text += '\n';
    text += *part_text;
  }
  return text;
}

std::vector<ChatMessage> read_messages(const Fields& fields) {
  const json* value = fields.find("messages");
  if (!value) invalid_field("messages", "messages is required");
  if (!value->is_array()) invalid_field("messages", "messages must be a list of messages, not {}", value->type_name());
  if (value->empty()) invalid_field("messages", "messages must hold at least one message");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < value->size(); ++i) {
    const Fields message((*value)[i], fmt::format("messages[{}]", i));
    std::optional<std::string> role = message.string("role");
    if (!role) invalid_field(message.param("role"), "{} is required", message.param("role"));
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (role != "system" && role != "user" && role != "assistant")
      invalid_field(message.param("role"), "{} must be system, user or assistant, not '{:.20}'", message.param("role"),
                    *role);
    messages.push_back({*role, read_content(message)});
  }
  return messages;
}

ChatTemplate read_chat_template(const Fields& fields, const ServedModel& model) {
  const std::optional<std::string> name = fields.string("chat_template");
  if (!name) return model.chat_template;
  try {
    return chat_template_from_name(*name);
  } catch (const Error& e) {
    invalid_field("chat_template", "{}", e.what());
  }
}

// Checks each prompt and an explicit token limit (`max_tokens_field`, else none was given) against the context of
// one sequence, and the sequences the request asks for against the most a request may; then builds the request.
GenerationRequest build(Api api, std::vector<std::vector<int32_t>> prompts, std::string_view prompt_field,
                        const engine::GenerationParams& params, std::optional<std::string_view> max_tokens_field,
                        int32_t choices, const ServedModel& model) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto tokens = static_cast<int64_t>(prompts[i].size());
    const std::string which = prompts.size() > 1 ? fmt::format(" {}", i) : "";
    // Text without BOS (a model that adds none, or add_special false) may tokenize to nothing.
    if (tokens == 0) invalid_field(prompt_field, "the prompt{} has no tokens", which);
    if (tokens > model.sequence_context)
      throw ApiError(
          400, "invalid_request_error",
          fmt::format("the prompt{} has {} tokens, more than the context of {}", which, tokens, model.sequence_context),
          std::string(prompt_field), "context_length_exceeded");
    if (max_tokens_field && tokens + params.max_tokens > model.sequence_context)
      throw ApiError(400, "invalid_request_error",
                     fmt::format("{} of {} does not fit: the prompt has {} tokens and the context holds {}",
                                 *max_tokens_field, params.max_tokens, tokens, model.sequence_context),
                     std::string(*max_tokens_field), "context_length_exceeded");
  }
  const auto sequences = static_cast<int64_t>(prompts.size()) * choices;
  if (sequences > model.max_sequences)
    invalid_field(prompt_field,
                  "{} prompts of {} choices each are {} sequences, more than the {} a request may ask for",
                  prompts.size(), choices, sequences, model.max_sequences);
  GenerationRequest request;
  request.api = api;
  request.choices = choices;
  for (std::vector<int32_t>& prompt : prompts) {
    engine::Request& scheduled = request.requests.emplace_back();
    scheduled.prompt = std::move(prompt);
    scheduled.params = params;
    scheduled.choices = choices;
  }
  return request;
}

// OpenAI's defaults: temperature 1, nothing cut off by top-k, top-p or min-p.
engine::GenerationParams openai_params(const Fields& fields, const ServedModel& model) {
  engine::GenerationParams params;
  params.sampling.temperature = 1.0f;
  params.sampling.top_k = 0;
  params.sampling.top_p = 1.0f;
  params.sampling.min_p = 0.0f;
  read_sampling(fields, params.sampling, *model.tokenizer);
  params.ignore_eos = fields.boolean("ignore_eos").value_or(false);
  return params;
}

// OpenAI's max_tokens (or, for chat, max_completion_tokens, its newer name): at least 1. Returns the field given.
std::optional<std::string_view> read_max_tokens(const Fields& fields, std::initializer_list<std::string_view> names,
                                                engine::GenerationParams& params) {
  for (const std::string_view name : names) {
    if (const auto max_tokens = fields.integer(name, 1, std::numeric_limits<int64_t>::max() / 2)) {
      params.max_tokens = *max_tokens;
      return name;
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<int32_t> read_token_ids(const json& value, const std::string& param, const Tokenizer& tokenizer) {
  if (!value.is_array() || value.empty()) invalid_field(param, "{} must be a non-empty list of token ids", param);
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (const json& id : value) {
    int64_t token = 0;
    if (!integer_within(id, 0, tokenizer.n_vocab() - 1, token))
      invalid_field(param, "{} must hold token ids in [0, {}], not {}", param, tokenizer.n_vocab() - 1,
                    id.is_number() ? json_text(id) : id.type_name());
    ids.push_back(static_cast<int32_t>(token));
  }
  return ids;
}

GenerationRequest read_completion_request(const json& body, const ServedModel& model) {
  const Fields fields(body);
  check_model(fields, model);
  refuse(fields, "echo", fields.boolean("echo").value_or(false));
  refuse(fields, "suffix", !fields.string("suffix").value_or("").empty());
  refuse(fields, "best_of", fields.integer("best_of", 0, kMaxChoices).value_or(1) > 1);
  engine::GenerationParams params = openai_params(fields, model);
  params.max_tokens = 16;  // OpenAI's default for completions
  const std::optional<std::string_view> max_tokens_field = read_max_tokens(fields, {"max_tokens"}, params);
  params.stop_strings = read_stop_strings(fields, "stop", true);
  // Completions' logprobs is the number of top tokens.
  if (const auto logprobs = fields.integer("logprobs", 0, sampling::kMaxTopLogprobs))
    params.top_logprobs = static_cast<int32_t>(*logprobs);
  const int32_t choices = read_choices(fields, "n", model);
  GenerationRequest request = build(Api::Completion, read_prompts(fields, *model.tokenizer), "prompt", params,
                                    max_tokens_field, choices, model);
  read_stream(fields, request);
  return request;
}

GenerationRequest read_chat_request(const json& body, const ServedModel& model) {
  const Fields fields(body);
  check_model(fields, model);
  if (const json* tools = fields.find("tools")) refuse(fields, "tools", !tools->is_array() || !tools->empty());
  if (const json* format = fields.find("response_format"))
    refuse(fields, "response_format", Fields(*format, "response_format").string("type").value_or("text") != "text");
  engine::GenerationParams params = openai_params(fields, model);
  params.max_tokens = -1;  // OpenAI's default for chat: until the reply ends or the context is full
  const std::optional<std::string_view> max_tokens_field =
      read_max_tokens(fields, {"max_completion_tokens", "max_tokens"}, params);
  params.stop_strings = read_stop_strings(fields, "stop", true);
  const std::optional<int64_t> top_logprobs = fields.integer("top_logprobs", 0, sampling::kMaxTopLogprobs);
  const bool logprobs = fields.boolean("logprobs").value_or(false);
  if (top_logprobs && !logprobs) invalid_field("top_logprobs", "top_logprobs needs logprobs: true");
  if (logprobs) params.top_logprobs = static_cast<int32_t>(top_logprobs.value_or(0));
  const int32_t choices = read_choices(fields, "n", model);
  const ChatTemplate chat_template = read_chat_template(fields, model);
  // The rendered conversation is meant to be tokenized with its markers as control tokens (apply_chat_template).
  const std::string text = apply_chat_template(chat_template, read_messages(fields), true);
  GenerationRequest request = build(Api::Chat, {model.tokenizer->encode(text, true, true)}, "messages", params,
                                    max_tokens_field, choices, model);
  read_stream(fields, request);
  return request;
}

GenerationRequest read_generate_request(const json& body, const ServedModel& model, bool stream) {
  const Fields fields(body);
  check_model(fields, model);
  engine::GenerationParams params;
  read_sampling(fields, params.sampling, *model.tokenizer);
  params.ignore_eos = fields.boolean("ignore_eos").value_or(false);
  std::optional<std::string_view> max_tokens_field;
  if (const auto max_tokens = fields.integer("max_tokens", -1, std::numeric_limits<int64_t>::max() / 2)) {
    // A sequence of no tokens would have finished before its first step: nothing to schedule.
    if (*max_tokens == 0)
      invalid_field("max_tokens", "max_tokens must be at least 1, or -1 (until the context is full)");
    params.max_tokens = *max_tokens;
    if (*max_tokens > 0) max_tokens_field = "max_tokens";
  }
  params.stop_strings = read_stop_strings(fields, "stop_strings", false);
  if (const auto top_logprobs = fields.integer("top_logprobs", 0, sampling::kMaxTopLogprobs))
    params.top_logprobs = static_cast<int32_t>(*top_logprobs);

  const json* prompt = fields.find("prompt");
  if (!prompt) invalid_field("prompt", "prompt is required");
  std::vector<int32_t> tokens;
  if (prompt->is_string())
    tokens = model.tokenizer->encode(prompt->get<std::string>(), fields.boolean("add_special").value_or(true),
                                     fields.boolean("parse_special").value_or(true));
  else if (prompt->is_array())
    tokens = read_token_ids(*prompt, "prompt", *model.tokenizer);
  else
    invalid_field("prompt", "prompt must be a string or a list of token ids, not {}", prompt->type_name());

  const int32_t choices = read_choices(fields, "choices", model);
  GenerationRequest request =
      build(Api::Generate, {std::move(tokens)}, "prompt", params, max_tokens_field, choices, model);
  if (const auto deadline_ms = fields.integer("deadline_ms", 1, kMaxDeadlineMs))
    request.requests.front().deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(*deadline_ms);
  request.stream = stream;
  return request;
}

}  // namespace rf::server
