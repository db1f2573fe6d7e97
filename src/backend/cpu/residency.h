// The CPU's residency: weights are computed on where they lie in the memory-mapped file (zero copy).
#pragma once
#include "model/lazy_tensor.h"

namespace rf::cpu {

class MappedResidency final : public model::Residency {
 public:
  // Checks that the CPU kernels support the tensor's type (an rf::Error naming the tensor otherwise), asks
  // the kernel to start reading its pages and returns a view of the mapping.
  model::ResidentTensor materialize(const model::TensorSource& tensor) override;
};

}  // namespace rf::cpu
