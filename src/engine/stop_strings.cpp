#include "engine/stop_strings.h"

#include <algorithm>
#include <utility>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace rf::engine {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)), nodes_(1) {
  for (size_t i = 0; i < stops_.size(); ++i) {
    const std::string& stop = stops_[i];
    if (stop.empty()) fail("stop string {} is empty", i);
    // Valid UTF-8 on both sides means every match starts at a character boundary of the text.
    if (utf8::sanitize(stop) != stop) fail("stop string {} is not valid UTF-8", i);
    int32_t node = 0;
    for (const char c : stop) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        Node& parent = nodes_[static_cast<size_t>(node)];
        parent.children.insert(std::lower_bound(parent.children.begin(), parent.children.end(),
                                                std::pair{byte, int32_t{-1}}),
                               std::pair{byte, next});
        const int32_t depth = parent.depth + 1;
        nodes_.emplace_back().depth = depth;
      }
      node = next;
    }
    Node& last = nodes_[static_cast<size_t>(node)];
    if (last.stop < 0) last.stop = static_cast<int32_t>(i);  // a repeated stop string keeps its first index
  }

  // Breadth first, so that a node's fallback (shorter) is complete before the node's children need it.
  std::vector<int32_t> queue = {0};
  for (size_t next = 0; next < queue.size(); ++next) {
    const int32_t parent = queue[next];
    for (const auto& [byte, node] : nodes_[static_cast<size_t>(parent)].children) {
      Node& n = nodes_[static_cast<size_t>(node)];
      n.fallback = parent == 0 ? 0 : step(nodes_[static_cast<size_t>(parent)].fallback, byte);
      // A stop string ending at this prefix is the prefix itself or ends its fallback, which is shorter.
      if (n.stop < 0) n.stop = nodes_[static_cast<size_t>(n.fallback)].stop;
      queue.push_back(node);
    }
  }
}

int32_t StopStrings::child(int32_t node, uint8_t byte) const {
  const auto& children = nodes_[static_cast<size_t>(node)].children;
  const auto it = std::lower_bound(children.begin(), children.end(), std::pair{byte, int32_t{-1}});
  return it != children.end() && it->first == byte ? it->second : -1;
}

int32_t StopStrings::step(int32_t node, uint8_t byte) const {
  // Each fallback shortens the prefix, and each byte lengthens it by one at most: amortized constant time.
  for (;;) {
    const int32_t next = child(node, byte);
    if (next >= 0) return next;
    if (node == 0) return 0;
    node = nodes_[static_cast<size_t>(node)].fallback;
  }
}

std::string StopStrings::push(std::string_view piece) {
  if (matched_) return {};
  held_ += piece;
  for (size_t i = held_.size() - piece.size(); i < held_.size(); ++i) {
    state_ = step(state_, static_cast<uint8_t>(held_[i]));
    const int32_t stop = nodes_[static_cast<size_t>(state_)].stop;
    if (stop >= 0) {
      matched_ = static_cast<size_t>(stop);
      std::string text = held_.substr(0, i + 1 - stops_[*matched_].size());
      held_.clear();
      state_ = 0;
      return text;
    }
  }
  const size_t safe = held_.size() - static_cast<size_t>(nodes_[static_cast<size_t>(state_)].depth);
  std::string text = held_.substr(0, safe);
  held_.erase(0, safe);
  return text;
}

std::string StopStrings::flush() {
  state_ = 0;
  return std::exchange(held_, {});
}

}  // namespace rf::engine
