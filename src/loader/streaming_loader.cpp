#include "loader/streaming_loader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include <fmt/format.h>

#include "util/error.h"

namespace rf::loader {
namespace {

// Linux transfers at most 2 GiB - 4 KiB per read call, so pieces from chunks larger than that take several.
constexpr uint64_t kMaxReadBytes = uint64_t{1} << 30;

StreamingOptions resolve(StreamingOptions options) {
  if (options.reader_threads == 0)
    options.reader_threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 4);
  if (options.staging_buffers == 0) options.staging_buffers = options.reader_threads + 2;
  if (options.chunk_bytes == 0) fail("streaming loader: chunk_bytes must be positive");
  return options;
}

int descriptor_of(const std::shared_ptr<const gguf::File>& file) {
  if (!file) fail("streaming loader: no file");
  if (!file->mapping()) fail("{}: streaming needs a file opened from disk", file->path());
  return file->mapping()->fd();
}

std::string describe(std::span<const Piece> pieces) {
  const std::string_view first = pieces.front().tensor->name;
  const std::string_view last = pieces.back().tensor->name;
  return first == last ? fmt::format("tensor '{}'", first) : fmt::format("tensors '{}' to '{}'", first, last);
}

// Calls into the sink; an exception from it becomes an rf::Error naming the file and what was loading.
template <typename Describe, typename Call>
void call_sink(const gguf::File& file, Describe&& describe_work, Call&& call) {
  try {
    call();
  } catch (const std::exception& e) {
    fail("{}: {}: {}", file.path(), describe_work(), e.what());
  }
}

void add_elapsed(std::atomic<int64_t>& total, std::chrono::steady_clock::time_point since) {
  const auto elapsed = std::chrono::steady_clock::now() - since;
  total.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count(), std::memory_order_relaxed);
}

double seconds(const std::atomic<int64_t>& nanoseconds) {
  return static_cast<double>(nanoseconds.load(std::memory_order_relaxed)) * 1e-9;
}

}  // namespace

StreamingLoader::StreamingLoader(std::shared_ptr<const gguf::File> file, std::vector<TensorGroup> groups, Sink& sink,
                                 StreamingOptions options)
    : file_(std::move(file)),
      groups_(std::move(groups)),
      sink_(sink),
      options_(resolve(options)),
      fd_(descriptor_of(file_)) {
  std::vector<std::vector<const gguf::TensorInfo*>> own_tensors(groups_.size());
  std::vector<std::vector<size_t>> shared_from(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const gguf::TensorInfo* tensor : groups_[g].tensors) {
      if (!tensor || file_->find_tensor(tensor->name) != tensor)
        fail("{}: group '{}' lists a tensor that is not one of the file's", file_->path(), groups_[g].name);
      const auto [owner, inserted] = owner_.emplace(tensor, g);
      if (inserted) own_tensors[g].push_back(tensor);
      else if (owner->second != g) shared_from[g].push_back(owner->second);
    }
  }
  plan_ = plan_chunks(own_tensors, options_.chunk_bytes);
  for (const PlannedChunk& chunk : plan_.chunks)
    staging_bytes_ = std::max(staging_bytes_, chunk.pieces.back().buffer_offset + chunk.pieces.back().bytes);

  group_states_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    GroupState& state = group_states_[g];
    state.next_chunk = plan_.first_chunk[g];
    state.unconsumed_chunks = plan_.first_chunk[g + 1] - plan_.first_chunk[g];
    state.own_chunks_consumed = state.unconsumed_chunks == 0;
    std::sort(shared_from[g].begin(), shared_from[g].end());
    shared_from[g].erase(std::unique(shared_from[g].begin(), shared_from[g].end()), shared_from[g].end());
    state.shared_from = std::move(shared_from[g]);
  }
  chunks_not_dispatched_ = plan_.chunks.size();
  if (!options_.progress_label.empty()) {
    uint64_t total = 0;
    for (const PlannedChunk& chunk : plan_.chunks)
      for (const Piece& piece : chunk.pieces) total += piece.bytes;
    progress_ = std::make_unique<Progress>(options_.progress_label, total, kProgressDelay);
  }
  staging_.resize(std::min(options_.staging_buffers, plan_.chunks.size()));
  buffer_consumed_.resize(staging_.size());

  // Sequential access doubles the kernel's readahead window on this file.
  ::posix_fadvise(fd_, static_cast<off_t>(file_->data_offset()), 0, POSIX_FADV_SEQUENTIAL);
  try {
    consumer_ = std::thread(&StreamingLoader::consumer_loop, this);
    for (size_t i = 0; i < options_.reader_threads; ++i) readers_.emplace_back(&StreamingLoader::reader_loop, this);
  } catch (...) {
    cancel();
    throw;
  }
}

StreamingLoader::~StreamingLoader() { cancel(); }

const TensorGroup& StreamingLoader::group(size_t index) const {
  check_group_index(index);
  return groups_[index];
}

size_t StreamingLoader::group_of(const gguf::TensorInfo& tensor) const {
  const auto found = owner_.find(&tensor);
  if (found == owner_.end()) fail("{}: no group of the loader lists tensor '{}'", file_->path(), tensor.name);
  return found->second;
}

bool StreamingLoader::is_loaded(size_t group) const {
  check_group_index(group);
  std::lock_guard lock(mutex_);
  return group_states_[group].loaded;
}

void StreamingLoader::prioritize(size_t group) {
  check_group_index(group);
  std::lock_guard lock(mutex_);
  GroupState& state = group_states_[group];
  if (state.loaded) return;
  // The group first, then what it shares, so that the shared groups rank lowest and are read first.
  state.rank = --last_rank_;
  for (size_t shared : state.shared_from) group_states_[shared].rank = --last_rank_;
  reader_wakeup_.notify_all();
}

void StreamingLoader::wait(size_t group) const {
  check_group_index(group);
  std::unique_lock lock(mutex_);
  loaded_.wait(lock, [&] { return group_states_[group].loaded || stopped(); });
  if (group_states_[group].loaded) return;
  if (error_) throw Error(*error_);
  fail("{}: loading was cancelled before group '{}' was loaded", file_->path(), groups_[group].name);
}

void StreamingLoader::request(size_t group) {
  prioritize(group);
  wait(group);
}

void StreamingLoader::wait_all() const {
  for (size_t g = 0; g < groups_.size(); ++g) wait(g);
}

void StreamingLoader::cancel() {
  std::lock_guard join_lock(join_mutex_);
  {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    if (!finished_) finished_ = Clock::now();
  }
  reader_wakeup_.notify_all();
  consumer_wakeup_.notify_all();
  loaded_.notify_all();
  for (std::thread& reader : readers_)
    if (reader.joinable()) reader.join();
  if (consumer_.joinable()) consumer_.join();
  release_staging();
}

StreamingStats StreamingLoader::stats() const {
  std::lock_guard lock(mutex_);
  StreamingStats result = counts_;
  result.reader_threads = options_.reader_threads;
  result.wall_seconds = std::chrono::duration<double>(finished_.value_or(Clock::now()) - start_).count();
  result.staging_seconds = seconds(phase_times_.staging);
  result.reader_idle_seconds = seconds(phase_times_.reader_idle);
  result.reuse_wait_seconds = seconds(phase_times_.reuse_wait);
  result.read_seconds = seconds(phase_times_.read);
  result.prepare_seconds = seconds(phase_times_.prepare);
  result.consume_seconds = seconds(phase_times_.consume);
  result.consumer_idle_seconds = seconds(phase_times_.consumer_idle);
  return result;
}

bool StreamingLoader::stopped() const { return cancelled_ || error_.has_value(); }

std::optional<size_t> StreamingLoader::next_chunk_to_read() const {
  std::optional<size_t> best_group;
  for (size_t g = 0; g < group_states_.size(); ++g) {
    const GroupState& state = group_states_[g];
    const bool eligible = options_.stream_all || state.rank < 0;
    if (!eligible || state.next_chunk == plan_.first_chunk[g + 1]) continue;
    if (!best_group || state.rank < group_states_[*best_group].rank) best_group = g;
  }
  if (!best_group) return std::nullopt;
  return group_states_[*best_group].next_chunk;
}

void StreamingLoader::reader_loop() {
  try {
    std::unique_lock lock(mutex_);
    while (true) {
      const auto idle_start = Clock::now();
      std::optional<size_t> chunk;
      reader_wakeup_.wait(lock, [&] {
        if (stopped() || chunks_not_dispatched_ == 0) return true;
        if (free_buffers_.empty() && buffers_allocated_ == staging_.size()) return false;
        chunk = next_chunk_to_read();
        return chunk.has_value();
      });
      add_elapsed(phase_times_.reader_idle, idle_start);
      if (stopped() || chunks_not_dispatched_ == 0) return;

      // A buffer the consumer gave back, else a new one: buffers are allocated as reading needs them, so the
      // first read starts after one allocation and small models use few buffers.
      const bool new_buffer = free_buffers_.empty();
      const size_t buffer = new_buffer ? buffers_allocated_++ : free_buffers_.back();
      if (!new_buffer) free_buffers_.pop_back();
      Dispatch dispatch{*chunk, buffer, staging_[buffer], next_sequence_++};
      ++group_states_[plan_.chunks[*chunk].group].next_chunk;
      if (--chunks_not_dispatched_ == 0) reader_wakeup_.notify_all();  // the idle readers can exit
      const bool sink_may_use_buffer = buffer_consumed_[buffer];
      const std::optional<size_t> upcoming = next_chunk_to_read();
      lock.unlock();

      if (upcoming) advise_will_need(*upcoming);
      if (new_buffer) {
        dispatch.staging = allocate_buffer(buffer);
      } else if (sink_may_use_buffer) {
        const auto start = Clock::now();
        call_sink(*file_, [&] { return fmt::format("waiting for staging buffer {}", buffer); },
                  [&] { sink_.wait_reusable(buffer); });
        add_elapsed(phase_times_.reuse_wait, start);
      }
      read_chunk(dispatch);
      const Chunk view = chunk_view(dispatch);
      const auto prepare_start = Clock::now();
      call_sink(*file_, [&] { return "preparing " + describe(view.pieces); }, [&] { sink_.prepare(view); });
      add_elapsed(phase_times_.prepare, prepare_start);

      lock.lock();
      read_chunks_.emplace(dispatch.sequence, dispatch);
      consumer_wakeup_.notify_one();
    }
  } catch (const std::exception& e) {
    fail_loading(e.what());
  }
}

std::span<uint8_t> StreamingLoader::allocate_buffer(size_t buffer) {
  const auto start = Clock::now();
  std::span<uint8_t> memory;
  call_sink(*file_, [&] { return fmt::format("allocating staging buffer {} of {} bytes", buffer, staging_bytes_); },
            [&] { memory = sink_.allocate_staging(buffer, staging_bytes_); });
  add_elapsed(phase_times_.staging, start);
  std::lock_guard lock(mutex_);
  staging_[buffer] = memory;
  return memory;
}

void StreamingLoader::advise_will_need(size_t chunk) const {
  for (const Piece& piece : plan_.chunks[chunk].pieces)
    ::posix_fadvise(fd_, static_cast<off_t>(file_offset(piece)), static_cast<off_t>(piece.bytes),
                    POSIX_FADV_WILLNEED);
}

uint64_t StreamingLoader::file_offset(const Piece& piece) const {
  return file_->data_offset() + piece.tensor->offset + piece.tensor_offset;
}

void StreamingLoader::read_chunk(const Dispatch& dispatch) {
  const auto start = Clock::now();
  for (const Piece& piece : plan_.chunks[dispatch.chunk].pieces) {
    uint8_t* destination = dispatch.staging.data() + piece.buffer_offset;
    const uint64_t begin = file_offset(piece);
    const uint64_t end = begin + piece.bytes;
    for (uint64_t at = begin; at < end;) {
      const ssize_t got = ::pread(fd_, destination + (at - begin), std::min(end - at, kMaxReadBytes),
                                  static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        fail("{}: cannot read tensor '{}' (file bytes {} to {}): {}", file_->path(), piece.tensor->name, at, end,
             std::generic_category().message(errno));
      if (got == 0)
        fail("{}: short read of tensor '{}': the file ends at byte {}, before the tensor's bytes {} to {} "
             "(truncated after it was opened?)",
             file_->path(), piece.tensor->name, at, begin, end);
      at += static_cast<uint64_t>(got);
    }
  }
  add_elapsed(phase_times_.read, start);
}

Chunk StreamingLoader::chunk_view(const Dispatch& dispatch) const {
  const PlannedChunk& chunk = plan_.chunks[dispatch.chunk];
  return {chunk.group, dispatch.buffer, dispatch.staging, chunk.pieces};
}

void StreamingLoader::consumer_loop() {
  try {
    std::unique_lock lock(mutex_);
    announce_loaded_groups(lock);  // groups without chunks of their own
    while (next_sequence_to_consume_ < plan_.chunks.size()) {
      const auto idle_start = Clock::now();
      consumer_wakeup_.wait(lock, [&] { return stopped() || read_chunks_.contains(next_sequence_to_consume_); });
      add_elapsed(phase_times_.consumer_idle, idle_start);
      if (stopped()) return;
      const Dispatch dispatch = read_chunks_.extract(next_sequence_to_consume_).mapped();
      lock.unlock();

      const Chunk view = chunk_view(dispatch);
      const auto consume_start = Clock::now();
      call_sink(*file_, [&] { return "consuming " + describe(view.pieces); }, [&] { sink_.consume(view); });
      add_elapsed(phase_times_.consume, consume_start);

      lock.lock();
      count_consumed(dispatch);
      if (next_sequence_to_consume_ == plan_.chunks.size()) {
        // Everything is read: give the (possibly pinned) staging memory back before the last groups announce.
        lock.unlock();
        release_staging();
        lock.lock();
        if (stopped()) return;
      }
      announce_loaded_groups(lock);
    }
  } catch (const std::exception& e) {
    fail_loading(e.what());
  }
}

void StreamingLoader::count_consumed(const Dispatch& dispatch) {
  const PlannedChunk& chunk = plan_.chunks[dispatch.chunk];
  uint64_t bytes = 0;
  for (const Piece& piece : chunk.pieces) {
    bytes += piece.bytes;
    if (piece.ends_tensor()) ++counts_.tensors;
  }
  counts_.bytes += bytes;
  if (progress_) progress_->add(bytes);
  ++counts_.chunks;
  ++next_sequence_to_consume_;
  buffer_consumed_[dispatch.buffer] = true;
  free_buffers_.push_back(dispatch.buffer);
  reader_wakeup_.notify_one();
  GroupState& state = group_states_[chunk.group];
  if (--state.unconsumed_chunks == 0) state.own_chunks_consumed = true;
}

void StreamingLoader::announce_loaded_groups(std::unique_lock<std::mutex>& lock) {
  for (size_t g = 0; g < group_states_.size(); ++g) {
    GroupState& state = group_states_[g];
    const bool ready = state.own_chunks_consumed &&
                       std::all_of(state.shared_from.begin(), state.shared_from.end(),
                                   [&](size_t shared) { return group_states_[shared].own_chunks_consumed; });
    if (state.loaded || !ready) continue;
    lock.unlock();
    const auto start = Clock::now();
    call_sink(*file_, [&] { return fmt::format("finishing group '{}'", groups_[g].name); },
              [&] { sink_.group_done(g); });
    add_elapsed(phase_times_.consume, start);
    lock.lock();
    state.loaded = true;
    const Clock::time_point now = Clock::now();
    if (counts_.groups++ == 0) counts_.first_group_seconds = std::chrono::duration<double>(now - start_).count();
    if (counts_.groups == groups_.size()) {
      finished_ = now;
      progress_.reset();  // ends the bar's line as soon as loading is done
    }
    loaded_.notify_all();
  }
}

void StreamingLoader::release_staging() {
  std::vector<std::span<uint8_t>> buffers;
  std::vector<bool> consumed;
  {
    std::lock_guard lock(mutex_);
    buffers.swap(staging_);
    consumed = buffer_consumed_;
  }
  for (size_t b = 0; b < buffers.size(); ++b) {
    if (buffers[b].empty()) continue;  // never allocated
    if (consumed[b]) {
      try {
        sink_.wait_reusable(b);
      } catch (const std::exception& e) {
        fail_loading(fmt::format("{}: waiting for staging buffer {}: {}", file_->path(), b, e.what()));
      }
    }
    sink_.release_staging(buffers[b]);
  }
}

void StreamingLoader::fail_loading(const std::string& message) {
  {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = message;
    if (!finished_) finished_ = Clock::now();
  }
  reader_wakeup_.notify_all();
  consumer_wakeup_.notify_all();
  loaded_.notify_all();
}

void StreamingLoader::check_group_index(size_t group) const {
  if (group >= groups_.size())
    fail("{}: group {} out of range (the loader has {} groups)", file_->path(), group, groups_.size());
}

}  // namespace rf::loader
