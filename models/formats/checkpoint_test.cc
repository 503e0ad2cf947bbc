#include "models/formats/checkpoint.h"

#include <unistd.h>

#include <atomic>
#include "base/test_util.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace tophat {
namespace {

namespace fs = std::filesystem;
using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";

void WriteIndex(const fs::path& dir, const std::map<std::string, std::string>& weight_map) {
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  WriteBytes(dir / "model.safetensors.index.json", index.dump(2));
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// Two shards as Hugging Face writes them: embed and norm in the first, the head in the second.
struct ShardedCheckpoint {
  TempDir dir;
  at::Tensor embed = at::randn({8, 4});
  at::Tensor norm = at::randn({4}).to(at::kBFloat16);
  at::Tensor head = at::randn({8, 4}).to(at::kHalf);

  ShardedCheckpoint() {
    REQUIRE(WriteSafetensors(dir.path() / kShard1,
                             {{"model.embed_tokens.weight", embed}, {"model.norm.weight", norm}})
                .ok());
    REQUIRE(WriteSafetensors(dir.path() / kShard2, {{"lm_head.weight", head}}).ok());
  }
  std::map<std::string, std::string> WeightMap() const {
    return {{"model.embed_tokens.weight", kShard1},
            {"model.norm.weight", kShard1},
            {"lm_head.weight", kShard2}};
  }
};

TEST_CASE("checkpoint reads a single model.safetensors", "[checkpoint]") {
  TempDir dir;
  const at::Tensor weight = at::randn({4, 4});
  const at::Tensor norm = at::randn({4}).to(at::kBFloat16);
  REQUIRE(WriteSafetensors(dir.path() / "model.safetensors", {{"w", weight}, {"norm", norm}}).ok());

  auto reader = CheckpointReader::Open(dir.path());
  REQUIRE(reader.ok());
  CHECK((*reader)->dir() == dir.path());
  CHECK((*reader)->Has("w"));
  CHECK_FALSE((*reader)->Has("v"));
  CHECK((*reader)->TensorNames() == std::vector<std::string>{"norm", "w"});
  CHECK(*(*reader)->FileOf("w") == dir.path() / "model.safetensors");
  CHECK(*(*reader)->StoredDType("norm") == SafetensorsDType::kBF16);

  auto same = (*reader)->Load("w", {4, 4}, at::kFloat);
  REQUIRE(same.ok());
  CHECK(at::equal(*same, weight));

  // BF16 -> F32 widens exactly, so the converted tensor equals the reference conversion.
  auto widened = (*reader)->Load("norm", {4}, at::kFloat);
  REQUIRE(widened.ok());
  CHECK(widened->scalar_type() == at::kFloat);
  CHECK(at::equal(*widened, norm.to(at::kFloat)));
}

TEST_CASE(
    "A multimodal checkpoint's language model reads under a text model's names, in "
    "either layout",
    "[checkpoint]") {
  struct Layout {
    std::string model;  // prefix of the text model's `model.`
    std::string head;   // of its `lm_head.`
  };
  for (const Layout& layout : {Layout{"language_model.model.", "language_model.lm_head."},
                               Layout{"model.language_model.", "lm_head."}}) {
    INFO(layout.model);
    TempDir dir;
    const at::Tensor embed = at::randn({8, 4});
    const at::Tensor norm = at::randn({4});
    const at::Tensor head = at::randn({8, 4});
    const at::Tensor vision = at::randn({2, 2});
    REQUIRE(WriteSafetensors(dir.path() / "model.safetensors",
                             {{layout.model + "embed_tokens.weight", embed},
                              {layout.model + "layers.0.input_layernorm.weight", norm},
                              {layout.head + "weight", head},
                              {"vision_tower.encoder.layers.0.weight", vision}})
                .ok());
    auto reader = CheckpointReader::Open(dir.path());
    REQUIRE(reader.ok());
    CHECK((*reader)->TensorNames() ==
          std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight",
                                   "model.layers.0.input_layernorm.weight",
                                   "vision_tower.encoder.layers.0.weight"});
    CHECK(at::equal(*(*reader)->Load("model.embed_tokens.weight", {8, 4}, at::kFloat), embed));
    CHECK(at::equal(*(*reader)->LoadAsStored("model.layers.0.input_layernorm.weight"), norm));
    CHECK(at::equal(*(*reader)->Load("lm_head.weight", {8, 4}, at::kFloat), head));
    CHECK(*(*reader)->StoredDType("lm_head.weight") == SafetensorsDType::kF32);
    // An error names the tensor as the file stores it.
    auto wrong = (*reader)->Load("model.embed_tokens.weight", {4, 8}, at::kFloat);
    REQUIRE_FALSE(wrong.ok());
    CHECK_THAT(std::string(wrong.status().message()),
               Catch::Contains("tensor '" + layout.model + "embed_tokens.weight' has shape"));
  }
}

TEST_CASE("Phi-3's fused projections read as Llama's parts, ranges of their rows", "[checkpoint]") {
  TempDir dir;
  auto write_config = [&](int64_t kv_heads) {
    WriteBytes(dir.path() / "config.json", nlohmann::json{{"architectures", {"Phi3ForCausalLM"}},
                                                          {"vocab_size", 8},
                                                          {"hidden_size", 64},
                                                          {"intermediate_size", 48},
                                                          {"num_hidden_layers", 1},
                                                          {"num_attention_heads", 4},
                                                          {"num_key_value_heads", kv_heads}}
                                               .dump());
  };
  // 4 query heads and 2 KV heads of 16 (q 64, k and v 32 each), MLP 48.
  write_config(2);
  const at::Tensor qkv = at::randn({128, 64}).to(at::kBFloat16);
  const at::Tensor gate_up = at::randn({96, 64});
  const at::Tensor norm = at::randn({64});
  REQUIRE(WriteSafetensors(dir.path() / "model.safetensors",
                           {{"model.layers.0.self_attn.qkv_proj.weight", qkv},
                            {"model.layers.0.mlp.gate_up_proj.weight", gate_up},
                            {"model.layers.0.input_layernorm.weight", norm}})
              .ok());
  auto reader = CheckpointReader::Open(dir.path());
  INFO(reader.status().ToString());
  REQUIRE(reader.ok());
  CHECK((*reader)->TensorNames() ==
        std::vector<std::string>{
            "model.layers.0.input_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight"});
  const std::string layer = "model.layers.0.";
  CHECK(at::equal(*(*reader)->Load(layer + "self_attn.q_proj.weight", {64, 64}, at::kFloat),
                  qkv.narrow(0, 0, 64).to(at::kFloat)));
  CHECK(at::equal(*(*reader)->Load(layer + "self_attn.k_proj.weight", {32, 64}, at::kFloat),
                  qkv.narrow(0, 64, 32).to(at::kFloat)));
  CHECK(at::equal(*(*reader)->LoadAsStored(layer + "self_attn.v_proj.weight"),
                  qkv.narrow(0, 96, 32)));
  CHECK(*(*reader)->StoredDType(layer + "self_attn.v_proj.weight") == SafetensorsDType::kBF16);
  CHECK(at::equal(*(*reader)->Load(layer + "mlp.gate_proj.weight", {48, 64}, at::kFloat),
                  gate_up.narrow(0, 0, 48)));
  CHECK(at::equal(*(*reader)->Load(layer + "mlp.up_proj.weight", {48, 64}, at::kFloat),
                  gate_up.narrow(0, 48, 48)));
  // A part read at the wrong shape names the stored tensor and the rows it is.
  auto wrong = (*reader)->Load(layer + "self_attn.k_proj.weight", {64, 64}, at::kFloat);
  REQUIRE_FALSE(wrong.ok());
  CHECK_THAT(Message(wrong.status()),
             Catch::Contains("tensor 'model.layers.0.self_attn.qkv_proj.weight' rows [64, 96) "
                             "('model.layers.0.self_attn.k_proj.weight') has shape [32, 64], "
                             "expected [64, 64]"));

  // Rows that do not add up to the config's widths, and a config that is missing.
  write_config(4);
  auto mismatched = CheckpointReader::Open(dir.path());
  REQUIRE_FALSE(mismatched.ok());
  CHECK_THAT(Message(mismatched.status()),
             Catch::Contains("tensor 'model.layers.0.self_attn.qkv_proj.weight' has shape "
                             "[128, 64]; its parts (self_attn.q_proj, self_attn.k_proj, "
                             "self_attn.v_proj) need 192 rows by"));
  fs::remove(dir.path() / "config.json");
  auto unconfigured = CheckpointReader::Open(dir.path());
  REQUIRE_FALSE(unconfigured.ok());
  CHECK_THAT(Message(unconfigured.status()),
             Catch::Contains("stores fused projections (qkv_proj, gate_up_proj), whose parts' "
                             "widths its config gives"));
}

TEST_CASE("checkpoint reads shards listed in the index", "[checkpoint]") {
  ShardedCheckpoint checkpoint;
  WriteIndex(checkpoint.dir.path(), checkpoint.WeightMap());

  auto reader = CheckpointReader::Open(checkpoint.dir.path());
  REQUIRE(reader.ok());
  CHECK((*reader)->TensorNames() == std::vector<std::string>{"lm_head.weight",
                                                             "model.embed_tokens.weight",
                                                             "model.norm.weight"});
  CHECK(*(*reader)->FileOf("lm_head.weight") == checkpoint.dir.path() / kShard2);
  CHECK(*(*reader)->FileOf("model.norm.weight") == checkpoint.dir.path() / kShard1);

  auto embed = (*reader)->Load("model.embed_tokens.weight", {8, 4}, at::kFloat);
  auto norm = (*reader)->Load("model.norm.weight", {4}, at::kBFloat16);
  auto head = (*reader)->Load("lm_head.weight", {8, 4}, at::kHalf);
  REQUIRE(embed.ok());
  REQUIRE(norm.ok());
  REQUIRE(head.ok());
  CHECK(at::equal(*embed, checkpoint.embed));
  CHECK(at::equal(*norm, checkpoint.norm));
  CHECK(at::equal(*head, checkpoint.head));
}

TEST_CASE("checkpoint index errors name the index, the shard and the tensor", "[checkpoint]") {
  ShardedCheckpoint checkpoint;
  const std::string index = (checkpoint.dir.path() / "model.safetensors.index.json").string();
  std::map<std::string, std::string> weight_map = checkpoint.WeightMap();

  SECTION("tensor absent from its shard") {
    weight_map["model.layers.0.mlp.up_proj.weight"] = kShard2;
    WriteIndex(checkpoint.dir.path(), weight_map);
    auto reader = CheckpointReader::Open(checkpoint.dir.path());
    REQUIRE_FALSE(reader.ok());
    CHECK(reader.status().code() == absl::StatusCode::kNotFound);
    CHECK_THAT(Message(reader.status()),
               Catch::Contains(index) && Catch::Contains(kShard2) &&
                   Catch::Contains("'model.layers.0.mlp.up_proj.weight'"));
  }
  SECTION("tensor mapped to the wrong shard") {
    weight_map["lm_head.weight"] = kShard1;
    WriteIndex(checkpoint.dir.path(), weight_map);
    auto reader = CheckpointReader::Open(checkpoint.dir.path());
    REQUIRE_FALSE(reader.ok());
    CHECK_THAT(Message(reader.status()), Catch::Contains(index) && Catch::Contains(kShard1) &&
                                             Catch::Contains("'lm_head.weight'"));
  }
  SECTION("missing shard file") {
    weight_map["lm_head.weight"] = "model-00003-of-00002.safetensors";
    WriteIndex(checkpoint.dir.path(), weight_map);
    auto reader = CheckpointReader::Open(checkpoint.dir.path());
    REQUIRE_FALSE(reader.ok());
    CHECK(reader.status().code() == absl::StatusCode::kNotFound);
    CHECK_THAT(Message(reader.status()), Catch::Contains(index) &&
                                             Catch::Contains("model-00003-of-00002.safetensors") &&
                                             Catch::Contains("'lm_head.weight'"));
  }
  SECTION("corrupt shard") {
    WriteBytes(checkpoint.dir.path() / kShard2, "oops");
    WriteIndex(checkpoint.dir.path(), weight_map);
    auto reader = CheckpointReader::Open(checkpoint.dir.path());
    REQUIRE_FALSE(reader.ok());
    CHECK(reader.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(Message(reader.status()),
               Catch::Contains((checkpoint.dir.path() / kShard2).string()));
  }
  SECTION("tensor name in two shards") {
    REQUIRE(WriteSafetensors(
                checkpoint.dir.path() / kShard2,
                {{"lm_head.weight", checkpoint.head}, {"model.norm.weight", checkpoint.norm}})
                .ok());
    WriteIndex(checkpoint.dir.path(), weight_map);
    auto reader = CheckpointReader::Open(checkpoint.dir.path());
    REQUIRE_FALSE(reader.ok());
    CHECK(reader.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(reader.status()), Catch::Contains("'model.norm.weight'") &&
                                             Catch::Contains(kShard1) && Catch::Contains(kShard2));
  }
  SECTION("index is not JSON") {
    WriteBytes(index, "{\"weight_map\": ");
    auto reader = CheckpointReader::Open(checkpoint.dir.path());
    REQUIRE_FALSE(reader.ok());
    CHECK(reader.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(reader.status()), Catch::Contains(index) && Catch::Contains("JSON"));
  }
  SECTION("index without a weight_map") {
    WriteBytes(index, R"({"metadata": {}})");
    auto reader = CheckpointReader::Open(checkpoint.dir.path());
    REQUIRE_FALSE(reader.ok());
    CHECK_THAT(Message(reader.status()), Catch::Contains(index) && Catch::Contains("weight_map"));
  }
  SECTION("shard outside the checkpoint directory") {
    for (const char* escape : {"../model.safetensors", "/etc/passwd", "sub/shard.safetensors"}) {
      weight_map["lm_head.weight"] = escape;
      WriteIndex(checkpoint.dir.path(), weight_map);
      auto reader = CheckpointReader::Open(checkpoint.dir.path());
      REQUIRE_FALSE(reader.ok());
      CHECK(reader.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(Message(reader.status()), Catch::Contains(index) && Catch::Contains(escape));
    }
  }
  SECTION("weight_map value not a file name") {
    WriteBytes(index, R"({"weight_map": {"lm_head.weight": 2}})");
    auto reader = CheckpointReader::Open(checkpoint.dir.path());
    REQUIRE_FALSE(reader.ok());
    CHECK_THAT(Message(reader.status()),
               Catch::Contains(index) && Catch::Contains("'lm_head.weight'"));
  }
}

TEST_CASE("checkpoint directory without weights is NotFound naming both files", "[checkpoint]") {
  TempDir dir;
  auto reader = CheckpointReader::Open(dir.path());
  REQUIRE_FALSE(reader.ok());
  CHECK(reader.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(Message(reader.status()), Catch::Contains(dir.path().string()) &&
                                           Catch::Contains("model.safetensors") &&
                                           Catch::Contains("model.safetensors.index.json"));
}

TEST_CASE("checkpoint Load checks presence, shape and dtype", "[checkpoint]") {
  TempDir dir;
  const fs::path path = dir.path() / "model.safetensors";
  // Hand-written because WriteSafetensors refuses integer tensors: "w" is F32 [3, 4] (48
  // bytes) and "ids" is I64 [2] (16 bytes) right after it.
  const std::string header = R"({"w":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]},)"
                             R"("ids":{"dtype":"I64","shape":[2],"data_offsets":[48,64]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  WriteBytes(path, bytes + header + std::string(64, '\0'));

  auto reader = CheckpointReader::Open(dir.path());
  REQUIRE(reader.ok());

  SECTION("missing tensor") {
    auto loaded = (*reader)->Load("lm_head.weight", {4, 4}, at::kFloat);
    REQUIRE_FALSE(loaded.ok());
    CHECK(loaded.status().code() == absl::StatusCode::kNotFound);
    CHECK_THAT(Message(loaded.status()),
               Catch::Contains("'lm_head.weight'") && Catch::Contains(dir.path().string()));
    CHECK_FALSE((*reader)->FileOf("lm_head.weight").ok());
    CHECK_FALSE((*reader)->StoredDType("lm_head.weight").ok());
  }
  SECTION("wrong shape") {
    auto loaded = (*reader)->Load("w", {4, 4}, at::kFloat);
    REQUIRE_FALSE(loaded.ok());
    CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Message(loaded.status()) ==
          path.string() + ": tensor 'w' has shape [3, 4], expected [4, 4]");
  }
  SECTION("integer dtype") {
    CHECK(*(*reader)->StoredDType("ids") == SafetensorsDType::kI64);
    auto loaded = (*reader)->Load("ids", {2}, at::kFloat);
    REQUIRE_FALSE(loaded.ok());
    CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(loaded.status()), Catch::Contains(path.string()) &&
                                             Catch::Contains("'ids'") && Catch::Contains("I64"));
  }
  SECTION("matching shape loads") {
    auto loaded = (*reader)->Load("w", {3, 4}, at::kBFloat16);
    REQUIRE(loaded.ok());
    CHECK(loaded->scalar_type() == at::kBFloat16);
    CHECK(at::equal(*loaded, at::zeros({3, 4}, at::kBFloat16)));
  }
}

}  // namespace
}  // namespace tophat
