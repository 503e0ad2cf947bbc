#include "proto/hidden_states.h"

#include <malloc.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tophat {

absl::StatusOr<v1::DType> ToProtoDType(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return v1::DTYPE_FLOAT32;
    case at::kHalf:
      return v1::DTYPE_FLOAT16;
    case at::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("hidden states cannot travel as ", c10::toString(dtype)));
  }
}

absl::StatusOr<at::ScalarType> FromProtoDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return at::kFloat;
    case v1::DTYPE_FLOAT16:
      return at::kHalf;
    case v1::DTYPE_BFLOAT16:
      return at::kBFloat16;
    case v1::DTYPE_UNSPECIFIED:
    case v1::DType_INT_MIN_SENTINEL_DO_NOT_USE_:
    case v1::DType_INT_MAX_SENTINEL_DO_NOT_USE_:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("states.dtype: unsupported value ", static_cast<int>(dtype)));
}

int64_t ElementBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_UNSPECIFIED:
    case v1::DType_INT_MIN_SENTINEL_DO_NOT_USE_:
    case v1::DType_INT_MAX_SENTINEL_DO_NOT_USE_:
      break;
  }
  return 0;
}

absl::Status PackHiddenStates(const at::Tensor& hidden, v1::HiddenStates* out) {
  if (hidden.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden states must be [positions, hidden], got ", hidden.dim(), " dims"));
  }
  auto dtype = ToProtoDType(hidden.scalar_type());
  if (!dtype.ok()) return dtype.status();
  const at::Tensor cpu = hidden.to(at::kCPU).contiguous();
  out->set_dtype(*dtype);
  out->set_num_positions(static_cast<uint32_t>(cpu.size(0)));
  out->set_hidden_size(static_cast<uint32_t>(cpu.size(1)));
  const size_t bytes = cpu.numel() * cpu.element_size();
  std::string* data = out->mutable_data();
  data->resize(bytes);
  if (bytes > 0) std::memcpy(data->data(), cpu.data_ptr(), bytes);
  return absl::OkStatus();
}

namespace {

// A dtype as errors name it: its enum name, or the number a peer sent that this build's enum
// does not know (proto3 keeps unknown values; DType_Name gives "" for them).
std::string DTypeLabel(v1::DType dtype) {
  const std::string& name = v1::DType_Name(dtype);
  if (!name.empty()) return name;
  return absl::StrCat("(unknown value ", static_cast<int>(dtype), ")");
}

}  // namespace

absl::Status ValidateHiddenStates(const v1::HiddenStates& states, v1::DType expected_dtype,
                                  int64_t expected_hidden_size, int64_t max_positions) {
  // Found by fuzz/hidden_states_fuzzer: an end that expects no particular dtype must still
  // refuse one with no element size, which UnpackHiddenStates cannot unpack.
  if (ElementBytes(states.dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("states.dtype ", DTypeLabel(states.dtype()), " is not a hidden-state dtype"));
  }
  if (states.dtype() != expected_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "states.dtype is ", DTypeLabel(states.dtype()), ", this end expects ",
        DTypeLabel(expected_dtype)));
  }
  if (states.hidden_size() != expected_hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("states.hidden_size is ", states.hidden_size(),
                                                   ", the model's hidden size is ",
                                                   expected_hidden_size));
  }
  if (states.num_positions() == 0) {
    return absl::InvalidArgumentError("states.num_positions is 0");
  }
  if (states.num_positions() > max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("states.num_positions is ",
                                                   states.num_positions(), ", at most ",
                                                   max_positions, " are accepted per chunk"));
  }
  const int64_t expected_bytes = static_cast<int64_t>(states.num_positions()) *
                                 states.hidden_size() * ElementBytes(states.dtype());
  if (static_cast<int64_t>(states.data().size()) != expected_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "states.data holds ", states.data().size(), " bytes; ", states.num_positions(), " x ",
        states.hidden_size(), " ", DTypeLabel(states.dtype()), " needs ", expected_bytes));
  }
  return absl::OkStatus();
}

void ConfigureAllocatorForPayloads() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

absl::StatusOr<at::Tensor> UnpackHiddenStates(const v1::HiddenStates& states) {
  auto dtype = FromProtoDType(states.dtype());
  if (!dtype.ok()) return dtype.status();
  const int64_t bytes = static_cast<int64_t>(states.num_positions()) * states.hidden_size() *
                        ElementBytes(states.dtype());
  if (static_cast<int64_t>(states.data().size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("states.data holds ", states.data().size(),
                                                   " bytes, expected ", bytes));
  }
  at::Tensor out = at::empty({states.num_positions(), states.hidden_size()},
                             at::TensorOptions().dtype(*dtype));
  if (bytes > 0) std::memcpy(out.data_ptr(), states.data().data(), bytes);
  return out;
}

}  // namespace tophat
