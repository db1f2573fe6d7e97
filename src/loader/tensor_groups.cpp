#include "loader/tensor_groups.h"

#include <string_view>

#include <fmt/format.h>

namespace rf::loader {

std::vector<TensorGroup> execution_order_groups(const model::ExecutionPlan& plan) {
  std::vector<TensorGroup> groups;
  TensorGroup& embeddings = groups.emplace_back(TensorGroup{"embeddings", {&plan.token_embd().info()}});
  if (plan.rope_freqs()) embeddings.tensors.push_back(&plan.rope_freqs().info());
  for (size_t i = 0; i < plan.layers().size(); ++i) {
    TensorGroup& layer = groups.emplace_back(TensorGroup{fmt::format("layer {}", i), {}});
    for (const model::LazyTensor* tensor : plan.layers()[i].tensors()) layer.tensors.push_back(&tensor->info());
  }
  groups.push_back({"output", {&plan.output_norm().info(), &plan.output().info()}});
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
