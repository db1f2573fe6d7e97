// index_of_largest, the greedy choice that the sampler, the CPU's forward pass and the GPU's argmax kernel share: the
// first of equal largest values, as std::max_element finds it.
#include "util/argmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace rf {
namespace {

int32_t index_of_largest_in(const std::vector<float>& values) { return index_of_largest(values); }

TEST(IndexOfLargest, TakesTheFirstOfEqualLargestValues) {
  EXPECT_EQ(index_of_largest_in({1.0f, 3.0f, 2.0f, 3.0f, 3.0f}), 1);
  EXPECT_EQ(index_of_largest_in({-2.0f, -2.0f}), 0);
  // -0 equals +0: the first stays.
  EXPECT_EQ(index_of_largest_in({-0.0f, 0.0f}), 0);
  const float infinity = std::numeric_limits<float>::infinity();
  EXPECT_EQ(index_of_largest_in({-infinity, -infinity, -infinity}), 0);
  EXPECT_EQ(index_of_largest_in({1.0f, infinity, infinity}), 1);
}

TEST(IndexOfLargest, TakesALaterValueOnlyWhereItIsGreater) {
  EXPECT_EQ(index_of_largest_in({7.0f}), 0);
  EXPECT_EQ(index_of_largest_in({0.0f, 1.0f, 2.0f, 5.0f}), 3);
  EXPECT_EQ(index_of_largest_in({-1.0f, -0.5f, -3.0f}), 1);
  EXPECT_EQ(index_of_largest_in({2.0f, std::nextafter(2.0f, 3.0f), 2.0f}), 1);
}

}  // namespace
}  // namespace rf
