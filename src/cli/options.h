// Range checks for the numeric options of every command. An option takes only a number written out in full and
// within its range; anything else is one line naming the option, its range and the value. CLI11's own checks
// let NaN through, and its conversions read "010" as octal, saturate values beyond the type and take "-1" for
// the largest unsigned value. A context is also checked against the model before any KV cache is allocated.
#pragma once
#include <charconv>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "gguf/gguf.h"
#include "sampling/sampler.h"
#include "util/error.h"

namespace rf::engine {
struct EngineOptions;
}

namespace rf::cli {

// Whether `text` is a T written out in full (decimal, no sign on unsigned types, no overflow); sets `value`.
template <typename T>
bool parse_number(std::string_view text, T& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc{} && end == text.data() + text.size();
}

// An integer option that takes the values `accepts` allows and `range` names ("an integer in [0, 8]"). The value
// goes on to CLI11 in plain decimal, so that it reads what was checked.
template <std::integral T>
CLI::Validator integer_option(std::function<bool(T)> accepts, std::string range) {
  return CLI::Validator(
      [accepts = std::move(accepts), range = std::move(range)](std::string& text) -> std::string {
        T value{};
        if (!parse_number(text, value) || !accepts(value)) return fmt::format("must be {}, got {}", range, text);
        text = fmt::format("{}", value);
        return "";
      },
      "");
}

// An integer option within [min, max].
template <std::integral T>
CLI::Validator integer_in(T min, T max = std::numeric_limits<T>::max()) {
  return integer_option<T>([min, max](T value) { return value >= min && value <= max; },
                           fmt::format("an integer in [{}, {}]", min, max));
}

// The option of one sampling parameter, checked by the sampler's own rule (sampling::check_params), so that the
// command line and every other front end hold the same ranges.
template <typename T>
CLI::Validator sampling_option(T sampling::SamplingParams::*field) {
  return CLI::Validator(
      [field](std::string& text) -> std::string {
        sampling::SamplingParams params;
        if (!parse_number(text, params.*field)) {
          if constexpr (std::is_integral_v<T>)
            return fmt::format("must be an integer in [{}, {}], got {}", std::numeric_limits<T>::min(),
                               std::numeric_limits<T>::max(), text);
          return fmt::format("must be a finite number, got {}", text);
        }
        try {
          sampling::check_params(params);
        } catch (const Error& e) {
          return e.what();
        }
        text = fmt::format("{}", params.*field);
        return "";
      },
      "");
}

// The most threads a --threads option takes: four per hardware thread. More threads than hardware threads only
// slow the spinning workers down, and four times as many still lets that be measured; far more would run into the
// system's limits (`--threads 100000` used to abort the process).
int max_threads();

// -t,--threads into `threads`, from 0 (`zero_means`, e.g. "one per physical core") to max_threads().
CLI::Option* add_threads_option(CLI::App& command, int& threads, std::string_view zero_means);

// Refuses a KV cache of more positions than the model's context before the engine allocates one, so that a
// context of 10^12 names the limit instead of failing to allocate: "`asked` is more than the model's context of
// 2048 positions". `asked` says what asked for them ("--ctx 4096").
void check_context(const gguf::File& file, int64_t positions, std::string_view asked);

// Opens the model an engine with `options` will run, refusing a --ctx beyond its context (check_context).
std::shared_ptr<const gguf::File> open_model(const std::string& path, const engine::EngineOptions& options);

}  // namespace rf::cli
