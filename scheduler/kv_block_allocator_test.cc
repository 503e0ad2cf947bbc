#include "scheduler/kv_block_allocator.h"

#include <set>

#include <catch2/catch.hpp>

namespace tophat {
namespace {

TEST_CASE("KvBlockAllocator reserves, allocates within reservations and frees") {
  KvBlockAllocator allocator(/*num_blocks=*/8, /*block_size=*/16);
  CHECK(allocator.BlocksFor(0) == 0);
  CHECK(allocator.BlocksFor(1) == 1);
  CHECK(allocator.BlocksFor(16) == 1);
  CHECK(allocator.BlocksFor(17) == 2);

  REQUIRE(allocator.Reserve(5));
  CHECK(allocator.num_unreserved() == 3);
  CHECK_FALSE(allocator.Reserve(4));  // only 3 left unpromised
  CHECK(allocator.num_unreserved() == 3);

  std::set<int32_t> ids;
  for (int i = 0; i < 5; ++i) {
    auto id = allocator.AllocateReserved();
    REQUIRE(id.has_value());
    CHECK(*id >= 0);
    CHECK(*id < 8);
    ids.insert(*id);
  }
  CHECK(ids.size() == 5);
  CHECK(allocator.num_allocated() == 5);
  CHECK(allocator.usage() == Approx(5.0 / 8));
  CHECK_FALSE(allocator.AllocateReserved().has_value());  // reservation used up

  for (int32_t id : ids) allocator.Free(id);
  CHECK(allocator.num_allocated() == 0);
  CHECK(allocator.num_unreserved() == 8);
}

TEST_CASE("KvBlockAllocator returns unused reservations") {
  KvBlockAllocator allocator(4, 4);
  REQUIRE(allocator.Reserve(4));
  auto id = allocator.AllocateReserved();
  REQUIRE(id.has_value());
  allocator.Unreserve(3);
  CHECK(allocator.num_unreserved() == 3);
  CHECK(allocator.Reserve(3));
  CHECK_FALSE(allocator.Reserve(1));
  allocator.Free(*id);
  CHECK(allocator.Reserve(1));
}

}  // namespace
}  // namespace tophat
