#include "loader/chunk_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "loader/tensor_groups.h"
#include "test_paths.h"
#include "util/error.h"

namespace rf::loader {
namespace {

using Groups = std::vector<std::vector<const gguf::TensorInfo*>>;

std::unique_ptr<gguf::File> open_model(const std::string& name) {
  return gguf::File::open(test::shared_path("models/" + name + ".gguf"));
}

Groups tensors_by_block(const gguf::File& file) {
  Groups groups;
  for (const TensorGroup& group : file_order_groups(file)) groups.push_back(group.tensors);
  return groups;
}

// The plan's invariants: chunks fit, pieces are aligned, disjoint and whole rows (or whole blocks), chunks
// never mix groups, and each group's tensors are tiled in order.
void expect_valid_plan(const ChunkPlan& plan, const Groups& groups, uint64_t chunk_bytes) {
  ASSERT_EQ(plan.first_chunk.size(), groups.size() + 1);
  EXPECT_EQ(plan.first_chunk.back(), plan.chunks.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<const Piece*> pieces;
    for (size_t c = plan.first_chunk[g]; c < plan.first_chunk[g + 1]; ++c) {
      const PlannedChunk& chunk = plan.chunks[c];
      EXPECT_EQ(chunk.group, g);
      ASSERT_FALSE(chunk.pieces.empty());
      uint64_t end = 0;
      for (const Piece& piece : chunk.pieces) {
        EXPECT_EQ(piece.buffer_offset % kPieceAlignment, 0u);
        EXPECT_GE(piece.buffer_offset, end) << "pieces overlap in the buffer";
        end = piece.buffer_offset + piece.bytes;
        const uint64_t row = piece.tensor->bytes / piece.tensor->rows();
        const uint64_t unit = row <= chunk_bytes ? row : piece.tensor->type_info->block_bytes;
        EXPECT_EQ(piece.tensor_offset % unit, 0u) << piece.tensor->name;
        EXPECT_EQ(piece.bytes % unit, 0u) << piece.tensor->name;
        pieces.push_back(&piece);
      }
      EXPECT_LE(end, chunk_bytes);
    }
    size_t next = 0;
    for (const gguf::TensorInfo* tensor : groups[g]) {
      uint64_t covered = 0;
      while (next < pieces.size() && pieces[next]->tensor == tensor) {
        EXPECT_EQ(pieces[next]->tensor_offset, covered);
        covered += pieces[next++]->bytes;
      }
      EXPECT_EQ(covered, tensor->bytes) << tensor->name;
    }
    EXPECT_EQ(next, pieces.size());
  }
}

TEST(ChunkPlanTest, EveryModelAndChunkSizeGivesAValidPlan) {
  for (const std::string model : {"stories260K", "TinyStories-656K-Q8_0", "llama-2-tiny-random",
                                  "synth-tiny256-F32", "synth-tiny256-Q4_K_M", "synth-tiny256-IQ4_XS"}) {
    const auto file = open_model(model);
    const Groups groups = tensors_by_block(*file);
    for (uint64_t chunk_bytes : {uint64_t{1000}, uint64_t{4096}, uint64_t{1} << 20, uint64_t{64} << 20}) {
      SCOPED_TRACE(model + ", chunk " + std::to_string(chunk_bytes));
      expect_valid_plan(plan_chunks(groups, chunk_bytes), groups, chunk_bytes);
    }
  }
}

TEST(ChunkPlanTest, SmallTensorsShareAChunk) {
  const auto file = open_model("stories260K");
  const Groups groups = tensors_by_block(*file);
  const ChunkPlan plan = plan_chunks(groups, uint64_t{1} << 20);
  // Every group of this 1 MB model fits one 1 MiB chunk.
  EXPECT_EQ(plan.chunks.size(), groups.size());
  EXPECT_EQ(plan.chunks[1].pieces.size(), groups[1].size());
}

TEST(ChunkPlanTest, LargeTensorsSplitAtRows) {
  const auto file = open_model("stories260K");
  const gguf::TensorInfo& embeddings = file->tensor("token_embd.weight");  // 512 rows of 256 bytes
  const ChunkPlan plan = plan_chunks({{&embeddings}}, 1000);
  ASSERT_EQ(plan.chunks.size(), 512u / 3 + 1);
  EXPECT_EQ(plan.chunks[0].pieces[0].bytes, 768u);
  EXPECT_EQ(plan.chunks.back().pieces[0].bytes, 256u * (512 % 3));
}

TEST(ChunkPlanTest, EmptyGroupsHaveNoChunks) {
  const auto file = open_model("stories260K");
  const ChunkPlan plan = plan_chunks({{}, {&file->tensor("output_norm.weight")}, {}}, 4096);
  EXPECT_EQ(plan.first_chunk, (std::vector<size_t>{0, 0, 1, 1}));
}

TEST(ChunkPlanTest, ChunkSmallerThanABlockIsAnError) {
  const auto file = open_model("TinyStories-656K-Q8_0");
  const gguf::TensorInfo& embeddings = file->tensor("token_embd.weight");  // Q8_0: 34-byte blocks
  try {
    plan_chunks({{&embeddings}}, 16);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token_embd.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rf::loader
