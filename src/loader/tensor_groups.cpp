#include "loader/tensor_groups.h"

#include <string_view>

#include <fmt/format.h>

#include "util/error.h"

namespace rf::loader {

std::vector<TensorGroup> execution_order_groups(const model::ExecutionPlan& plan, int64_t first_layer) {
  const auto layers = static_cast<int64_t>(plan.layers().size());
  if (first_layer < 0 || first_layer > layers)
    fail("the first of a device's layers must be within 0..{}, got {}", layers, first_layer);
  std::vector<TensorGroup> groups;
  TensorGroup& embeddings = groups.emplace_back(TensorGroup{"embeddings", {}});
  if (first_layer == 0) {
    embeddings.tensors.push_back(&plan.token_embd().info());
    if (plan.position_embd()) embeddings.tensors.push_back(&plan.position_embd().info());
  }
  if (plan.rope_freqs()) embeddings.tensors.push_back(&plan.rope_freqs().info());
  for (int64_t i = 0; i < layers; ++i) {
    TensorGroup& layer = groups.emplace_back(TensorGroup{fmt::format("layer {}", i), {}});
    if (i < first_layer) continue;
    for (const model::LazyTensor* tensor : plan.layer(i).tensors()) layer.tensors.push_back(&tensor->info());
  }
  TensorGroup& output = groups.emplace_back(TensorGroup{"output", {}});
  for (const model::LazyTensor* tensor : plan.output_tensors()) output.tensors.push_back(&tensor->info());
  return groups;
}

std::vector<TensorGroup> file_order_groups(const gguf::File& file) {
  std::vector<TensorGroup> groups;
  for (const gguf::TensorInfo& tensor : file.tensors()) {
    const std::string_view name = tensor.name;
    const size_t block_end = name.starts_with("blk.") ? name.find('.', 4) : std::string_view::npos;
    const std::string group = block_end == std::string_view::npos ? "other" : std::string(name.substr(0, block_end));
    if (groups.empty() || groups.back().name != group) groups.push_back({group, {}});
    groups.back().tensors.push_back(&tensor);
  }
  return groups;
}

}  // namespace rf::loader
