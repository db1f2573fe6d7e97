#include "backend/cpu/residency.h"

#include <string>

#include "quant/quant.h"

namespace rf::cpu {

model::ResidentTensor MappedResidency::materialize(const model::TensorSource& tensor) {
  quant::require_supported(tensor.type(), "tensor '" + std::string(tensor.name()) + "'");
  if (const MappedFile* mapping = tensor.file->mapping())
    mapping->will_need(tensor.file->data_offset() + tensor.info->offset, tensor.info->bytes);
  return {tensor.bytes().data(), nullptr};
}

}  // namespace rf::cpu
