// Fuzzes the GGUF parser with arbitrary bytes, then touches everything a valid parse promises: every value
// through its accessors and the first and last byte of every tensor, and dequantizes the first row of each
// tensor of a supported type that has one. Only FormatError/Error may escape the parser; anything else is a
// finding.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gguf/gguf.h"
#include "quant/quant.h"

namespace {

volatile uint8_t g_sink;

void touch(const rf::gguf::Value& value) {
  using rf::gguf::ValueType;
  if (value.type() == ValueType::ARRAY) {
    if (value.element_type() == ValueType::STRING)
      for (std::string_view s : value.strings())
        if (!s.empty()) g_sink = static_cast<uint8_t>(s.back());
    for (const auto& item : value.items()) touch(item);
    if (!value.raw().empty()) g_sink = value.raw().back();
    return;
  }
  if (value.type() == ValueType::STRING) {
    if (!value.str().empty()) g_sink = static_cast<uint8_t>(value.str().front());
    return;
  }
  g_sink = value.type() == ValueType::BOOL ? value.as<bool>() : value.to_double() > 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<rf::gguf::File> file;
  try {
    file = rf::gguf::File::parse({data, size}, "fuzz.gguf");
  } catch (const rf::Error&) {
    return 0;
  }
  for (const auto& kv : file->metadata()) {
    touch(kv.value);
    g_sink = static_cast<uint8_t>(file->find(kv.key) != nullptr);
  }
  std::vector<float> row;
  for (const auto& info : file->tensors()) {
    const auto bytes = file->tensor_data(info);
    if (!bytes.empty()) g_sink = bytes.front() ^ bytes.back();
    // A tensor of no rows (a zero in its shape) has no bytes and no first row to read.
    if (!rf::quant::is_supported(info.type()) || info.ne[0] > 4096 || info.rows() == 0) continue;
    row.resize(info.ne[0]);
    rf::quant::dequantize(info.type(), bytes.data(), row.data(), static_cast<int64_t>(info.ne[0]));
  }
  return 0;
}
