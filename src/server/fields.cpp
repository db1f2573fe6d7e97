#include "server/fields.h"

#include <cmath>
#include <limits>

#include "server/api_error.h"

namespace rf::server {
namespace {

// A value as an error message shows it: short scalars as written, anything else by its type, so that a huge
// value does not come back whole in the error.
std::string describe(const nlohmann::json& value) {
  constexpr size_t kShown = 40;
  if (value.is_primitive() && !value.is_string()) return json_text(value);
  if (value.is_string() && value.get_ref<const std::string&>().size() <= kShown) return json_text(value);
  return value.type_name();
}

[[noreturn]] void not_an_object(const nlohmann::json& value) {
  throw ApiError(400, "invalid_request_error",
                 fmt::format("the body must be a JSON object, not {}", value.type_name()));
}

}  // namespace

std::string json_text(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json parse_body(const std::string& text) {
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's message names the byte and what was wrong there (ill-formed UTF-8 included), or the number too
    // large for a double.
    throw ApiError(400, "invalid_request_error", fmt::format("the body is not valid JSON: {}", e.what()), {},
                   "invalid_json");
  }
  if (!body.is_object()) not_an_object(body);
  return body;
}

Fields::Fields(const nlohmann::json& object, std::string name) : object_(object), name_(std::move(name)) {
  if (object_.is_object()) return;
  if (name_.empty()) not_an_object(object_);
  invalid_field(name_, "{} must be an object, not {}", name_, object_.type_name());
}

const nlohmann::json* Fields::find(std::string_view field) const {
  const auto it = object_.find(field);
  return it == object_.end() || it->is_null() ? nullptr : &*it;
}

std::string Fields::param(std::string_view field) const {
  return name_.empty() ? std::string(field) : fmt::format("{}.{}", name_, field);
}

std::optional<std::string> Fields::string(std::string_view field) const {
  const nlohmann::json* value = find(field);
  if (!value) return std::nullopt;
  if (!value->is_string()) invalid_field(param(field), "{} must be a string, not {}", param(field), value->type_name());
  return value->get<std::string>();
}

std::optional<bool> Fields::boolean(std::string_view field) const {
  const nlohmann::json* value = find(field);
  if (!value) return std::nullopt;
  if (!value->is_boolean())
    invalid_field(param(field), "{} must be true or false, not {}", param(field), describe(*value));
  return value->get<bool>();
}

std::optional<int64_t> Fields::integer(std::string_view field, int64_t min, int64_t max) const {
  const nlohmann::json* value = find(field);
  if (!value) return std::nullopt;
  int64_t result = 0;
  if (!integer_within(*value, min, max, result))
    invalid_field(param(field), "{} must be an integer in [{}, {}], got {}", param(field), min, max, describe(*value));
  return result;
}

std::optional<double> Fields::number(std::string_view field) const {
  const nlohmann::json* value = find(field);
  if (!value) return std::nullopt;
  // A literal too large for a double (1e999) parses as an infinity.
  if (!value->is_number() || !std::isfinite(value->get<double>()))
    invalid_field(param(field), "{} must be a finite number, got {}", param(field), describe(*value));
  return value->get<double>();
}

bool integer_within(const nlohmann::json& value, int64_t min, int64_t max, int64_t& result) {
  if (value.is_number_unsigned()) {
    const auto unsigned_value = value.get<uint64_t>();
    if (unsigned_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    result = static_cast<int64_t>(unsigned_value);
  } else if (value.is_number_integer()) {
    result = value.get<int64_t>();
  } else {
    return false;
  }
  return result >= min && result <= max;
}

}  // namespace rf::server
