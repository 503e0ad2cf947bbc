#include "server/pipeline/stage_step.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tophat::pipeline {

at::Tensor EncodeHeader(const StepHeader& header) {
  at::Tensor out = at::empty({kHeaderElements}, at::kLong);
  int64_t* data = out.data_ptr<int64_t>();
  data[0] = static_cast<int64_t>(header.op);
  data[1] = header.step;
  data[2] = header.total_tokens;
  data[3] = header.address_length;
  return out;
}

absl::StatusOr<StepHeader> DecodeHeader(const at::Tensor& encoded) {
  if (encoded.scalar_type() != at::kLong || encoded.numel() != kHeaderElements) {
    return absl::InvalidArgumentError("pipeline step header: not 4 int64 values");
  }
  const int64_t* data = encoded.data_ptr<int64_t>();
  StepHeader header{.op = static_cast<StageOp>(data[0]),
                    .step = data[1],
                    .total_tokens = data[2],
                    .address_length = data[3]};
  if (header.op != StageOp::kForward && header.op != StageOp::kShutdown) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline step header: unknown op ", data[0]));
  }
  if (header.total_tokens < 0 || header.address_length < 0) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline step ", header.step,
                                                   ": negative sizes in the header"));
  }
  return header;
}

void EncodeAddresses(std::span<const ChunkAddress> chunks, std::vector<int64_t>& out) {
  out.clear();
  out.push_back(static_cast<int64_t>(chunks.size()));
  for (const ChunkAddress& chunk : chunks) {
    out.push_back(chunk.past);
    out.push_back(chunk.num_tokens);
    out.push_back(static_cast<int64_t>(chunk.blocks.size()));
    out.insert(out.end(), chunk.blocks.begin(), chunk.blocks.end());
  }
}

absl::StatusOr<std::vector<DecodedChunk>> DecodeAddresses(std::span<const int64_t> encoded,
                                                          int64_t total_tokens,
                                                          int64_t num_blocks,
                                                          int64_t block_size) {
  auto malformed = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline chunk addresses: ", what));
  };
  size_t at = 0;
  auto next = [&](int64_t* value) {
    if (at >= encoded.size()) return false;
    *value = encoded[at++];
    return true;
  };
  int64_t count = 0;
  if (!next(&count) || count < 0) return malformed("no chunk count");
  std::vector<DecodedChunk> chunks;
  chunks.reserve(static_cast<size_t>(count));
  int64_t tokens = 0;
  for (int64_t c = 0; c < count; ++c) {
    DecodedChunk chunk;
    int64_t blocks = 0;
    if (!next(&chunk.past) || !next(&chunk.num_tokens) || !next(&blocks)) {
      return malformed(absl::StrCat("chunk ", c, " is cut short"));
    }
    if (chunk.past < 0 || chunk.num_tokens < 0 || blocks < 0 ||
        blocks * block_size < chunk.past + chunk.num_tokens) {
      return malformed(absl::StrCat("chunk ", c, ": ", blocks, " blocks of ", block_size,
                                    " positions cannot hold ", chunk.past, " + ",
                                    chunk.num_tokens));
    }
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t id = 0;
      if (!next(&id)) return malformed(absl::StrCat("chunk ", c, ": block table cut short"));
      if (id < 0 || id >= num_blocks) {
        return malformed(absl::StrCat("chunk ", c, ": block id ", id, " outside the pool of ",
                                      num_blocks));
      }
      chunk.blocks.push_back(static_cast<int32_t>(id));
    }
    tokens += chunk.num_tokens;
    chunks.push_back(std::move(chunk));
  }
  if (at != encoded.size()) return malformed("trailing values");
  if (tokens != total_tokens) {
    return malformed(absl::StrCat("chunks hold ", tokens, " tokens, the header says ",
                                  total_tokens));
  }
  return chunks;
}

}  // namespace tophat::pipeline
