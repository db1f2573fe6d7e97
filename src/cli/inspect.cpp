// rocmforge inspect FILE [--json] [--dump TENSOR --out OUT.f32]: what a GGUF file holds, as text for people
// or as one JSON object for tools; or one tensor dequantized to raw f32.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/file_type.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "util/error.h"

namespace rf::cli {
namespace {

using gguf::Value;
using gguf::ValueType;
using nlohmann::json;

// Text mode shows this many items of an array and this many bytes of a string.
constexpr size_t kShownItems = 6;
constexpr size_t kShownStringBytes = 80;
// --dump dequantizes this many elements at a time.
constexpr uint64_t kDumpChunkElements = 16 << 20;

struct InspectOptions {
  std::string path;
  bool json = false;
  std::string dump_tensor;
  std::string dump_path;
};

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

json scalar_json(ValueType type, const uint8_t* p) {
  switch (type) {
    case ValueType::UINT8: return load<uint8_t>(p);
    case ValueType::INT8: return load<int8_t>(p);
    case ValueType::UINT16: return load<uint16_t>(p);
    case ValueType::INT16: return load<int16_t>(p);
    case ValueType::UINT32: return load<uint32_t>(p);
    case ValueType::INT32: return load<int32_t>(p);
    case ValueType::UINT64: return load<uint64_t>(p);
    case ValueType::INT64: return load<int64_t>(p);
    case ValueType::FLOAT32: return load<float>(p);
    case ValueType::FLOAT64: return load<double>(p);
    case ValueType::BOOL: return *p != 0;
    default: fail("value type {} is not a scalar", gguf::value_type_name(type));
  }
}

// Item `index` of an array value.
json item_json(const Value& array, uint64_t index);

json value_json(const Value& value) {
  if (value.type() == ValueType::STRING) return std::string(value.str());
  if (!value.is_array()) return scalar_json(value.type(), value.raw().data());
  json items = json::array();
  for (uint64_t i = 0; i < value.size(); ++i) items.push_back(item_json(value, i));
  return items;
}

json item_json(const Value& array, uint64_t index) {
  switch (array.element_type()) {
    case ValueType::STRING: return std::string(array.strings()[index]);
    case ValueType::ARRAY: return value_json(array.items()[index]);
    default: {
      const uint64_t item_bytes = array.raw().size() / array.size();
      return scalar_json(array.element_type(), array.raw().data() + index * item_bytes);
    }
  }
}

// One scalar or string of type `type` as text: strings quoted, escaped and cut short (invalid UTF-8 shows as
// U+FFFD), FLOAT32 in its shortest form rather than its double's.
std::string scalar_text(ValueType type, json item) {
  if (type == ValueType::FLOAT32) return fmt::format("{}", static_cast<float>(item.get<double>()));
  if (item.is_string() && item.get_ref<const std::string&>().size() > kShownStringBytes)
    item = item.get_ref<const std::string&>().substr(0, kShownStringBytes) + "...";
  return item.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string value_text(const Value& value) {
  if (!value.is_array()) return scalar_text(value.type(), value_json(value));
  std::string text = fmt::format("[{} x {}]", gguf::value_type_name(value.element_type()), value.size());
  for (uint64_t i = 0; i < std::min<uint64_t>(value.size(), kShownItems); ++i) {
    const Value* nested = value.element_type() == ValueType::ARRAY ? &value.items()[i] : nullptr;
    text += i == 0 ? " " : ", ";
    text += nested ? value_text(*nested) : scalar_text(value.element_type(), item_json(value, i));
  }
  if (value.size() > kShownItems) text += ", ...";
  return text;
}

std::string shape_text(const gguf::TensorInfo& tensor) { return fmt::format("[{}]", fmt::join(tensor.shape(), ", ")); }

std::string bytes_text(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < (1 << 20)) return fmt::format("{:.2f} KiB", bytes / 1024.0);
  if (bytes < (1 << 30)) return fmt::format("{:.2f} MiB", bytes / 1048576.0);
  return fmt::format("{:.2f} GiB", bytes / 1073741824.0);
}

std::string count_text(uint64_t count) {
  if (count < 1000) return fmt::format("{}", count);
  if (count < 1000'000) return fmt::format("{:.2f}K", count / 1e3);
  if (count < 1000'000'000) return fmt::format("{:.2f}M", count / 1e6);
  return fmt::format("{:.2f}B", count / 1e9);
}

std::string file_type_text(const gguf::File& file) {
  const Value* value = file.find("general.file_type");
  if (!value || !value->is_integer()) return "not set";
  const int64_t id = value->to_int();
  const std::string_view name = id >= 0 && id <= UINT32_MAX ? file_type_name(static_cast<uint32_t>(id)) : "";
  return fmt::format("{} ({})", name.empty() ? "unknown" : name, id);
}

void print_text(const gguf::File& file) {
  fmt::print("file          {}\n", file.path());
  fmt::print("GGUF version  {}\n", file.version());
  fmt::print("architecture  {}\n", file.architecture().empty() ? "(not set)" : file.architecture());
  const uint64_t parameters = file.parameter_count();
  fmt::print("parameters    {} ({})\n", count_text(parameters), parameters);
  fmt::print("file type     {}\n", file_type_text(file));
  fmt::print("size          {} ({} bytes), data section at byte {}, alignment {}\n", bytes_text(file.file_size()),
             file.file_size(), file.data_offset(), file.alignment());

  struct TypeTotal {
    uint64_t tensors = 0, bytes = 0;
  };
  std::map<uint32_t, TypeTotal> by_type;
  for (const auto& tensor : file.tensors()) {
    TypeTotal& total = by_type[static_cast<uint32_t>(tensor.type())];
    total.tensors += 1;
    total.bytes += tensor.bytes;
  }
  fmt::print("\nbytes by tensor type\n");
  for (const auto& [type, total] : by_type)
    fmt::print("  {:<8} {:>5} tensors  {:>12}\n", tensor_type_name(static_cast<TensorType>(type)), total.tensors,
               bytes_text(total.bytes));

  size_t key_width = 0;
  for (const auto& kv : file.metadata()) key_width = std::max(key_width, kv.key.size());
  fmt::print("\nmetadata ({} keys)\n", file.metadata().size());
  for (const auto& kv : file.metadata())
    fmt::print("  {:<{}}  {:<7}  {}\n", kv.key, key_width, gguf::value_type_name(kv.value.type()), value_text(kv.value));

  size_t name_width = 4;
  for (const auto& tensor : file.tensors()) name_width = std::max(name_width, tensor.name.size());
  fmt::print("\ntensors ({})\n", file.tensors().size());
  fmt::print("  {:<{}}  {:<7}  {:<22}  {:>12}  {:>12}\n", "name", name_width, "type", "shape", "offset", "bytes");
  for (const auto& tensor : file.tensors())
    fmt::print("  {:<{}}  {:<7}  {:<22}  {:>12}  {:>12}\n", tensor.name, name_width, tensor.type_info->name,
               shape_text(tensor), tensor.offset, tensor.bytes);
}

void print_json(const gguf::File& file) {
  json metadata = json::object();
  for (const auto& kv : file.metadata()) metadata[std::string(kv.key)] = value_json(kv.value);
  json tensors = json::array();
  for (const auto& tensor : file.tensors())
    tensors.push_back({{"name", std::string(tensor.name)},
                       {"type", std::string(tensor.type_info->name)},
                       {"shape", tensor.shape()},
                       {"offset", tensor.offset},
                       {"bytes", tensor.bytes}});
  const json out = {{"version", file.version()},
                    {"architecture", std::string(file.architecture())},
                    {"parameters", file.parameter_count()},
                    {"data_offset", file.data_offset()},
                    {"alignment", file.alignment()},
                    {"metadata", std::move(metadata)},
                    {"tensors", std::move(tensors)}};
  fmt::print("{}\n", out.dump(-1, ' ', false, json::error_handler_t::replace));
}

// Writes the tensor as raw little-endian f32, dequantizing a chunk of rows at a time.
void dump_tensor(const gguf::File& file, const std::string& name, const std::string& out_path) {
  const gguf::TensorInfo& tensor = file.tensor(name);
  quant::require_supported(tensor.type(), fmt::format("tensor '{}'", name));
  std::unique_ptr<FILE, int (*)(FILE*)> out(std::fopen(out_path.c_str(), "wb"), std::fclose);
  if (!out) fail("{}: cannot create: {}", out_path, std::strerror(errno));
  const std::span<const uint8_t> data = file.tensor_data(tensor);
  const uint64_t row_length = tensor.ne[0];
  const uint64_t source_row_bytes = tensor.bytes / tensor.rows();
  const uint64_t chunk_rows = std::max<uint64_t>(1, kDumpChunkElements / row_length);
  std::vector<float> values(std::min(chunk_rows, tensor.rows()) * row_length);
  for (uint64_t row = 0; row < tensor.rows(); row += chunk_rows) {
    const uint64_t count = std::min(chunk_rows, tensor.rows() - row) * row_length;
    quant::dequantize_parallel(tensor.type(), data.data() + row * source_row_bytes, values.data(),
                               static_cast<int64_t>(count));
    if (std::fwrite(values.data(), sizeof(float), count, out.get()) != count)
      fail("{}: cannot write: {}", out_path, std::strerror(errno));
  }
  if (std::fclose(out.release()) != 0) fail("{}: cannot write: {}", out_path, std::strerror(errno));
  fmt::print("wrote {} f32 values of {} ({}, shape {}) to {}\n", tensor.elements(), name, tensor.type_info->name,
             shape_text(tensor), out_path);
}

void inspect(const InspectOptions& options) {
  const auto file = gguf::File::open(options.path);
  if (!options.dump_tensor.empty()) {
    dump_tensor(*file, options.dump_tensor, options.dump_path);
  } else if (options.json) {
    print_json(*file);
  } else {
    print_text(*file);
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* command = app.add_subcommand("inspect", "Show a GGUF file's metadata and tensors, or dump one tensor");
  command->add_option("file", options->path, "GGUF file")->required();
  auto* json_flag = command->add_flag("--json", options->json,
                                      "Print one JSON object: version, architecture, metadata (every key, full "
                                      "arrays) and tensors (name, type, shape ne0 first, offset, bytes)");
  auto* dump = command->add_option("--dump", options->dump_tensor, "Dequantize this tensor to f32 (needs --out)");
  auto* out = command->add_option("--out", options->dump_path, "Where --dump writes raw little-endian f32");
  dump->needs(out)->excludes(json_flag);
  out->needs(dump);
  command->callback([options] { inspect(*options); });
}

}  // namespace rf::cli
