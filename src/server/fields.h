// Reading a JSON request body field by field. Each field is read as the type it must have: a field that is
// absent or null is not given (clients send null for options they leave unset), one of another type is a 400
// naming it, and fields the server does not know are ignored, as OpenAI's API and its clients expect.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace rf::server {

// The body of a request: a JSON object parsed from `text` (malformed JSON, invalid UTF-8 or another type is a 400).
nlohmann::json parse_body(const std::string& text);

class Fields {
 public:
  // `object` must be a JSON object, else a 400 naming `name` (the body when empty). Its fields are named
  // `name` + "." + field in errors ("messages[0].role"), or the field alone at the top.
  explicit Fields(const nlohmann::json& object, std::string name = "");

  // The field's value; nullptr when absent or null.
  const nlohmann::json* find(std::string_view field) const;
  // How errors name the field.
  std::string param(std::string_view field) const;

  std::optional<std::string> string(std::string_view field) const;
  std::optional<bool> boolean(std::string_view field) const;
  // An integer (not 2.0: JSON integers only) within [min, max].
  std::optional<int64_t> integer(std::string_view field, int64_t min, int64_t max) const;
  // A finite number.
  std::optional<double> number(std::string_view field) const;

 private:
  const nlohmann::json& object_;
  std::string name_;
};

// Whether `value` is a JSON integer within [min, max]; sets `result`.
bool integer_within(const nlohmann::json& value, int64_t min, int64_t max, int64_t& result);

// JSON text of `value`. Strings that are not valid UTF-8 (a token's piece may hold part of a character) come out
// with U+FFFD in place of their invalid bytes instead of failing.
std::string json_text(const nlohmann::json& value);

}  // namespace rf::server
