#include "cli/options.h"

#include <algorithm>
#include <thread>

#include "engine/engine.h"
#include "model/config.h"

namespace rf::cli {

int max_threads() { return 4 * std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

CLI::Option* add_threads_option(CLI::App& command, int& threads, std::string_view zero_means) {
  return command
      .add_option("-t,--threads", threads,
                  fmt::format("Threads (0: {}; at most {}, four per hardware thread)", zero_means, max_threads()))
      ->transform(integer_in(0, max_threads()));
}

void check_context(const gguf::File& file, int64_t positions, std::string_view asked) {
  const int64_t model_context = model::read_config(file).context_length;
  if (positions > model_context) fail("{} is more than the model's context of {} positions", asked, model_context);
}

std::shared_ptr<const gguf::File> open_model(const std::string& path, const engine::EngineOptions& options) {
  std::shared_ptr<const gguf::File> file = gguf::File::open(path);
  // 0 asks for the engine's default, which fits the model and the memory.
  if (options.context > 0) check_context(*file, options.context, fmt::format("--ctx {}", options.context));
  return file;
}

}  // namespace rf::cli
