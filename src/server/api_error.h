// Errors as OpenAI's API reports them: an HTTP status and {"error": {"message", "type", "param", "code"}}. Every
// request the server refuses is one of these, naming the field at fault where there is one, so that a client
// library shows the user what to change.
#pragma once
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace rf::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::optional<std::string> param = {},
           std::optional<std::string> code = {})
      : std::runtime_error(message),
        status_(status),
        type_(std::move(type)),
        param_(std::move(param)),
        code_(std::move(code)) {}

  int status() const { return status_; }

  nlohmann::json to_json() const {
    return {{"error",
             {{"message", what()},
              {"type", type_},
              {"param", param_ ? nlohmann::json(*param_) : nlohmann::json(nullptr)},
              {"code", code_ ? nlohmann::json(*code_) : nlohmann::json(nullptr)}}}};
  }

 private:
  int status_;
  std::string type_;
  std::optional<std::string> param_;
  std::optional<std::string> code_;
};

// A 400 invalid_request_error naming request field `param` (e.g. "temperature", "messages[0].role").
template <typename... Args>
[[noreturn]] void invalid_field(std::string_view param, fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, "invalid_request_error", fmt::format(format, std::forward<Args>(args)...), std::string(param));
}

}  // namespace rf::server
