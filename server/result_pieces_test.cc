#include "server/result_pieces.h"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "proto/hidden_states.h"

namespace tophat {
namespace {

constexpr int64_t kHidden = 4;
constexpr int64_t kRowBytes = kHidden * 4;  // float32

ResultFormat Format(int64_t piece_rows) {
  return {.compute_dtype = at::kFloat,
          .compute_wire_dtype = v1::DTYPE_FLOAT32,
          .hidden_size = kHidden,
          .max_piece_bytes = piece_rows * kRowBytes};
}

ResultPart Part(int64_t rows, bool decode, bool chunk_done) {
  return {.session_id = 7,
          .sequence_number = 3,
          .first_position = 100,
          .num_rows = rows,
          .decode = decode,
          .chunk_done = chunk_done,
          .dtype = v1::DTYPE_FLOAT32,
          .queue_seconds = 0.25,
          .received_at_seconds = 10,
          .sent_at_seconds = 11,
          .compute_seconds = 0.5,
          .kv_length = 120};
}

at::Tensor Rows(int64_t n) { return at::arange(n * kHidden, at::kFloat).reshape({n, kHidden}); }

at::Tensor Unpack(const v1::CloudMessage& message) {
  absl::StatusOr<at::Tensor> rows = UnpackHiddenStates(message.result().states());
  REQUIRE(rows.ok());
  return rows->to(at::kFloat);
}

TEST_CASE("A prompt part leaves in pieces, the last one ending the chunk") {
  const at::Tensor rows = Rows(7);
  std::vector<v1::CloudMessage> messages;
  BuildResultPieces(Format(3), Part(7, /*decode=*/false, /*chunk_done=*/true),
                    static_cast<const uint8_t*>(rows.data_ptr()), messages);
  // 7 rows in pieces of 3: 3, 3, 1, at positions 100, 103, 106.
  REQUIRE(messages.size() == 3);
  const int64_t sizes[] = {3, 3, 1};
  int64_t row = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const v1::ForwardResult& result = messages[i].result();
    CHECK(result.session_id() == 7);
    CHECK(result.sequence_number() == 3);
    CHECK(result.first_position() == 100 + row);
    CHECK(result.phase() == v1::PHASE_PREFILL);
    CHECK(result.queue_seconds() == 0.25);
    CHECK(result.received_at_seconds() == 10);
    CHECK(result.sent_at_seconds() == 11);
    CHECK(result.compute_seconds() == 0.5);
    CHECK(result.kv_length() == 120);
    CHECK(result.chunk_done() == (i == 2));
    CHECK(result.states().num_positions() == static_cast<uint32_t>(sizes[i]));
    CHECK(at::equal(Unpack(messages[i]), rows.narrow(0, row, sizes[i])));
    row += sizes[i];
  }

  // A part that does not end its chunk (the chunk goes on in a later step): none says so.
  BuildResultPieces(Format(3), Part(7, false, /*chunk_done=*/false),
                    static_cast<const uint8_t*>(rows.data_ptr()), messages);
  REQUIRE(messages.size() == 3);  // cleared, not appended to
  for (const v1::CloudMessage& message : messages) CHECK_FALSE(message.result().chunk_done());

  // Pieces smaller than a row still carry one row each.
  ResultFormat tiny = Format(1);
  tiny.max_piece_bytes = 1;
  BuildResultPieces(tiny, Part(2, false, true), static_cast<const uint8_t*>(rows.data_ptr()),
                    messages);
  CHECK(messages.size() == 2);
}

TEST_CASE("A decode part leaves whole, however many rows it verifies") {
  const at::Tensor rows = Rows(5);
  std::vector<v1::CloudMessage> messages;
  BuildResultPieces(Format(2), Part(5, /*decode=*/true, /*chunk_done=*/true),
                    static_cast<const uint8_t*>(rows.data_ptr()), messages);
  REQUIRE(messages.size() == 1);
  CHECK(messages[0].result().phase() == v1::PHASE_DECODE);
  CHECK(messages[0].result().chunk_done());
  CHECK(at::equal(Unpack(messages[0]), rows));
}

TEST_CASE("Rows the session's dtype cannot carry go in the compute dtype, piece by piece") {
  // Pieces of 2 rows in float16; the second piece holds a value beyond float16's range.
  at::Tensor rows = Rows(4) / 8;
  rows[3][1] = 1e6;
  ResultPart part = Part(4, false, true);
  part.dtype = v1::DTYPE_FLOAT16;
  std::vector<v1::CloudMessage> messages;
  BuildResultPieces(Format(2), part, static_cast<const uint8_t*>(rows.data_ptr()), messages);
  REQUIRE(messages.size() == 2);
  CHECK(messages[0].result().states().dtype() == v1::DTYPE_FLOAT16);
  CHECK(messages[1].result().states().dtype() == v1::DTYPE_FLOAT32);
  // Multiples of 1/8 up to 2 are exact in float16.
  CHECK(at::equal(Unpack(messages[0]), rows.narrow(0, 0, 2)));
  CHECK(at::equal(Unpack(messages[1]), rows.narrow(0, 2, 2)));
}

TEST_CASE("Megabytes of pieces filled across threads hold the rows in order") {
  // 2,560 rows of 256 float32 (2.5 MiB, past host_copy's parallel threshold) in pieces of 8
  // rows: 320 pieces.
  ResultFormat format = Format(8);
  format.hidden_size = 256;
  format.max_piece_bytes = 8 * 256 * 4;
  const at::Tensor rows = at::randn({2560, 256});
  std::vector<v1::CloudMessage> messages;
  BuildResultPieces(format, Part(2560, false, true), static_cast<const uint8_t*>(rows.data_ptr()),
                    messages);
  REQUIRE(messages.size() == 320);
  for (size_t i = 0; i < messages.size(); ++i) {
    CHECK(messages[i].result().first_position() == 100 + 8 * i);
    CHECK(at::equal(Unpack(messages[i]), rows.narrow(0, static_cast<int64_t>(8 * i), 8)));
  }
}

}  // namespace
}  // namespace tophat
