// Broken or altered copies of the shared models, written with gguf::Writer into a temporary file.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "test_paths.h"

namespace rf::test {

// A shared model by name, without the .gguf ending.
inline std::string shared_model(const std::string& name) { return shared_path("models/" + name + ".gguf"); }

// What to change while copying a model: keys are copied, then edited; tensors are copied except the dropped
// ones, then more are added.
struct ModelEdits {
  using Edit = std::function<void(gguf::Writer&)>;
  ModelEdits& edit_keys(Edit edit) {
    keys = std::move(edit);
    return *this;
  }
  ModelEdits& drop_tensor(const std::string& name) {
    dropped.insert(name);
    return *this;
  }
  ModelEdits& add_tensors(Edit edit) {
    tensors = std::move(edit);
    return *this;
  }

  Edit keys = [](gguf::Writer&) {};
  std::set<std::string> dropped;
  Edit tensors = [](gguf::Writer&) {};
};

// A temporary GGUF file, deleted with the object.
class TempModel {
 public:
  // `model`: a shared model's name (shared_model), or a path ending in .gguf.
  TempModel(const std::string& model, const ModelEdits& edits) {
    static int counter = 0;
    path_ = ::testing::TempDir() + "rf_model_variant_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) +
            ".gguf";
    const std::shared_ptr<const gguf::File> source =
        gguf::File::open(model.ends_with(".gguf") ? model : shared_model(model));
    gguf::Writer writer;
    for (const gguf::KeyValue& kv : source->metadata()) writer.set_value(kv.key, kv.value);
    edits.keys(writer);
    for (const gguf::TensorInfo& info : source->tensors()) {
      if (edits.dropped.contains(std::string(info.name))) continue;
      writer.add_tensor(std::string(info.name), info.type(), info.shape(),
                        [source, &info](const gguf::ByteSink& sink) { sink(source->tensor_data(info)); });
    }
    edits.tensors(writer);
    writer.write(path_);
  }
  ~TempModel() { std::remove(path_.c_str()); }
  TempModel(const TempModel&) = delete;
  TempModel& operator=(const TempModel&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A tensor of zero bytes: enough for checks of names, shapes and types.
inline void add_zero_tensor(gguf::Writer& writer, const std::string& name, TensorType type,
                            std::vector<uint64_t> shape) {
  uint64_t rows = 1;
  for (size_t i = 1; i < shape.size(); ++i) rows *= shape[i];
  const uint64_t bytes = row_bytes(type, shape[0]) * rows;
  writer.add_tensor(name, type, std::move(shape), [bytes](const gguf::ByteSink& sink) {
    const std::vector<uint8_t> zeros(bytes);
    sink(zeros);
  });
}

}  // namespace rf::test
