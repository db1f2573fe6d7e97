// The state of one request's generation, apart from the model: its sampler (with its own seed, logit bias and
// penalties over the prompt and what it generated), its streaming detokenizer and stop strings, its limits, and
// why it finished. Whoever runs the forward pass hands it the logits of its newest position, one step at a time:
// Engine::generate for one sequence, a scheduler for many in one batch. Each step chooses a token and says what
// text may be streamed now, its log-probabilities where asked for, and whether the sequence has finished.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/stop_strings.h"
#include "sampling/logprobs.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace rf::engine {

// What a request asks of its generation.
struct GenerationParams {
  int64_t max_tokens = 128;  // tokens to generate at most; < 0: until the context is full
  bool ignore_eos = false;   // keep going past the model's end-of-generation tokens
  sampling::SamplingParams sampling;
  // The text ends before the first of these to appear, and the sequence finishes there (StopStrings).
  std::vector<std::string> stop_strings;
  // None: no log-probabilities; 0..sampling::kMaxTopLogprobs: the chosen token's and that many most likely tokens'
  // (sampling::token_logprobs, under the raw logits).
  std::optional<int32_t> top_logprobs;
};

enum class FinishReason {
  EndOfGeneration,  // the model produced an end-of-generation token (not part of the output)
  StopString,       // a stop string appeared in the text (Sequence::stop_string() says which)
  Length,           // max_tokens were generated
  ContextFull,      // no position is left to evaluate the last token chosen
  Cancelled,        // Sequence::cancel()
  Deadline,         // the request's deadline passed (Sequence::cancel(FinishReason::Deadline))
};

// What one step of a sequence did.
struct Step {
  int32_t token = kNoToken;  // the token chosen; not part of the output when finish is EndOfGeneration
  // The text that may be emitted now: whole UTF-8 characters, never any part of a stop string. Text that may be
  // the start of a stop string, or of a character, is held back until later tokens decide; the finishing step
  // brings what is held back, unless a stop string ended the text.
  std::string text;
  std::optional<sampling::Logprobs> logprobs;  // the token's, where asked for and the token is part of the output
  std::optional<FinishReason> finish;          // on the step that finished the sequence
};

class Sequence {
 public:
  // Checks the parameters (logit bias against the tokenizer's vocabulary, stop strings, top_logprobs, sampling;
  // each an rf::Error naming what is wrong) and gives the prompt to the penalties as history. A sequence with
  // max_tokens 0 has finished (Length) before any step.
  Sequence(std::span<const int32_t> prompt, const GenerationParams& params, const Tokenizer& tokenizer);

  // Chooses the next token from `logits` (one per vocabulary entry: those of the newest position, the prompt's
  // last token or the token chosen before) and takes it (step(token, context_full)), with its log-probabilities
  // where asked for.
  Step step(std::span<const float> logits, bool context_full);
  // Takes `token` as the next one, chosen from the logits of the newest position by whoever holds them (the index of
  // their largest where steps_from_argmax()): the sampler's penalties see it, and the sequence finishes where it
  // ends it. No log-probabilities: those come with the logits. `context_full`: no position is left to evaluate this
  // token, so it is the last one. Calling it after the sequence has finished is an rf::Error.
  Step step(int32_t token, bool context_full);
  // Whether the index of the largest logit of the newest position is all that a step needs: the sampler chooses the
  // largest logit (sampling::chooses_largest_logit) and no log-probabilities are asked for.
  bool steps_from_argmax() const;
  // Finishes the sequence between steps (Cancelled or Deadline); returns a step without a token that brings the text
  // held back. Changes nothing, and returns an empty step, when the sequence has finished already.
  Step cancel(FinishReason reason = FinishReason::Cancelled);

  bool finished() const { return finish_.has_value(); }
  std::optional<FinishReason> finish_reason() const { return finish_; }
  // The index in GenerationParams::stop_strings of the stop string that ended the text, if one did.
  std::optional<size_t> stop_string() const { return stop_strings_.matched(); }
  // The tokens generated so far, without an end-of-generation token that finished the sequence.
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  // Ends the sequence for `reason` unless a stop string did: appends to `step` what the detokenizer and the
  // stop strings held back.
  void finish(Step& step, FinishReason reason);

  const Tokenizer& tokenizer_;
  int64_t max_tokens_;
  bool ignore_eos_;
  std::optional<int32_t> top_logprobs_;
  sampling::Sampler sampler_;
  Detokenizer detokenizer_;
  StopStrings stop_strings_;
  std::vector<int32_t> tokens_;
  std::optional<FinishReason> finish_;
};

}  // namespace rf::engine
