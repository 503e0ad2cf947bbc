#include "models/formats/safetensors.h"

#include <unistd.h>

#include <atomic>
#include "base/test_util.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

namespace tophat {
namespace {

namespace fs = std::filesystem;
using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

std::string LengthPrefix(uint64_t length) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return bytes;
}

// A hand-made file: the header text exactly as given (no padding) and `data` after it.
std::string RawFile(const std::string& header, const std::string& data) {
  return LengthPrefix(header.size()) + header + data;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

constexpr char kQProj[] = "model.layers.0.self_attn.q_proj.weight";

TEST_CASE("safetensors round trip keeps dtypes, shapes, values and metadata", "[safetensors]") {
  TempDir dir;
  const fs::path path = dir.path() / "model.safetensors";
  at::manual_seed(7);
  const at::Tensor f32 = at::randn({2, 3});
  const at::Tensor f16 = at::randn({4}).to(at::kHalf);
  const at::Tensor bf16 = at::randn({3, 2}).to(at::kBFloat16);
  const at::Tensor scalar = at::full({}, 2.5f);
  const at::Tensor empty = at::empty({0, 5});
  // Written from a non-contiguous view: the writer must store it in logical order.
  const at::Tensor transposed = at::arange(6, at::kFloat).reshape({2, 3}).t();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "tophat"}};

  REQUIRE(WriteSafetensors(path,
                           {{"f32", f32},
                            {"f16", f16},
                            {"bf16", bf16},
                            {"scalar", scalar},
                            {"empty", empty},
                            {"transposed", transposed}},
                           metadata)
              .ok());
  CHECK_FALSE(fs::exists(dir.path() / "model.safetensors.tmp"));

  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK((*file)->path() == path);
  CHECK((*file)->metadata() == metadata);
  REQUIRE((*file)->tensors().size() == 6);
  CHECK((*file)->tensors().at("f16").dtype == SafetensorsDType::kF16);
  CHECK((*file)->tensors().at("bf16").dtype == SafetensorsDType::kBF16);
  CHECK((*file)->tensors().at("bf16").shape == std::vector<int64_t>{3, 2});
  CHECK((*file)->tensors().at("scalar").shape.empty());

  // Offsets follow the given order with no gaps.
  CHECK((*file)->tensors().at("f32").data_begin == 0);
  CHECK((*file)->tensors().at("f16").data_begin == 24);
  CHECK((*file)->tensors().at("bf16").data_begin == 32);

  const std::vector<std::pair<std::string, at::Tensor>> expected = {
      {"f32", f32},       {"f16", f16},     {"bf16", bf16},
      {"scalar", scalar}, {"empty", empty}, {"transposed", transposed}};
  for (const auto& [name, tensor] : expected) {
    INFO(name);
    auto loaded = (*file)->Tensor(name);
    REQUIRE(loaded.ok());
    CHECK(loaded->scalar_type() == tensor.scalar_type());
    CHECK(loaded->sizes() == tensor.sizes());
    CHECK(at::equal(*loaded, tensor));
  }
}

TEST_CASE("safetensors writer aligns the data section and tensors alias the mapping",
          "[safetensors]") {
  TempDir dir;
  const fs::path path = dir.path() / "aligned.safetensors";
  const at::Tensor weight = at::randn({4, 4});
  REQUIRE(WriteSafetensors(path, {{"weight", weight}}, {{"k", "v"}}).ok());

  const std::string bytes = ReadBytes(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  CHECK((8 + header_size) % 8 == 0);
  CHECK(bytes.size() == 8 + header_size + 64);
  const std::string header = bytes.substr(8, header_size);
  CHECK(header.front() == '{');
  CHECK(header.find_last_not_of(' ') == header.rfind('}'));

  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  auto first = (*file)->Tensor("weight");
  auto second = (*file)->Tensor("weight");
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  // Both calls see the same bytes of the mapping rather than private copies.
  CHECK(first->data_ptr() == second->data_ptr());
  CHECK(reinterpret_cast<uintptr_t>(first->data_ptr()) % 8 == 0);
  CHECK(at::equal(*first, weight));

  // The tensor keeps the mapping alive after the last handle to the file goes away.
  file->reset();
  CHECK(at::equal(*first, weight));
}

TEST_CASE("safetensors copies tensors whose data is misaligned", "[safetensors]") {
  TempDir dir;
  const fs::path path = dir.path() / "misaligned.safetensors";
  // The F16 tensor's 6 bytes push the F32 tensor to data offset 6, off its 4-byte alignment.
  const at::Tensor half = at::randn({3}).to(at::kHalf);
  const at::Tensor weight = at::randn({2, 2});
  REQUIRE(WriteSafetensors(path, {{"half", half}, {"weight", weight}}).ok());

  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK((*file)->tensors().at("weight").data_begin == 6);
  auto first = (*file)->Tensor("weight");
  auto second = (*file)->Tensor("weight");
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  CHECK(first->data_ptr() != second->data_ptr());
  CHECK(reinterpret_cast<uintptr_t>(first->data_ptr()) % 4 == 0);
  CHECK(at::equal(*first, weight));
  // A copy is ordinary memory, so unlike the aliasing case it may be written.
  first->add_(1.0);
  CHECK(at::equal(*second, weight));
}

TEST_CASE("safetensors reads hand-written files from unpadded writers", "[safetensors]") {
  TempDir dir;
  const fs::path path = dir.path() / "unpadded.safetensors";
  const float values[2] = {1.5f, -2.0f};
  std::string data(reinterpret_cast<const char*>(values), sizeof(values));
  std::string header =
      R"({"__metadata__":{"a":"b"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  // One trailing space if needed so that the data section is misaligned for F32.
  if ((8 + header.size()) % 4 == 0) header += ' ';
  WriteBytes(path, RawFile(header, data));
  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK((*file)->metadata().at("a") == "b");
  auto x = (*file)->Tensor("x");
  REQUIRE(x.ok());
  CHECK(at::equal(*x, at::tensor({1.5f, -2.0f})));
}

TEST_CASE("safetensors Tensor() reports absent tensors and non-float dtypes", "[safetensors]") {
  TempDir dir;
  const fs::path path = dir.path() / "ids.safetensors";
  const std::string header = R"({"token_ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})";
  WriteBytes(path, RawFile(header, std::string(16, '\0')));
  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK((*file)->tensors().at("token_ids").dtype == SafetensorsDType::kI64);

  auto ids = (*file)->Tensor("token_ids");
  REQUIRE_FALSE(ids.ok());
  CHECK(ids.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(ids.status()), Catch::Contains(path.string()) &&
                                        Catch::Contains("'token_ids'") && Catch::Contains("I64"));

  auto missing = (*file)->Tensor("lm_head.weight");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(Message(missing.status()),
             Catch::Contains(path.string()) && Catch::Contains("'lm_head.weight'"));
}

TEST_CASE("safetensors writer refuses bad input and leaves no file", "[safetensors]") {
  TempDir dir;
  const fs::path path = dir.path() / "out.safetensors";
  const at::Tensor ok = at::zeros({2});

  auto refused = [&](const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                     const std::string& tensor_name) {
    absl::Status status = WriteSafetensors(path, tensors);
    REQUIRE_FALSE(status.ok());
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(status),
               Catch::Contains(path.string()) && Catch::Contains("'" + tensor_name + "'"));
    CHECK_FALSE(fs::exists(path));
    CHECK_FALSE(fs::exists(dir.path() / "out.safetensors.tmp"));
  };
  SECTION("integer dtype") { refused({{"ok", ok}, {"ids", at::zeros({2}, at::kLong)}}, "ids"); }
  SECTION("double dtype") { refused({{"d", at::zeros({2}, at::kDouble)}}, "d"); }
  SECTION("duplicate name") { refused({{"w", ok}, {"w", ok}}, "w"); }
  SECTION("reserved name") { refused({{"__metadata__", ok}}, "__metadata__"); }
  SECTION("undefined tensor") { refused({{"u", at::Tensor()}}, "u"); }
}

TEST_CASE("safetensors writer reports an unwritable path", "[safetensors]") {
  TempDir dir;
  const fs::path path = dir.path() / "no_such_dir" / "model.safetensors";
  absl::Status status = WriteSafetensors(path, {{"a", at::ones({3})}});
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(Message(status), Catch::Contains(path.string()));
}

TEST_CASE("safetensors writer replaces an existing file", "[safetensors]") {
  TempDir dir;
  const fs::path path = dir.path() / "model.safetensors";
  REQUIRE(WriteSafetensors(path, {{"a", at::ones({3})}}).ok());
  REQUIRE(WriteSafetensors(path, {{"b", at::zeros({2})}}).ok());
  auto file = SafetensorsFile::Open(path);
  REQUIRE(file.ok());
  CHECK((*file)->tensors().size() == 1);
  CHECK((*file)->tensors().contains("b"));
}

struct CorruptCase {
  const char* label;
  std::string bytes;
  absl::StatusCode code;
  std::vector<std::string> fragments;  // besides the path, all must appear in the message
};

std::string Entry(const std::string& body) {
  return std::string(R"({")") + kQProj + R"(":)" + body + "}";
}

TEST_CASE("safetensors rejects every kind of corrupt file with a precise error", "[safetensors]") {
  using absl::StatusCode;
  const std::string q = std::string("'") + kQProj + "'";
  const std::vector<CorruptCase> cases = {
      {"empty file", "", StatusCode::kDataLoss, {"too short"}},
      {"shorter than the length", "abc", StatusCode::kDataLoss, {"3 bytes"}},
      {"truncated header", LengthPrefix(1000) + "{}", StatusCode::kDataLoss, {"1000", "truncated"}},
      {"absurd header length",
       LengthPrefix(1ull << 40) + "{}",
       StatusCode::kInvalidArgument,
       {"1099511627776", "exceeds"}},
      {"invalid JSON", RawFile("{not json", ""), StatusCode::kInvalidArgument, {"not valid JSON"}},
      {"header not an object",
       RawFile("[1, 2]", ""),
       StatusCode::kInvalidArgument,
       {"array", "expected an object"}},
      {"entry not an object",
       RawFile(Entry("5"), ""),
       StatusCode::kInvalidArgument,
       {q, "expected an object"}},
      {"missing dtype",
       RawFile(Entry(R"({"shape":[1],"data_offsets":[0,4]})"), "0123"),
       StatusCode::kInvalidArgument,
       {q, "no dtype"}},
      {"missing shape",
       RawFile(Entry(R"({"dtype":"F32","data_offsets":[0,4]})"), "0123"),
       StatusCode::kInvalidArgument,
       {q, "no shape"}},
      {"missing data_offsets",
       RawFile(Entry(R"({"dtype":"F32","shape":[1]})"), "0123"),
       StatusCode::kInvalidArgument,
       {q, "no data_offsets"}},
      {"dtype not a string",
       RawFile(Entry(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})"), "0123"),
       StatusCode::kInvalidArgument,
       {q, "dtype", "expected a string"}},
      {"shape not an array",
       RawFile(Entry(R"({"dtype":"F32","shape":"1","data_offsets":[0,4]})"), "0123"),
       StatusCode::kInvalidArgument,
       {q, "shape", "expected an array"}},
      {"fractional dimension",
       RawFile(Entry(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"), "0123"),
       StatusCode::kInvalidArgument,
       {q, "non-integer"}},
      {"data_offsets not a pair",
       RawFile(Entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})"), "0123"),
       StatusCode::kInvalidArgument,
       {q, "data_offsets", "pair"}},
      {"negative data_offsets",
       RawFile(Entry(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"), "0123"),
       StatusCode::kInvalidArgument,
       {q, "data_offsets", "non-negative"}},
      {"unknown dtype",
       RawFile(Entry(R"({"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]})"), "0"),
       StatusCode::kInvalidArgument,
       {q, "unknown dtype 'F8_E4M3'"}},
      {"negative dimension",
       RawFile(Entry(R"({"dtype":"F32","shape":[-1,4],"data_offsets":[0,4]})"), "0123"),
       StatusCode::kInvalidArgument,
       {q, "negative"}},
      {"overflowing shape",
       RawFile(Entry(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]})"),
               "0123"),
       StatusCode::kInvalidArgument,
       {q, "too large"}},
      {"offsets out of order",
       RawFile(Entry(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})"), std::string(8, 'x')),
       StatusCode::kInvalidArgument,
       {q, "[8, 4)", "out of order"}},
      {"offsets past the data",
       RawFile(Entry(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), std::string(8, 'x')),
       StatusCode::kInvalidArgument,
       {q, "[0, 16)", "past the data section of 8 bytes"}},
      {"size mismatch",
       RawFile(Entry(R"({"dtype":"F32","shape":[4,8],"data_offsets":[0,100]})"),
               std::string(100, 'x')),
       StatusCode::kInvalidArgument,
       {q + ": data_offsets [0, 100) hold 100 bytes but shape [4, 8] of F32 needs 128"}},
      {"overlapping tensors",
       RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               std::string(12, 'x')),
       StatusCode::kInvalidArgument,
       {"'a'", "'b'", "overlap"}},
      {"metadata not an object",
       RawFile(R"({"__metadata__":[1]})", ""),
       StatusCode::kInvalidArgument,
       {"__metadata__", "expected an object"}},
      {"metadata value not a string",
       RawFile(R"({"__metadata__":{"step":3}})", ""),
       StatusCode::kInvalidArgument,
       {"__metadata__", "'step'", "expected a string"}},
  };

  TempDir dir;
  for (size_t i = 0; i < cases.size(); ++i) {
    const CorruptCase& c = cases[i];
    DYNAMIC_SECTION(c.label) {
      const fs::path path = dir.path() / ("corrupt_" + std::to_string(i) + ".safetensors");
      WriteBytes(path, c.bytes);
      auto file = SafetensorsFile::Open(path);
      REQUIRE_FALSE(file.ok());
      INFO(file.status().ToString());
      CHECK(file.status().code() == c.code);
      CHECK_THAT(Message(file.status()), Catch::Contains(path.string()));
      for (const std::string& fragment : c.fragments) {
        CHECK_THAT(Message(file.status()), Catch::Contains(fragment));
      }
    }
  }
}

TEST_CASE("safetensors reports a missing file as NotFound naming it", "[safetensors]") {
  TempDir dir;
  const fs::path path = dir.path() / "absent.safetensors";
  auto file = SafetensorsFile::Open(path);
  REQUIRE_FALSE(file.ok());
  CHECK(file.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(Message(file.status()), Catch::Contains(path.string()));

  auto directory = SafetensorsFile::Open(dir.path());
  REQUIRE_FALSE(directory.ok());
  CHECK_THAT(Message(directory.status()), Catch::Contains(dir.path().string()));
}

TEST_CASE("safetensors dtype names and sizes follow the format", "[safetensors]") {
  CHECK(DTypeName(SafetensorsDType::kBF16) == "BF16");
  CHECK(DTypeName(SafetensorsDType::kBool) == "BOOL");
  CHECK(DTypeSize(SafetensorsDType::kF64) == 8);
  CHECK(DTypeSize(SafetensorsDType::kF16) == 2);
  CHECK(DTypeSize(SafetensorsDType::kU8) == 1);
}

}  // namespace
}  // namespace tophat
