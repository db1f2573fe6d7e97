// The unit a StreamingLoader makes usable at once: a named list of tensors, typically one transformer layer.
// Groups are streamed in the order they are listed, so a model lists them in execution order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/execution_plan.h"

namespace rf::loader {

struct TensorGroup {
  std::string name;                              // for messages: "embeddings", "layer 3", "output"
  std::vector<const gguf::TensorInfo*> tensors;  // infos of the loaded file, in order of use
};

// A plan's weights in execution order: group 0 holds the embeddings (and the rope frequency factors, which
// every layer uses), group 1 + i layer i, and the last group the output norm and output matrix. With tied
// embeddings the output group lists token_embd.weight again; the loader loads it once, with the first group
// that lists it. From `first_layer` on: what a device running layers first_layer.. and the output needs (the
// layers before it run elsewhere): their groups and the embeddings' are empty, but for the rope frequency
// factors, and keep their places.
std::vector<TensorGroup> execution_order_groups(const model::ExecutionPlan& plan, int64_t first_layer = 0);

// Groups for any GGUF file, without a plan: one per run of consecutive tensors in file order that share a
// block prefix ("blk.7"), named by it; runs of tensors outside blocks are groups named "other".
std::vector<TensorGroup> file_order_groups(const gguf::File& file);

// The index of layer `layer`'s group in execution_order_groups().
inline size_t layer_group(int64_t layer) { return static_cast<size_t>(layer) + 1; }

}  // namespace rf::loader
