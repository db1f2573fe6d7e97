#include "engine/sequence.h"

#include "util/error.h"

namespace rf::engine {

Sequence::Sequence(std::span<const int32_t> prompt, const GenerationParams& params, const Tokenizer& tokenizer)
    : tokenizer_(tokenizer),
      max_tokens_(params.max_tokens),
      ignore_eos_(params.ignore_eos),
      top_logprobs_(params.top_logprobs),
      sampler_(params.sampling),
      detokenizer_(tokenizer),
      stop_strings_(params.stop_strings) {
  // The sampler checks the bias against each row of logits; a request learns of a bad one before it runs.
  sampling::check_logit_bias(params.sampling.logit_bias, static_cast<size_t>(tokenizer.n_vocab()));
  if (top_logprobs_) sampling::check_top_logprobs(*top_logprobs_);
  for (const int32_t token : prompt) sampler_.accept(token);
  if (max_tokens_ == 0) finish_ = FinishReason::Length;
}

Step Sequence::step(std::span<const float> logits, bool context_full) {
  const size_t generated = tokens_.size();
  Step step = this->step(sampler_.sample(logits), context_full);
  // Log-probabilities are those of a token of the output, which an end-of-generation token is not.
  if (top_logprobs_ && tokens_.size() > generated)
    step.logprobs = sampling::token_logprobs(logits, step.token, *top_logprobs_);
  return step;
}

Step Sequence::step(int32_t token, bool context_full) {
  if (finished()) fail("the sequence has finished: it takes no more steps");
  Step step;
  step.token = token;
  sampler_.accept(step.token);
  if (!ignore_eos_ && tokenizer_.is_end_of_generation(step.token)) {
    finish(step, FinishReason::EndOfGeneration);
    return step;
  }
  tokens_.push_back(step.token);
  step.text = stop_strings_.push(detokenizer_.push(step.token));
  if (stop_strings_.matched())
    finish(step, FinishReason::StopString);
  else if (max_tokens_ >= 0 && static_cast<int64_t>(tokens_.size()) >= max_tokens_)
    finish(step, FinishReason::Length);
  else if (context_full)
    finish(step, FinishReason::ContextFull);
  return step;
}

bool Sequence::steps_from_argmax() const {
  return sampling::chooses_largest_logit(sampler_.params()) && !top_logprobs_;
}

Step Sequence::cancel(FinishReason reason) {
  Step step;
  if (!finished()) finish(step, reason);
  return step;
}

void Sequence::finish(Step& step, FinishReason reason) {
  // The start of a character the stream ended in comes out as U+FFFD, which a stop string may still end with.
  step.text += stop_strings_.push(detokenizer_.flush());
  if (stop_strings_.matched())
    reason = FinishReason::StopString;
  else
    step.text += stop_strings_.flush();
  finish_ = reason;
  step.finish = reason;
}

}  // namespace rf::engine
