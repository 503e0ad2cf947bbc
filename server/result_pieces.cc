#include "server/result_pieces.h"

#include <algorithm>

#include "kernels/host_copy.h"
#include "proto/hidden_states.h"

namespace tophat {

namespace {

// Rows a piece of `part` holds: a decode part's all, a prompt part's what fits in
// max_piece_bytes (at least one).
int64_t PieceRows(const ResultFormat& format, const ResultPart& part, int64_t row_bytes) {
  if (part.decode) return std::max<int64_t>(1, part.num_rows);
  return std::max<int64_t>(1, format.max_piece_bytes / std::max<int64_t>(1, row_bytes));
}

}  // namespace

void BuildResultPieces(const ResultFormat& format, const ResultPart& part, const uint8_t* rows,
                       std::vector<v1::CloudMessage>& messages) {
  const int64_t row_bytes = format.hidden_size * c10::elementSize(format.compute_dtype);
  const int64_t piece_rows = PieceRows(format, part, row_bytes);
  const bool same_dtype = part.dtype == format.compute_wire_dtype;
  // Each piece's message first, its states' bytes reserved here (so that the threads below
  // allocate nothing); then the states, spread over threads for a prompt chunk's pieces.
  messages.clear();
  messages.reserve(static_cast<size_t>((part.num_rows + piece_rows - 1) / piece_rows));
  for (int64_t piece = 0; piece < part.num_rows; piece += piece_rows) {
    const int64_t piece_size = std::min(piece_rows, part.num_rows - piece);
    v1::ForwardResult* result = messages.emplace_back().mutable_result();
    result->set_session_id(part.session_id);
    result->set_sequence_number(part.sequence_number);
    result->set_first_position(static_cast<uint32_t>(part.first_position + piece));
    result->set_queue_seconds(part.queue_seconds);
    result->set_received_at_seconds(part.received_at_seconds);
    result->set_sent_at_seconds(part.sent_at_seconds);
    result->set_phase(part.decode ? v1::PHASE_DECODE : v1::PHASE_PREFILL);
    result->set_compute_seconds(part.compute_seconds);
    result->set_kv_length(static_cast<uint32_t>(part.kv_length));
    result->set_chunk_done(part.chunk_done && piece + piece_size == part.num_rows);
    if (same_dtype) result->mutable_states()->mutable_data()->reserve(piece_size * row_bytes);
  }
  auto fill_piece = [&](int64_t i) {
    const int64_t piece = i * piece_rows;
    const int64_t piece_size = std::min(piece_rows, part.num_rows - piece);
    const uint8_t* piece_bytes = rows + piece * row_bytes;
    v1::HiddenStates* states = messages[static_cast<size_t>(i)].mutable_result()->mutable_states();
    if (same_dtype) {
      states->set_dtype(format.compute_wire_dtype);
      states->set_num_positions(static_cast<uint32_t>(piece_size));
      states->set_hidden_size(static_cast<uint32_t>(format.hidden_size));
      states->mutable_data()->append(reinterpret_cast<const char*>(piece_bytes),
                                     piece_size * row_bytes);
    } else if (!EncodeHiddenStates(piece_bytes, format.compute_dtype, piece_size,
                                   format.hidden_size, part.dtype, states)
                    .ok()) {
      EncodeHiddenStates(piece_bytes, format.compute_dtype, piece_size, format.hidden_size,
                         format.compute_wire_dtype, states)
          .IgnoreError();
    }
  };
  kernels::ForEachHostCopy(static_cast<int64_t>(messages.size()), piece_rows * row_bytes,
                           fill_piece);
}

}  // namespace tophat
