// Choosing the next token from a row of logits, as llama.cpp's default sampler chain does: logit bias, then
// repetition, frequency and presence penalties over the last tokens, then top-k, top-p, min-p, temperature, and
// finally the most likely token (temperature 0) or a seeded random draw from the remaining distribution.
// Each stage is a function over a list of candidates so that tests can check it alone.
#pragma once
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <vector>

namespace rf::sampling {

// Each parameter's accepted values (check_params) follow its comment; NaN and the infinities are never accepted.
struct SamplingParams {
  float temperature = 0.8f;        // >= 0; 0: greedy
  int32_t top_k = 40;              // >= 0; 0: off
  float top_p = 0.95f;             // in (0, 1]; 1: off
  float min_p = 0.05f;             // in [0, 1]; 0: off
  float repeat_penalty = 1.0f;     // > 0; 1: off
  float frequency_penalty = 0.0f;  // in [-kMaxPenalty, kMaxPenalty]; 0: off
  float presence_penalty = 0.0f;   // in [-kMaxPenalty, kMaxPenalty]; 0: off
  int32_t penalty_last_n = 64;     // >= -1: tokens the penalties look back over; 0: off, -1: the whole history
  uint64_t seed = 0;
  // Token id -> bias added to its logit before any other stage (OpenAI's logit_bias): -100 all but bans the
  // token, +100 all but forces it.
  std::map<int32_t, float> logit_bias;
};

// The largest magnitude of a logit bias (OpenAI's range).
inline constexpr float kMaxLogitBias = 100.0f;
// The largest magnitude of a frequency or presence penalty (OpenAI's range).
inline constexpr float kMaxPenalty = 2.0f;

struct Candidate {
  int32_t id;
  float logit;
  float p;  // valid after softmax()
};

// An rf::Error naming the first bad entry of a logit bias: a token outside a vocabulary of n_vocab tokens, or a
// bias that is NaN or outside [-kMaxLogitBias, kMaxLogitBias]. For requests to check before they run.
void check_logit_bias(const std::map<int32_t, float>& logit_bias, size_t n_vocab);

// An rf::Error naming the first parameter outside its range ("top-p must be positive and at most 1 (1: off), got
// 7"); the logit bias is check_logit_bias's, against a vocabulary. The Sampler checks this; requests and command
// lines check it before they run, so that every front end holds the same rule.
void check_params(const SamplingParams& params);

// Checks the bias against the candidates' vocabulary (check_logit_bias), then adds each token's bias to its logit.
// Candidates must be in vocabulary order.
void apply_logit_bias(std::vector<Candidate>& candidates, const std::map<int32_t, float>& logit_bias);

// Whether the repetition, frequency or presence penalty changes any logit.
bool penalizes(const SamplingParams& params);

// Whether the sampler chooses the first largest of the logits as they come (util/argmax.h): greedy, with no logit bias
// and no penalties.
bool chooses_largest_logit(const SamplingParams& params);

// Penalizes each token that occurs in `recent` (the tokens the penalties look back over), as llama.cpp's
// penalties sampler: a positive logit is divided by repeat_penalty and a negative one multiplied (so the
// token always becomes less likely), then count * frequency_penalty + presence_penalty is subtracted.
// Candidates must be in vocabulary order (candidates[id].id == id), as they are before any other stage.
void apply_penalties(std::vector<Candidate>& candidates, std::span<const int32_t> recent, const SamplingParams& params);

// Sorts by logit, highest first, and keeps the k best (k <= 0 or k >= size: all, sorted).
void top_k(std::vector<Candidate>& candidates, int32_t k);

// Sets p to the softmax of the logits. Candidates must be sorted by logit, highest first.
void softmax(std::vector<Candidate>& candidates);

// Keeps the smallest prefix of the sorted candidates whose probabilities sum to at least p (at least one).
void top_p(std::vector<Candidate>& candidates, float p);

// Keeps the candidates whose probability is at least min_p times that of the most likely one.
// Candidates must be sorted by logit, highest first.
void min_p(std::vector<Candidate>& candidates, float min_p);

// Divides every logit by the temperature (> 0).
void apply_temperature(std::vector<Candidate>& candidates, float temperature);

class Sampler {
 public:
  // Parameters outside their ranges are an rf::Error (check_params).
  explicit Sampler(const SamplingParams& params);

  // Appends a token to the history the penalties look at (prompt tokens too, as llama.cpp does).
  void accept(int32_t token);
  // Runs the chain on logits (one per vocabulary entry) and returns the tokens that may be drawn with their
  // probabilities, most likely first; greedy sampling leaves the one best token with p = 1. The span stays
  // valid until the next call.
  std::span<const Candidate> distribution(std::span<const float> logits);
  // Draws a token from distribution(logits). Does not accept it.
  int32_t sample(std::span<const float> logits);

  const SamplingParams& params() const { return params_; }

 private:
  // A uniform double in [0, 1) from the generator's top 53 bits: the same on every platform for one seed.
  double uniform();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> recent_;  // at most penalty_last_n tokens (all when -1)
  std::vector<Candidate> candidates_;
};

}  // namespace rf::sampling
