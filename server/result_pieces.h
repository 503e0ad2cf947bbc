// A step's rows for one session, as the ForwardResult messages that carry them back to its
// agent: a prompt chunk's in pieces of at most max_piece_bytes (at least one position each),
// so that a decode result queued behind it waits for one piece on the downlink rather than
// the whole chunk; a decode chunk's whole. The engine's result encoding, apart from the step.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "tophat/v1/cloud.pb.h"

namespace tophat {

// How this cloud's rows are laid out and cut.
struct ResultFormat {
  at::ScalarType compute_dtype = at::kFloat;         // the rows' element type
  v1::DType compute_wire_dtype = v1::DTYPE_FLOAT32;  // the same, as the wire names it
  int64_t hidden_size = 0;
  int64_t max_piece_bytes = 64 << 10;  // EngineOptions::max_result_piece_bytes
};

// One session's part of a step: what every one of its messages says besides its rows.
struct ResultPart {
  uint64_t session_id = 0;
  uint64_t sequence_number = 0;
  int64_t first_position = 0;  // of the part's first row
  int64_t num_rows = 0;
  bool decode = false;      // PHASE_DECODE, in one message; else PHASE_PREFILL, in pieces
  bool chunk_done = false;  // the part ends its chunk: its last message says so
  v1::DType dtype = v1::DTYPE_FLOAT32;  // the session's result dtype
  double queue_seconds = 0;
  double received_at_seconds = 0;
  double sent_at_seconds = 0;
  double compute_seconds = 0;
  int64_t kv_length = 0;
};

// Writes `part`'s messages, in order, into `messages` (cleared; the vector's capacity is
// reused). `rows` holds the part's num_rows rows in the compute dtype. Rows are encoded in
// the session's dtype; a piece whose values that dtype cannot carry (beyond float16's
// range, or not finite for int8) goes in the compute dtype, which agents accept too. Pieces
// of a prompt chunk adding up to megabytes are filled across LibTorch's intra-op threads
// (kernels/host_copy.h), their bytes reserved on the calling thread first.
void BuildResultPieces(const ResultFormat& format, const ResultPart& part, const uint8_t* rows,
                       std::vector<v1::CloudMessage>& messages);

}  // namespace tophat
