#include "models/training/distill.h"

#include <filesystem>
#include <fstream>

#include "models/runtime/adapter.h"
#include "models/runtime/bundle.h"
#include "models/formats/checkpoint.h"
#include "base/test_util.h"
#include "models/training/toy_model.h"

#include <catch2/catch.hpp>

namespace tophat {
namespace {

namespace fs = std::filesystem;

// A small toy model (3 layers) to distil from, made once per test binary.
const fs::path& Teacher() {
  // Removed when the test process exits.
  static const testing::TempDir scratch;
  static const fs::path dir = [] {
    fs::path out = scratch.path() / "teacher";
    ToyModelOptions o;
    o.out_dir = out;
    o.hidden_size = 32;
    o.intermediate_size = 64;
    o.num_layers = 3;
    o.num_heads = 2;
    o.num_kv_heads = 1;
    o.sequence_length = 32;
    o.batch_size = 8;
    o.steps = 40;
    o.corpus_documents = 600;
    o.vocab_size = 320;
    o.adapter_input_layers = 0;
    // One training thread here and in Small(): CTest runs these cases beside others, where
    // two OpenMP threads that spin waiting for each other cost many times their work.
    o.threads = 1;
    auto made = MakeToyModel(o);
    REQUIRE(made.ok());
    return out;
  }();
  return dir;
}

DistillOptions Small(const fs::path& out) {
  DistillOptions o;
  o.model_dir = Teacher();
  o.out_dir = out;
  o.input_layers = 1;
  o.steps = 12;
  o.batch_size = 4;
  o.sequence_length = 32;
  o.toy_documents = 400;
  o.checkpoint_every = 4;
  o.eval_prompts = 2;
  o.eval_new_tokens = 8;
  o.threads = 1;
  return o;
}

at::Tensor AdapterTensor(const fs::path& dir, const std::string& name) {
  auto reader = CheckpointReader::OpenFile(dir / kAdapterWeightsFile);
  REQUIRE(reader.ok());
  auto t = (*reader)->LoadAsStored(name);
  REQUIRE(t.ok());
  return *t;
}

TEST_CASE("Distillation lowers the held-out loss and writes a loadable adapter", "[distill]") {
  testing::TempDir dir;
  DistillOptions options = Small(dir.path());
  options.steps = 40;
  // Draft whatever the confidence: with the default eta (0.6) this small a drafter stops
  // before its first draft, and every round emits exactly the cloud's one token.
  options.eta = 1e-6;
  auto report = Distill(options);
  REQUIRE(report.ok());
  CHECK(report->finished);
  CHECK(report->steps_done == 40);
  INFO("held-out loss " << report->initial_heldout_loss << " -> " << report->heldout_loss);
  CHECK(report->heldout_loss < 0.8 * report->initial_heldout_loss);
  // Greedy verification emits at least the cloud's own token each round, so 1.0 is what a
  // drafter that is always wrong gets. A trained one is right often enough that its drafts
  // are accepted: more tokens per round than that, and in line with how often its argmax
  // agrees with the target's (if every draft were independently right with probability p,
  // a round would emit 1 + p + p^2 + ... tokens; the first term alone is 1 + p).
  INFO("acceptance " << report->heldout_accept_length << " tokens/round, top-1 agreement "
                     << report->heldout_draft_top1);
  CHECK(report->heldout_draft_top1 > 0.2);
  CHECK(report->heldout_accept_length > 1.0 + 0.5 * report->heldout_draft_top1);
  CHECK(report->heldout_accept_length <= static_cast<double>(options.max_draft) + 1.0);
  CHECK(report->adapter_parameters > 0);
  CHECK(report->adapter_parameters < report->model_parameters);
  CHECK_FALSE(fs::exists(dir.path() / ".distill-state"));

  auto info = AdapterInfo::Load(dir.path());
  REQUIRE(info.ok());
  CHECK(info->input_layers == 1);
  auto config = ModelConfig::Load(Teacher() / "config.json");
  REQUIRE(config.ok());
  auto adapter = LoadAdapter(dir.path(), *config, *info, 1, {.huge_pages = false});
  REQUIRE(adapter.ok());
  CHECK((*adapter)->spec().layers.size() == 1);

  // The same options again reuse the finished adapter.
  auto again = Distill(options);
  REQUIRE(again.ok());
  CHECK(again->reused);
}

TEST_CASE("An interrupted distillation resumes to exactly the uninterrupted result",
          "[distill]") {
  testing::TempDir straight;
  testing::TempDir interrupted;
  auto full = Distill(Small(straight.path()));
  REQUIRE(full.ok());
  REQUIRE(full->finished);

  DistillOptions first = Small(interrupted.path());
  first.stop_after = 6;  // past the checkpoint at step 4, so the stop itself must save
  auto partial = Distill(first);
  REQUIRE(partial.ok());
  CHECK_FALSE(partial->finished);
  CHECK(partial->steps_done == 6);
  CHECK_FALSE(fs::exists(interrupted.path() / kAdapterWeightsFile));
  auto resumed = Distill(Small(interrupted.path()));
  REQUIRE(resumed.ok());
  CHECK(resumed->finished);
  CHECK(resumed->resumed_from_step == 6);
  for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"}) {
    INFO(name);
    CHECK(at::equal(AdapterTensor(straight.path(), name), AdapterTensor(interrupted.path(), name)));
  }
  CHECK(resumed->heldout_loss == full->heldout_loss);
}

TEST_CASE("A corrupt or mismatched adapter is refused with the file or tensor named",
          "[distill]") {
  testing::TempDir dir;
  auto report = Distill(Small(dir.path()));
  REQUIRE(report.ok());
  auto config = ModelConfig::Load(Teacher() / "config.json");
  REQUIRE(config.ok());
  auto info = AdapterInfo::Load(dir.path());
  REQUIRE(info.ok());
  const SubmodelOptions options{.huge_pages = false};

  // Distilled for another split.
  auto other_split = LoadAdapter(dir.path(), *config, *info, 2, options);
  REQUIRE_FALSE(other_split.ok());
  CHECK_THAT(std::string(other_split.status().message()),
             Catch::Contains("distilled for 1 input layers") &&
                 Catch::Contains("adapter.safetensors"));

  // Hyperparameters that do not match the tensors.
  AdapterInfo wider = *info;
  wider.intermediate_size += 8;
  auto mismatched = LoadAdapter(dir.path(), *config, wider, 1, options);
  REQUIRE_FALSE(mismatched.ok());
  CHECK_THAT(std::string(mismatched.status().message()),
             Catch::Contains("adapter.safetensors") && Catch::Contains("mlp."));

  // A description that is not one.
  std::ofstream(dir.path() / kAdapterInfoFile) << "{\"format\": \"tophat-adapter\", \"format_version\": 1}";
  auto bad_info = AdapterInfo::Load(dir.path());
  REQUIRE_FALSE(bad_info.ok());
  CHECK_THAT(std::string(bad_info.status().message()),
             Catch::Contains("adapter.json") && Catch::Contains("input_layers"));

  // Truncated weights.
  {
    const fs::path file = dir.path() / kAdapterWeightsFile;
    const auto size = fs::file_size(file);
    fs::resize_file(file, size / 2);
  }
  auto corrupt = LoadAdapter(dir.path(), *config, *info, 1, options);
  REQUIRE_FALSE(corrupt.ok());
  CHECK_THAT(std::string(corrupt.status().message()), Catch::Contains("adapter.safetensors"));
}

TEST_CASE("A device bundle carries the adapter and refuses a corrupt one by name", "[distill]") {
  testing::TempDir dir;
  // Distil into the device bundle itself: the manifest records it.
  auto split = SplitCheckpoint({.model_dir = Teacher(), .input_layers = 1, .output_layers = 1,
                                .out_dir = dir.path()});
  REQUIRE(split.ok());
  CHECK_FALSE(split->device.adapter.has_value());
  DistillOptions options = Small(split->device_dir);
  options.input_layers = 0;  // from the bundle
  auto report = Distill(options);
  REQUIRE(report.ok());
  CHECK(report->attached_to_bundle);
  auto manifest = BundleManifest::Load(split->device_dir);
  REQUIRE(manifest.ok());
  REQUIRE(manifest->adapter.has_value());
  auto bundle = DeviceBundle::Load(split->device_dir, {.huge_pages = false});
  REQUIRE(bundle.ok());
  CHECK(bundle->adapter != nullptr);

  std::ofstream(split->device_dir / kAdapterWeightsFile, std::ios::trunc) << "not safetensors";
  auto broken = DeviceBundle::Load(split->device_dir, {.huge_pages = false});
  REQUIRE_FALSE(broken.ok());
  CHECK_THAT(std::string(broken.status().message()), Catch::Contains("adapter.safetensors"));
}

TEST_CASE("Splitting a checkpoint that holds an adapter carries it only to the same split",
          "[distill]") {
  testing::TempDir dir;
  const fs::path model = dir.path() / "model";
  fs::create_directories(model);
  for (const auto& entry : fs::directory_iterator(Teacher())) {
    if (entry.is_regular_file()) fs::copy_file(entry.path(), model / entry.path().filename());
  }
  DistillOptions options = Small(model);
  options.model_dir = model;
  REQUIRE(Distill(options).ok());
  auto same = SplitCheckpoint({.model_dir = model, .input_layers = 1, .output_layers = 0,
                               .out_dir = dir.path() / "m1"});
  REQUIRE(same.ok());
  REQUIRE(same->device.adapter.has_value());
  CHECK(fs::exists(same->device_dir / kAdapterWeightsFile));
  CHECK_FALSE(fs::exists(same->cloud_dir / kAdapterWeightsFile));
  auto other = SplitCheckpoint({.model_dir = model, .input_layers = 2, .output_layers = 0,
                                .out_dir = dir.path() / "m2"});
  REQUIRE(other.ok());
  CHECK_FALSE(other->device.adapter.has_value());
  CHECK_THAT(other->adapter_note, Catch::Contains("distilled for --input-layers 1"));
}

}  // namespace
}  // namespace tophat
