// Every `rocmforge` command lives in its own file and adds itself to the app with one of these functions;
// main.cpp lists them. A command's callback throws rf::Error for anything the user got wrong.
#pragma once
#include <string>

namespace CLI {
class App;
}

namespace rf {
class Tokenizer;
enum class ChatTemplate;
}  // namespace rf

namespace rf::engine {
enum class Device;
struct EngineOptions;
struct GenerationParams;
class Engine;
}  // namespace rf::engine

namespace rf::cli {

void add_inspect_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_gen_model_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_serve_command(CLI::App& app);

// The options `run` and `chat` share: device, context size, threads, token limit and sampling (defaults as
// llama.cpp's).
void add_generation_options(CLI::App& command, engine::EngineOptions& engine, engine::GenerationParams& generation);

// `--device auto|cpu|gpu`, its synonym `--gpu`, `--gpu-layers N` and `--float-activations`, which every command
// running a model takes;
// `engine.device`'s value now is the default --help shows.
void add_device_options(CLI::App& command, engine::EngineOptions& engine);

// Where the engine runs, for a line on stderr: "CPU (4 threads)", "GPU (NVIDIA H200)" or, with layers on the CPU,
// "GPU (NVIDIA H200 + CPU; layers 16..31 on the GPU, the others on 8 CPU threads)".
std::string backend_text(const engine::Engine& engine);

// The chat template `chat` and `serve` use: the one named (`--chat-template`; an unknown name is an rf::Error),
// else the model's own (one no family matches is an rf::Error), else ChatML as llama.cpp.
ChatTemplate choose_chat_template(const std::string& name, const Tokenizer& tokenizer);

// The whole content of a text file, bytes as they are (`tokenize -f`, `perplexity -f`); an rf::Error when it
// cannot be read.
std::string read_text_file(const std::string& path);

}  // namespace rf::cli
