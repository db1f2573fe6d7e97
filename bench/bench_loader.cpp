// Streaming a GGUF file from the page cache through the StreamingLoader with 1, 2 and 4 reader threads
// (or those given), into two CPU sinks: one that takes each chunk and drops it (the loader's own speed: file
// to staging buffers, which is what a GPU sink's DMA sees) and the HostSink (a copy into fresh host memory,
// page faults included). Without a path it writes a Llama-shaped file of --size-gb gigabytes to /tmp once.
//
//   bench_loader [FILE.gguf] [--size-gb N] [--threads 1,2,4] [--chunk-mib 8] [--repeat 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "loader/host_sink.h"
#include "loader/streaming_loader.h"
#include "loader/tensor_groups.h"
#include "util/error.h"

namespace {

using rf::loader::StreamingLoader;
using rf::loader::StreamingOptions;
using rf::loader::StreamingStats;

struct Arguments {
  std::string path;
  double size_gb = 2.0;
  std::vector<size_t> threads = {1, 2, 4};
  uint64_t chunk_mib = StreamingOptions{}.chunk_bytes >> 20;
  int repeat = 3;
};

Arguments parse_arguments(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&] {
      if (i + 1 >= argc) rf::fail("{} needs a value", arg);
      return std::string(argv[++i]);
    };
    if (arg == "--size-gb") {
      args.size_gb = std::stod(value());
    } else if (arg == "--threads") {
      args.threads.clear();
      const std::string list = value();
      for (size_t start = 0; start < list.size();) {
        const size_t comma = std::min(list.find(',', start), list.size());
        args.threads.push_back(std::stoul(list.substr(start, comma - start)));
        start = comma + 1;
      }
    } else if (arg == "--chunk-mib") {
      args.chunk_mib = std::stoul(value());
    } else if (arg == "--repeat") {
      args.repeat = std::stoi(value());
    } else if (arg.starts_with("--")) {
      rf::fail("unknown option {}", arg);
    } else {
      args.path = arg;
    }
  }
  return args;
}

// A file shaped like a 7B Llama in Q8_0 (4096 wide, FFN 11008, ~215 MB a layer) with as many layers as fit
// in `size_gb`. The bytes are random: the loader does not look at them.
std::string write_synthetic_model(double size_gb) {
  constexpr uint64_t kEmbd = 4096;
  constexpr uint64_t kFfn = 11008;
  constexpr uint64_t kVocab = 32000;
  const auto q8_bytes = [](uint64_t cols, uint64_t rows) { return cols / 32 * 34 * rows; };
  const uint64_t layer_bytes = kEmbd * 4 * 2 + 4 * q8_bytes(kEmbd, kEmbd) + 3 * q8_bytes(kEmbd, kFfn);
  const uint64_t target = static_cast<uint64_t>(size_gb * 1e9);
  const uint64_t layers = std::max<uint64_t>(1, (target - 2 * q8_bytes(kEmbd, kVocab)) / layer_bytes);
  const std::string path = fmt::format("/tmp/rf_bench_loader_{}_layers.gguf", layers);
  if (std::filesystem::exists(path)) return path;

  std::vector<uint8_t> noise(uint64_t{1} << 20);
  std::mt19937_64 rng(7);
  for (uint8_t& byte : noise) byte = static_cast<uint8_t>(rng());
  rf::gguf::Writer writer;
  writer.set_string("general.architecture", "llama");
  const auto add = [&](const std::string& name, rf::TensorType type, std::vector<uint64_t> shape) {
    const uint64_t bytes = type == rf::TensorType::F32 ? shape[0] * 4 : q8_bytes(shape[0], shape.size() > 1 ? shape[1] : 1);
    writer.add_tensor(name, type, std::move(shape), [&noise, bytes](const rf::gguf::ByteSink& sink) {
      for (uint64_t done = 0; done < bytes; done += noise.size())
        sink(std::span<const uint8_t>(noise).first(std::min<uint64_t>(noise.size(), bytes - done)));
    });
  };
  add("token_embd.weight", rf::TensorType::Q8_0, {kEmbd, kVocab});
  for (uint64_t l = 0; l < layers; ++l) {
    const std::string blk = fmt::format("blk.{}.", l);
    add(blk + "attn_norm.weight", rf::TensorType::F32, {kEmbd});
    for (const char* name : {"attn_q", "attn_k", "attn_v", "attn_output"})
      add(blk + name + ".weight", rf::TensorType::Q8_0, {kEmbd, kEmbd});
    add(blk + "ffn_norm.weight", rf::TensorType::F32, {kEmbd});
    add(blk + "ffn_gate.weight", rf::TensorType::Q8_0, {kEmbd, kFfn});
    add(blk + "ffn_up.weight", rf::TensorType::Q8_0, {kEmbd, kFfn});
    add(blk + "ffn_down.weight", rf::TensorType::Q8_0, {kFfn, kEmbd});
  }
  add("output_norm.weight", rf::TensorType::F32, {kEmbd});
  add("output.weight", rf::TensorType::Q8_0, {kEmbd, kVocab});
  fmt::print("writing {} ({:.2f} GB)...\n", path, static_cast<double>(writer.file_size()) * 1e-9);
  std::fflush(stdout);
  writer.write(path);
  return path;
}

// Takes every chunk and drops it: what remains is the loader's reading and handing over.
class DiscardSink final : public rf::loader::Sink {
 public:
  void consume(const rf::loader::Chunk&) override {}
};

StreamingStats load_once(const std::shared_ptr<const rf::gguf::File>& file, rf::loader::Sink& sink,
                         const StreamingOptions& options) {
  StreamingLoader loader(file, rf::loader::file_order_groups(*file), sink, options);
  loader.wait_all();
  return loader.stats();
}

void print_row(const std::string& sink, const StreamingStats& s) {
  const double readers = static_cast<double>(s.reader_threads);
  fmt::print("{:>7} {:>8} {:>8.2f} {:>9.1f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", s.reader_threads,
             sink, s.gb_per_second(), s.first_group_seconds * 1e3, s.read_gb_per_second_per_reader(),
             s.read_seconds / readers / s.wall_seconds, s.reader_idle_seconds / readers / s.wall_seconds,
             s.consume_seconds / s.wall_seconds, s.consumer_idle_seconds / s.wall_seconds);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Arguments args = parse_arguments(argc, argv);
    const std::string path = args.path.empty() ? write_synthetic_model(args.size_gb) : args.path;
    const std::shared_ptr<const rf::gguf::File> file = rf::gguf::File::open(path);
    DiscardSink discard;
    StreamingOptions warm_up;
    warm_up.chunk_bytes = args.chunk_mib << 20;
    const StreamingStats first = load_once(file, discard, warm_up);  // brings the file into the page cache
    fmt::print("{}: {:.2f} GB of tensors in {} tensors; first pass {:.2f} GB/s (cold or warm cache)\n", path,
               static_cast<double>(first.bytes) * 1e-9, first.tensors, first.gb_per_second());
    fmt::print("chunks of {} MiB, best of {} runs; the fractions are of wall time, per reader for the readers\n\n",
               args.chunk_mib, args.repeat);
    fmt::print("{:>7} {:>8} {:>8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "readers", "sink", "GB/s",
               "first ms", "GB/s/rdr", "reading", "rdr idle", "consuming", "cons idle");
    for (size_t threads : args.threads) {
      StreamingOptions options;
      options.reader_threads = threads;
      options.chunk_bytes = args.chunk_mib << 20;
      const auto best_of = [&](auto make_sink) {
        StreamingStats best;
        for (int run = 0; run < args.repeat; ++run) {
          auto sink = make_sink();
          const StreamingStats stats = load_once(file, *sink, options);
          if (stats.gb_per_second() > best.gb_per_second()) best = stats;
        }
        return best;
      };
      print_row("discard", best_of([] { return std::make_unique<DiscardSink>(); }));
      print_row("host", best_of([&] { return std::make_unique<rf::loader::HostSink>(*file); }));
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_loader: {}\n", e.what());
    return 1;
  }
}
