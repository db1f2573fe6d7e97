// Streams a GGUF file's tensors to a Sink in the background, group by group, while the caller already runs
// the groups that have arrived. Construction returns at once; reader threads pread the file into the sink's
// staging buffers (several chunks in flight), and one consumer thread hands the filled buffers to the sink
// in order, so reading, repacking (Sink::prepare) and copying (Sink::consume) overlap.
//
//   file ──pread (reader threads)──> staging buffers ──consume (consumer thread)──> sink
//
// Groups are loaded in the order listed unless request() or prioritize() moves one to the front. Every
// tensor is consumed exactly once: a tensor listed by several groups (tied embeddings) is loaded with the
// first of them, and a later group that lists it is loaded only when that one is. A failure (a short read, an
// I/O error, an exception from the sink) stops loading, and every waiter for a group not yet loaded gets an
// rf::Error naming the file and the tensor instead of hanging. The sink's callbacks must not call back into
// the loader's waiting or cancelling functions: they run on the threads those would wait for.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf.h"
#include "loader/chunk_plan.h"
#include "loader/sink.h"
#include "loader/tensor_groups.h"
#include "util/progress.h"

namespace rf::loader {

struct StreamingOptions {
  size_t reader_threads = 0;   // 0: min(4, hardware threads)
  size_t staging_buffers = 0;  // 0: reader_threads + 2, so every reader reads while the sink copies from two
  // Measured on an H200 host (page cache to device, 8 readers): 8 MiB chunks ran at 31 GB/s, 64 MiB ones at
  // 12 GB/s; each reader's pread was faster into the smaller buffers. Small chunks also take less pinned
  // memory, which costs 0.5 ms per MiB to allocate.
  uint64_t chunk_bytes = uint64_t{8} << 20;
  // false: load only the groups asked for by request() or prioritize(), on demand.
  bool stream_all = true;
  // Not empty: a progress bar with this label on stderr (util/progress.h: on a terminal only) once loading
  // has taken longer than kProgressDelay.
  std::string progress_label;
};

// Loads over sooner than this show no progress bar.
inline constexpr std::chrono::milliseconds kProgressDelay{300};

// Counters of a load. Times of the reader threads are summed over them; compare them with
// wall_seconds * reader_threads to see where readers spent their time.
struct StreamingStats {
  uint64_t bytes = 0;    // tensor bytes consumed
  uint64_t tensors = 0;  // tensors whose last byte was consumed
  uint64_t chunks = 0;   // chunks consumed
  uint64_t groups = 0;   // groups complete
  size_t reader_threads = 0;
  double wall_seconds = 0.0;         // construction to the last group complete (to now while loading)
  double first_group_seconds = 0.0;  // construction to the first group complete: the first forward pass's wait
  double staging_seconds = 0.0;      // readers allocating staging buffers
  double reader_idle_seconds = 0.0;  // readers waiting for a free buffer (on demand: for a request)
  double reuse_wait_seconds = 0.0;   // readers in Sink::wait_reusable
  double read_seconds = 0.0;         // readers in pread
  double prepare_seconds = 0.0;      // readers in Sink::prepare
  double consume_seconds = 0.0;      // the consumer in Sink::consume and Sink::group_done
  double consumer_idle_seconds = 0.0;  // the consumer waiting for the next chunk: reading is the bottleneck

  // End to end: file to sink.
  double gb_per_second() const { return wall_seconds > 0 ? static_cast<double>(bytes) / wall_seconds * 1e-9 : 0; }
  // What one reader thread reads while reading.
  double read_gb_per_second_per_reader() const {
    return read_seconds > 0 ? static_cast<double>(bytes) / read_seconds * 1e-9 : 0;
  }
};

class StreamingLoader {
 public:
  // Plans the chunks and starts the threads; reads nothing. `file` must come from gguf::File::open (reading
  // uses its descriptor) and every tensor of `groups` must be one of its infos. The sink must outlive the
  // loader. Throws rf::Error for a tensor of another file, a file without a descriptor or bad options.
  StreamingLoader(std::shared_ptr<const gguf::File> file, std::vector<TensorGroup> groups, Sink& sink,
                  StreamingOptions options = {});
  // Cancels what is still loading and joins the threads.
  ~StreamingLoader();
  StreamingLoader(const StreamingLoader&) = delete;
  StreamingLoader& operator=(const StreamingLoader&) = delete;

  size_t group_count() const { return groups_.size(); }
  const TensorGroup& group(size_t index) const;
  // The group that loads `tensor`: the first that lists it. Throws rf::Error when no group lists it.
  size_t group_of(const gguf::TensorInfo& tensor) const;

  // Whether every tensor of the group has been consumed (and Sink::group_done called for it).
  bool is_loaded(size_t group) const;
  // Moves the group (and the earlier groups it shares tensors with) to the front of what is still to be
  // read, ahead of earlier requests: the latest request is the one a caller now waits for. Does not block.
  void prioritize(size_t group);
  // Blocks until the group is loaded; throws rf::Error when loading failed or was cancelled first. Without
  // stream_all, a group nobody prioritizes never loads.
  void wait(size_t group) const;
  // prioritize() then wait(): loads the group now, once, however many threads ask for it at the same time.
  void request(size_t group);
  // Blocks until every group is loaded; throws like wait(). By then the staging buffers are released.
  void wait_all() const;

  // Stops loading: waiters of groups not yet loaded get an rf::Error; returns once the threads have stopped
  // and the staging buffers are released, after which the sink is not called again.
  void cancel();

  StreamingStats stats() const;

 private:
  using Clock = std::chrono::steady_clock;

  struct GroupState {
    size_t next_chunk = 0;      // first chunk not yet handed to a reader
    size_t unconsumed_chunks = 0;
    std::vector<size_t> shared_from;  // earlier groups that load tensors this group lists
    int64_t rank = 0;           // requested groups rank below 0, the latest request lowest
    bool own_chunks_consumed = false;
    bool loaded = false;
  };
  // A chunk handed to a reader, with its place in the consumer's order.
  struct Dispatch {
    size_t chunk;
    size_t buffer;
    std::span<uint8_t> staging;
    uint64_t sequence;
  };
  // Phase times in nanoseconds, added to from any thread.
  struct PhaseTimes {
    std::atomic<int64_t> staging{0}, reader_idle{0}, reuse_wait{0}, read{0}, prepare{0}, consume{0},
        consumer_idle{0};
  };

  // Called with mutex_ held; announce_loaded_groups() releases it around calls into the sink.
  bool stopped() const;
  std::optional<size_t> next_chunk_to_read() const;
  void count_consumed(const Dispatch& dispatch);
  void announce_loaded_groups(std::unique_lock<std::mutex>& lock);

  void reader_loop();
  void consumer_loop();
  std::span<uint8_t> allocate_buffer(size_t buffer);
  void release_staging();
  void read_chunk(const Dispatch& dispatch);
  void advise_will_need(size_t chunk) const;
  uint64_t file_offset(const Piece& piece) const;
  Chunk chunk_view(const Dispatch& dispatch) const;
  void fail_loading(const std::string& message);
  void check_group_index(size_t group) const;

  const std::shared_ptr<const gguf::File> file_;
  const std::vector<TensorGroup> groups_;
  Sink& sink_;
  const StreamingOptions options_;
  const int fd_;
  const Clock::time_point start_ = Clock::now();
  std::map<const gguf::TensorInfo*, size_t> owner_;  // tensor -> the group that loads it
  ChunkPlan plan_;
  uint64_t staging_bytes_ = 0;  // the largest chunk's extent: small models get small buffers

  mutable std::mutex mutex_;
  std::condition_variable reader_wakeup_;    // a buffer came free, a request came in, or loading stopped
  std::condition_variable consumer_wakeup_;  // a chunk was read, or loading stopped
  mutable std::condition_variable loaded_;   // a group was loaded, or loading stopped
  std::vector<GroupState> group_states_;
  std::vector<std::span<uint8_t>> staging_;  // one entry per buffer that may be allocated; empty until it is
  size_t buffers_allocated_ = 0;
  std::vector<size_t> free_buffers_;
  std::vector<bool> buffer_consumed_;        // the sink may still be reading the buffer: wait_reusable first
  std::map<uint64_t, Dispatch> read_chunks_;  // read, waiting for the consumer, by sequence
  size_t chunks_not_dispatched_ = 0;
  uint64_t next_sequence_ = 0;
  uint64_t next_sequence_to_consume_ = 0;
  int64_t last_rank_ = 0;
  std::optional<std::string> error_;
  bool cancelled_ = false;
  StreamingStats counts_;                    // bytes, tensors, chunks, groups and completion times
  std::optional<Clock::time_point> finished_;
  std::unique_ptr<Progress> progress_;        // while loading, with options_.progress_label

  PhaseTimes phase_times_;
  std::mutex join_mutex_;  // serializes cancel() callers
  std::vector<std::thread> readers_;
  std::thread consumer_;
};

}  // namespace rf::loader
