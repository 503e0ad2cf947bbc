#include "models/formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace tophat {
namespace {

// Debian builds Abseil with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0),
// which std::string_view does not convert to implicitly, so StrCat needs this bridge.
// The format stores lengths and data little-endian; reading them with memcpy is only right on
// a little-endian host, which is every platform this project targets.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

// Real headers are a few MB even for models with thousands of tensors; anything far larger
// is corruption, and refusing it keeps a bad length from making us parse gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull * 1024 * 1024;
constexpr char kMetadataKey[] = "__metadata__";

std::string ErrnoMessage(int err) {
  return std::error_code(err, std::generic_category()).message();
}

std::optional<SafetensorsDType> ParseDType(std::string_view name) {
  static constexpr SafetensorsDType kAll[] = {SafetensorsDType::kF64, SafetensorsDType::kF32,
                                              SafetensorsDType::kF16, SafetensorsDType::kBF16,
                                              SafetensorsDType::kI64, SafetensorsDType::kI32,
                                              SafetensorsDType::kI16, SafetensorsDType::kI8,
                                              SafetensorsDType::kU8,  SafetensorsDType::kBool};
  for (SafetensorsDType dtype : kAll) {
    if (DTypeName(dtype) == name) return dtype;
  }
  return std::nullopt;
}

std::optional<at::ScalarType> ToScalarType(SafetensorsDType dtype) {
  switch (dtype) {
    case SafetensorsDType::kF32:
      return at::kFloat;
    case SafetensorsDType::kF16:
      return at::kHalf;
    case SafetensorsDType::kBF16:
      return at::kBFloat16;
    case SafetensorsDType::kI8:  // int8 weights (tophat split --device-weights int8)
      return at::kChar;
    case SafetensorsDType::kU8:  // packed values and their scales (gpt-oss's MXFP4 experts)
      return at::kByte;
    default:
      return std::nullopt;
  }
}

std::optional<SafetensorsDType> FromScalarType(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return SafetensorsDType::kF32;
    case at::kHalf:
      return SafetensorsDType::kF16;
    case at::kBFloat16:
      return SafetensorsDType::kBF16;
    case at::kChar:
      return SafetensorsDType::kI8;
    case at::kByte:
      return SafetensorsDType::kU8;
    default:
      return std::nullopt;
  }
}

// Reads a JSON integer as a non-negative int64/uint64. nlohmann stores non-negative literals
// as number_unsigned and negative ones as number_integer, so the sign is visible in the type.
std::optional<uint64_t> AsUnsigned(const nlohmann::json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  return value.get<uint64_t>();
}

// Parses and checks one tensor entry of the header. `data_size` is the length of the data
// section, against which offsets are bounds-checked.
absl::StatusOr<SafetensorsTensorInfo> ParseTensorEntry(const std::string& file,
                                                       const std::string& name,
                                                       const nlohmann::json& entry,
                                                       uint64_t data_size) {
  const std::string where = absl::StrCat(file, ": tensor '", name, "': ");
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "header entry is a JSON ", entry.type_name(), ", expected an object"));
  }
  SafetensorsTensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return absl::InvalidArgumentError(absl::StrCat(where, "no dtype"));
  if (!dtype_it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "dtype is a JSON ", dtype_it->type_name(), ", expected a string"));
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  std::optional<SafetensorsDType> dtype = ParseDType(dtype_name);
  if (!dtype) {
    return absl::InvalidArgumentError(absl::StrCat(where, "unknown dtype '", dtype_name, "'"));
  }
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return absl::InvalidArgumentError(absl::StrCat(where, "no shape"));
  if (!shape_it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "shape is a JSON ", shape_it->type_name(), ", expected an array"));
  }
  // Overflow-checked product of the dims and the element size: a header with huge dims must
  // fail here rather than wrap around and pass the size check below.
  uint64_t nbytes = static_cast<uint64_t>(DTypeSize(info.dtype));
  bool overflow = false;
  for (const nlohmann::json& dim : *shape_it) {
    if (dim.is_number_integer() && !dim.is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "shape ", shape_it->dump(), " has a negative dimension"));
    }
    std::optional<uint64_t> value = AsUnsigned(dim);
    if (!value) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "shape ", shape_it->dump(), " holds a non-integer dimension"));
    }
    if (*value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "shape ", shape_it->dump(), " has a dimension out of range"));
    }
    info.shape.push_back(static_cast<int64_t>(*value));
    overflow = overflow || __builtin_mul_overflow(nbytes, *value, &nbytes);
  }
  if (overflow) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "shape ", ShapeString(info.shape), " is too large to address"));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "no data_offsets"));
  }
  std::optional<uint64_t> begin;
  std::optional<uint64_t> end;
  if (offsets_it->is_array() && offsets_it->size() == 2) {
    begin = AsUnsigned((*offsets_it)[0]);
    end = AsUnsigned((*offsets_it)[1]);
  }
  if (!begin || !end) {
    return absl::InvalidArgumentError(absl::StrCat(where, "data_offsets ", offsets_it->dump(),
                                                   " is not a pair of non-negative integers"));
  }
  info.data_begin = *begin;
  info.data_end = *end;
  const std::string range = absl::StrCat("[", *begin, ", ", *end, ")");
  if (*begin > *end) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "data_offsets ", range, " are out of order"));
  }
  if (*end > data_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "data_offsets ", range, " extend past the data section of ", data_size, " bytes"));
  }
  if (*end - *begin != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "data_offsets ", range, " hold ", *end - *begin, " bytes but shape ",
        ShapeString(info.shape), " of ", Sv(DTypeName(info.dtype)), " needs ", nbytes));
  }
  return info;
}

absl::Status ParseMetadata(const std::string& file, const nlohmann::json& value,
                           std::map<std::string, std::string>& metadata) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", kMetadataKey, " is a JSON ",
                                                   value.type_name(), ", expected an object"));
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": ", kMetadataKey, " entry '", key,
                                                     "' is a JSON ", item.type_name(),
                                                     ", expected a string"));
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return absl::OkStatus();
}

// Tensors may appear in the header in any order, so overlap is checked on the ranges sorted
// by start. Empty tensors own no bytes and cannot overlap anything.
absl::Status CheckNoOverlap(const std::string& file,
                            const std::map<std::string, SafetensorsTensorInfo>& tensors) {
  std::vector<const SafetensorsTensorInfo*> sorted;
  for (const auto& [name, info] : tensors) {
    if (info.data_end > info.data_begin) sorted.push_back(&info);
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
    return std::tie(a->data_begin, a->data_end) < std::tie(b->data_begin, b->data_end);
  });
  const SafetensorsTensorInfo* furthest = nullptr;  // the range reaching furthest so far
  for (const SafetensorsTensorInfo* info : sorted) {
    if (furthest != nullptr && info->data_begin < furthest->data_end) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": tensor '", info->name, "': data_offsets [", info->data_begin, ", ",
                       info->data_end, ") overlap those of tensor '", furthest->name, "' [",
                       furthest->data_begin, ", ", furthest->data_end, ")"));
    }
    if (furthest == nullptr || info->data_end > furthest->data_end) furthest = info;
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t written = ::write(fd, bytes, size);
    if (written < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write failed: ", ErrnoMessage(errno)));
    }
    bytes += written;
    size -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string_view DTypeName(SafetensorsDType dtype) {
  switch (dtype) {
    case SafetensorsDType::kF64:
      return "F64";
    case SafetensorsDType::kF32:
      return "F32";
    case SafetensorsDType::kF16:
      return "F16";
    case SafetensorsDType::kBF16:
      return "BF16";
    case SafetensorsDType::kI64:
      return "I64";
    case SafetensorsDType::kI32:
      return "I32";
    case SafetensorsDType::kI16:
      return "I16";
    case SafetensorsDType::kI8:
      return "I8";
    case SafetensorsDType::kU8:
      return "U8";
    case SafetensorsDType::kBool:
      return "BOOL";
  }
  return "UNKNOWN";
}

int64_t DTypeSize(SafetensorsDType dtype) {
  switch (dtype) {
    case SafetensorsDType::kF64:
    case SafetensorsDType::kI64:
      return 8;
    case SafetensorsDType::kF32:
    case SafetensorsDType::kI32:
      return 4;
    case SafetensorsDType::kF16:
    case SafetensorsDType::kBF16:
    case SafetensorsDType::kI16:
      return 2;
    case SafetensorsDType::kI8:
    case SafetensorsDType::kU8:
    case SafetensorsDType::kBool:
      return 1;
  }
  return 1;
}

absl::StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::filesystem::path& path) {
  // The constructor is private, so make_shared cannot reach it.
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const std::string name = path.string();

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string message = absl::StrCat(name, ": cannot open: ", ErrnoMessage(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    if (err == EACCES) return absl::PermissionDeniedError(message);
    return absl::InternalError(message);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(name, ": cannot stat: ", ErrnoMessage(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(name, ": file is ", file_size,
                                            " bytes, too short for the 8-byte header length"));
  }
  // MAP_PRIVATE + PROT_READ: the weights are never written through the mapping, and any
  // attempt to (through a tensor from Tensor()) faults instead of corrupting the file.
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int mmap_err = errno;
  ::close(fd);  // the mapping keeps its own reference to the file
  if (mapping == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat(name, ": cannot mmap ", file_size, " bytes: ", ErrnoMessage(mmap_err)));
  }
  file->mapping_ = static_cast<const uint8_t*>(mapping);
  file->mapping_size_ = file_size;

  uint64_t header_size = 0;
  std::memcpy(&header_size, file->mapping_, sizeof(header_size));
  if (header_size > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": header length ", header_size,
                                                   " exceeds the ", kMaxHeaderBytes,
                                                   "-byte limit; the file is not safetensors or "
                                                   "is corrupt"));
  }
  if (header_size > file_size - 8) {
    return absl::DataLossError(absl::StrCat(name, ": header length ", header_size,
                                            " runs past the end of the ", file_size,
                                            "-byte file (truncated?)"));
  }
  const char* header_begin = reinterpret_cast<const char*>(file->mapping_ + 8);
  file->data_section_ = file->mapping_ + 8 + header_size;
  const uint64_t data_size = file_size - 8 - header_size;

  try {
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(header_begin, header_begin + header_size);
    } catch (const nlohmann::json::parse_error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": header is not valid JSON: ", e.what()));
    }
    if (!header.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": header is a JSON ", header.type_name(), ", expected an object"));
    }
    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) {
        TOPHAT_RETURN_IF_ERROR(ParseMetadata(name, value, file->metadata_));
        continue;
      }
      TOPHAT_ASSIGN_OR_RETURN(SafetensorsTensorInfo info,
                              ParseTensorEntry(name, key, value, data_size));
      file->tensors_.emplace(key, std::move(info));
    }
  } catch (const std::exception& e) {
    // Every access above is type-checked first; this is a backstop (e.g. bad_alloc) so that
    // no exception escapes the API.
    return absl::InternalError(absl::StrCat(name, ": cannot read header: ", e.what()));
  }
  TOPHAT_RETURN_IF_ERROR(CheckNoOverlap(name, file->tensors_));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(const_cast<uint8_t*>(mapping_), mapping_size_);
}

absl::StatusOr<at::Tensor> SafetensorsFile::Tensor(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_.string(), ": no tensor '", Sv(name), "'"));
  }
  const SafetensorsTensorInfo& info = it->second;
  std::optional<at::ScalarType> scalar_type = ToScalarType(info.dtype);
  if (!scalar_type) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_.string(), ": tensor '", Sv(name), "' has dtype ",
                     Sv(DTypeName(info.dtype)), "; only F32, F16, BF16, I8 and U8 are supported"));
  }
  const uint8_t* data = data_section_ + info.data_begin;
  const size_t nbytes = info.data_end - info.data_begin;
  const at::TensorOptions options = at::TensorOptions().dtype(*scalar_type).device(at::kCPU);
  // Misaligned elements are undefined behaviour for kernels that load them as float/half,
  // so such tensors (only from writers that do not pad) are copied instead of aliased.
  const bool aligned =
      reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(DTypeSize(info.dtype)) == 0;
  at::Tensor result;
  absl::Status status =
      CatchExceptions(absl::StrCat(path_.string(), ": tensor '", Sv(name), "'"), [&] {
        if (nbytes == 0 || !aligned) {
          result = at::empty(info.shape, options);
          if (nbytes > 0) std::memcpy(result.data_ptr(), data, nbytes);
          return;
        }
        // Zero-copy: the tensor aliases the read-only mapping, and its deleter holds the file
        // so the mapping stays valid for as long as any such tensor (or view of it) lives.
        // Writing into it faults (PROT_READ); callers that need to mutate must clone().
        std::shared_ptr<const SafetensorsFile> self = shared_from_this();
        result = at::from_blob(
            const_cast<uint8_t*>(data), info.shape, [self](void*) {}, options);
      });
  TOPHAT_RETURN_IF_ERROR(status);
  return result;
}

absl::Status WriteSafetensors(const std::filesystem::path& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  const std::string name = path.string();
  auto where = [&name](const std::string& tensor_name) {
    return absl::StrCat(name, ": tensor '", tensor_name, "'");
  };

  // Pass 1 validates everything and lays out the header from sizes alone, so a bad input
  // fails before any file exists and no tensor needs converting yet.
  std::set<std::string_view> seen;
  // ordered_json keeps the header in the caller's order, matching the data layout, which
  // makes files easy to inspect and diff.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& [tensor_name, tensor] : tensors) {
    if (tensor_name == kMetadataKey) {
      return absl::InvalidArgumentError(absl::StrCat(where(tensor_name), ": name is reserved"));
    }
    if (!seen.insert(tensor_name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(tensor_name), ": name appears more than once"));
    }
    if (!tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(where(tensor_name), ": tensor is undefined"));
    }
    std::optional<SafetensorsDType> dtype = FromScalarType(tensor.scalar_type());
    if (!dtype) {
      return absl::InvalidArgumentError(absl::StrCat(where(tensor_name), ": dtype ",
                                                     c10::toString(tensor.scalar_type()),
                                                     " is not supported; use F32, F16, BF16 or I8"));
    }
    const uint64_t nbytes = static_cast<uint64_t>(tensor.numel()) * DTypeSize(*dtype);
    header[tensor_name] = {{"dtype", std::string(DTypeName(*dtype))},
                           {"shape", tensor.sizes().vec()},
                           {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }

  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const std::exception& e) {
    // dump() throws on invalid UTF-8 in a name or metadata value.
    return absl::InvalidArgumentError(absl::StrCat(name, ": cannot encode header: ", e.what()));
  }
  // Pad so the data section starts 8-byte aligned, letting readers map every tensor in place.
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');
  const uint64_t header_size = header_text.size();

  std::filesystem::path tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat(tmp.string(), ": cannot create: ", ErrnoMessage(errno)));
  }
  auto fail = [&](const absl::Status& status) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return absl::Status(status.code(), absl::StrCat(tmp.string(), ": ", status.message()));
  };
  if (absl::Status s = WriteAll(fd, &header_size, sizeof(header_size)); !s.ok()) return fail(s);
  if (absl::Status s = WriteAll(fd, header_text.data(), header_text.size()); !s.ok()) {
    return fail(s);
  }
  // Pass 2 converts one tensor at a time, so writing GPU or strided weights never holds more
  // than one extra tensor in host memory.
  for (const auto& entry : tensors) {
    const at::Tensor& tensor = entry.second;
    at::Tensor cpu;
    absl::Status status = CatchExceptions(where(entry.first),
                                          [&] { cpu = tensor.detach().to(at::kCPU).contiguous(); });
    if (!status.ok()) return fail(status);
    if (cpu.nbytes() == 0) continue;
    if (absl::Status s = WriteAll(fd, cpu.data_ptr(), cpu.nbytes()); !s.ok()) return fail(s);
  }
  // Flush before the rename so that after a crash the final name holds either the old file
  // or the complete new one, never a prefix.
  if (::fsync(fd) != 0) {
    return fail(absl::InternalError(absl::StrCat("fsync failed: ", ErrnoMessage(errno))));
  }
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat(tmp.string(), ": close failed: ", ErrnoMessage(err)));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    ::unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat(name, ": cannot rename from ", tmp.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace tophat
