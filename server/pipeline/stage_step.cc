#include "server/pipeline/stage_step.h"

#include <algorithm>

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

void EncodeAddresses(std::span<const ChunkAddress> chunks, std::span<const BlockCopy> copies,
                     std::vector<int64_t>& out) {
  out.clear();
  out.push_back(static_cast<int64_t>(chunks.size()));
  for (const ChunkAddress& chunk : chunks) {
    out.push_back(chunk.past);
    out.push_back(chunk.num_tokens);
    out.push_back(static_cast<int64_t>(chunk.blocks.size()));
    out.insert(out.end(), chunk.blocks.begin(), chunk.blocks.end());
  }
  out.push_back(static_cast<int64_t>(copies.size()));
  for (const BlockCopy& copy : copies) {
    out.push_back(copy.from);
    out.push_back(copy.to);
  }
}

absl::StatusOr<DecodedStep> DecodeAddresses(std::span<const int64_t> encoded,
                                            int64_t total_tokens, int64_t num_blocks,
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
  DecodedStep step;
  std::vector<DecodedChunk>& chunks = step.chunks;
  chunks.reserve(static_cast<size_t>(std::min<int64_t>(count, encoded.size())));
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
  int64_t copies = 0;
  if (!next(&copies) || copies < 0) return malformed("no block copy count");
  for (int64_t c = 0; c < copies; ++c) {
    int64_t from = 0;
    int64_t to = 0;
    if (!next(&from) || !next(&to)) return malformed(absl::StrCat("block copy ", c, " is cut short"));
    if (from < 0 || from >= num_blocks || to < 0 || to >= num_blocks) {
      return malformed(absl::StrCat("block copy ", c, ": ", from, " -> ", to,
                                    " outside the pool of ", num_blocks));
    }
    step.copy_from.push_back(static_cast<int32_t>(from));
    step.copy_to.push_back(static_cast<int32_t>(to));
  }
  if (at != encoded.size()) return malformed("trailing values");
  if (tokens != total_tokens) {
    return malformed(absl::StrCat("chunks hold ", tokens, " tokens, the header says ",
                                  total_tokens));
  }
  return step;
}

}  // namespace tophat::pipeline
