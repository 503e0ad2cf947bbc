#include "models/training/distill.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numbers>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "models/formats/checkpoint.h"
#include "models/formats/mxfp4.h"
#include "models/runtime/adapter.h"
#include "models/runtime/bundle.h"
#include "models/runtime/fused_experts.h"
#include "models/tokenizers/tokenizer.h"
#include "models/training/toy_corpus.h"
#include "models/training/training_forward.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kStateDir[] = ".distill-state";

absl::Status WriteJsonFile(const fs::path& path, const json& j) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat(tmp.string(), ": write failed"));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat(path.string(), ": ", ec.message()));
  return absl::OkStatus();
}

// Documents of the training data, in file order.
absl::StatusOr<std::vector<std::string>> ReadDocuments(const DistillOptions& o) {
  if (o.data == "toy") return GenerateToyCorpus(o.seed, o.toy_documents);
  const fs::path path = o.data;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--data ", path.string(), ": cannot open"));
  const bool jsonl = path.extension() == ".jsonl";
  std::vector<std::string> documents;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!jsonl) {
      documents.push_back(line);
      continue;
    }
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(), ":", line_number, ": not a JSON object"));
    }
    auto text = j.find("text");
    if (text == j.end() || !text->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(), ":", line_number, ": no string field \"text\""));
    }
    documents.push_back(text->get<std::string>());
  }
  if (documents.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--data ", path.string(), ": no documents"));
  }
  return documents;
}

int64_t CountParameters(const WeightMap& weights) {
  int64_t n = 0;
  for (const auto& [name, t] : weights) n += t.numel();
  return n;
}

// The teacher and Λ as training code sees them.
struct Models {
  ModelConfig config;
  ModelConfig adapter_config;
  WeightMap teacher;
  WeightMap adapter;                 // model.layers.0.* of adapter_config
  std::vector<std::string> names;    // adapter tensors in file order
  std::vector<at::Tensor> parameters;
  RopeTable rope;
  int64_t m = 0;

  // Frozen part: the input submodel's states and the teacher's final states and logits.
  struct Targets {
    at::Tensor shallow;  // x_m [B, S, D]
    at::Tensor deep;     // f_L [B, S, D]
    at::Tensor logits;   // H(f_L) [B, S, V]
  };
  Targets Teacher(const at::Tensor& ids) const {
    at::NoGradGuard no_grad;
    Targets t;
    const at::Tensor x = TrainingEmbed(config, teacher, ids);
    t.shallow = TrainingLayers(config, teacher, rope, x, 0, m);
    t.deep = TrainingLayers(config, teacher, rope, t.shallow, m, config.num_hidden_layers);
    t.logits = TrainingHead(config, teacher, t.deep);
    return t;
  }
  at::Tensor Student(const at::Tensor& shallow) const {
    return TrainingLayers(adapter_config, adapter, rope, shallow, 0, adapter_config.num_hidden_layers);
  }
  at::Tensor Loss(const Targets& t, const at::Tensor& student, double ce_weight) const {
    at::Tensor logits = TrainingHead(config, teacher, student);
    at::Tensor l1 = at::smooth_l1_loss(student, t.deep);
    // CE(p_L, p_S) minus the teacher's entropy, which does not depend on Λ: the same
    // gradient as the cross-entropy, but a loss that reaches 0 when the drafter matches.
    const at::Tensor teacher_log_probs = at::log_softmax(t.logits, -1);
    at::Tensor kl = (teacher_log_probs.exp() * (teacher_log_probs - at::log_softmax(logits, -1)))
                        .sum(-1)
                        .mean();
    return l1 + ce_weight * kl;
  }
};

NamedTensors AdapterTensors(const Models& models) {
  NamedTensors out;
  for (const std::string& name : models.names) out.emplace_back(name, models.adapter.at(name).detach().clone());
  return out;
}

}  // namespace

json DistillOptions::ToJson() const {
  return {{"model", fs::absolute(model_dir).lexically_normal().string()},
          {"data", data == "toy" ? data : fs::absolute(data).lexically_normal().string()},
          {"input_layers", input_layers},
          {"intermediate_size", intermediate_size},
          {"init_layer", init_layer},
          {"seed", seed},
          {"steps", steps},
          {"batch_size", batch_size},
          {"sequence_length", sequence_length},
          {"learning_rate", learning_rate},
          {"weight_decay", weight_decay},
          {"ce_weight", ce_weight},
          {"clip_norm", clip_norm},
          {"toy_documents", toy_documents},
          {"eta", eta},
          {"max_draft", max_draft},
          {"eval_prompts", eval_prompts},
          {"eval_new_tokens", eval_new_tokens},
          {"eval_prompt_lengths", eval_prompt_lengths},
          {"threads", threads}};
}

json DistillReport::ToJson() const {
  return {{"finished", finished},
          {"steps_done", steps_done},
          {"resumed_from_step", resumed_from_step},
          {"seconds", seconds},
          {"first_train_loss", first_train_loss},
          {"final_train_loss", final_train_loss},
          {"initial_heldout_loss", initial_heldout_loss},
          {"heldout_loss", heldout_loss},
          {"heldout_draft_top1", heldout_draft_top1},
          {"heldout_accept_length", heldout_accept_length},
          {"accept_length_by_prompt_length", accept_length_by_prompt_length},
          {"adapter_parameters", adapter_parameters},
          {"model_parameters", model_parameters}};
}

absl::StatusOr<DistillReport> Distill(const DistillOptions& given,
                                      const std::function<void(const TrainingProgress&)>& on_progress) {
  const auto start = Clock::now();
  DistillOptions options = given;
  if (options.model_dir.empty()) return absl::InvalidArgumentError("distill: --model is required");
  if (options.out_dir.empty()) return absl::InvalidArgumentError("distill: --out is required");
  if (options.steps < 1 || options.batch_size < 1 || options.sequence_length < 2 ||
      options.checkpoint_every < 1 || options.max_draft < 1 || options.threads < 1) {
    return absl::InvalidArgumentError(
        "distill: --steps, --batch-size, --checkpoint-every, --max-draft and --threads must be "
        ">= 1 and --sequence-length >= 2");
  }
  if (options.eval_prompt_lengths.empty() ||
      *std::min_element(options.eval_prompt_lengths.begin(), options.eval_prompt_lengths.end()) <
          1) {
    return absl::InvalidArgumentError(
        "distill: the acceptance needs at least one prompt length, each >= 1");
  }
  if (!(options.eta > 0 && options.eta <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("distill: --eta must be in (0, 1], got ", options.eta));
  }

  // A device bundle as --out fixes m.
  const bool into_bundle = fs::exists(options.out_dir / kBundleManifestFile);
  if (into_bundle) {
    TOPHAT_ASSIGN_OR_RETURN(BundleManifest manifest, BundleManifest::Load(options.out_dir));
    if (manifest.kind != BundleKind::kDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "distill: --out ", options.out_dir.string(), " is a cloud bundle; give the device bundle"));
    }
    if (options.input_layers != 0 && options.input_layers != manifest.input_layers.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "distill: --input-layers ", options.input_layers, " but the device bundle in ",
          options.out_dir.string(), " has ", manifest.input_layers.end));
    }
    options.input_layers = manifest.input_layers.end;
  }
  if (options.input_layers == 0) options.input_layers = 2;

  TOPHAT_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(options.model_dir / "config.json"));
  const int64_t m = options.input_layers;
  if (m < 1 || m >= config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("distill: --input-layers must be in [1, ",
                                                   config.num_hidden_layers - 1, "], got ", m));
  }
  if (options.init_layer < 0) options.init_layer = m;
  if (options.init_layer >= config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("distill: --init-layer must be below ",
                                                   config.num_hidden_layers));
  }
  if (options.intermediate_size == 0) options.intermediate_size = config.intermediate_size;
  if (options.intermediate_size < 1) {
    return absl::InvalidArgumentError("distill: --intermediate-size must be >= 1");
  }

  const json identity = options.ToJson();
  DistillReport report;

  // A finished adapter from the same run is reused.
  {
    const json done = ReadJsonOrNull(options.out_dir / kAdapterInfoFile);
    if (done.is_object() && done.value("distillation", json::object()).value("options", json()) == identity &&
        fs::exists(options.out_dir / kAdapterWeightsFile)) {
      report.reused = true;
      report.finished = true;
      const json r = done["distillation"].value("report", json::object());
      report.steps_done = r.value("steps_done", int64_t{0});
      report.heldout_loss = r.value("heldout_loss", 0.0);
      report.initial_heldout_loss = r.value("initial_heldout_loss", 0.0);
      report.heldout_accept_length = r.value("heldout_accept_length", 0.0);
      if (r.contains("accept_length_by_prompt_length") &&
          r["accept_length_by_prompt_length"].is_array()) {
        for (const json& pair : r["accept_length_by_prompt_length"]) {
          if (pair.is_array() && pair.size() == 2 && pair[0].is_number() && pair[1].is_number()) {
            report.accept_length_by_prompt_length.emplace_back(pair[0].get<int64_t>(),
                                                               pair[1].get<double>());
          }
        }
      }
      report.heldout_draft_top1 = r.value("heldout_draft_top1", 0.0);
      report.adapter_parameters = r.value("adapter_parameters", int64_t{0});
      report.model_parameters = r.value("model_parameters", int64_t{0});
      if (into_bundle) {
        TOPHAT_RETURN_IF_ERROR(AttachAdapterToBundle(options.out_dir));
        report.attached_to_bundle = true;
      }
      return report;
    }
  }

  // Data: one token stream <s> doc </s> <s> doc </s> ...; the last 5% of documents are held out.
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(options.model_dir));
  TOPHAT_ASSIGN_OR_RETURN(std::vector<std::string> documents, ReadDocuments(options));
  const int32_t bos = tokenizer->bos_id().value_or(
      static_cast<int32_t>(config.bos_token_id.value_or(1)));
  const int32_t eos = tokenizer->eos_id().value_or(
      config.eos_token_ids.empty() ? 2 : static_cast<int32_t>(config.eos_token_ids[0]));
  std::vector<int64_t> train_stream;
  std::vector<int64_t> heldout_stream;
  std::vector<int64_t> heldout_starts;
  const size_t heldout_docs = std::max<size_t>(1, documents.size() / 20);
  for (size_t d = 0; d < documents.size(); ++d) {
    TOPHAT_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(documents[d]));
    const bool heldout = d + heldout_docs >= documents.size();
    auto& stream = heldout ? heldout_stream : train_stream;
    if (heldout) heldout_starts.push_back(static_cast<int64_t>(stream.size()));
    stream.push_back(bos);
    stream.insert(stream.end(), ids.begin(), ids.end());
    stream.push_back(eos);
  }
  const int64_t seq = options.sequence_length;
  if (static_cast<int64_t>(train_stream.size()) < seq + 2 ||
      static_cast<int64_t>(heldout_stream.size()) < seq + 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distill: --data ", options.data, " holds ", train_stream.size() + heldout_stream.size(),
        " tokens, too few for --sequence-length ", seq, " (need about 20 sequences' worth)"));
  }

  // Teacher weights, float32.
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> checkpoint,
                          CheckpointReader::Open(options.model_dir));
  Models models;
  models.config = config;
  models.m = m;
  for (const std::string& name : checkpoint->TensorNames()) {
    if (name.ends_with("_scales") && checkpoint->Has(name.substr(0, name.size() - 7) + "_blocks")) {
      continue;  // read with its blocks
    }
    TOPHAT_ASSIGN_OR_RETURN(at::Tensor t, checkpoint->LoadAsStored(name));
    if (name.ends_with("_blocks")) {
      // gpt-oss's MXFP4 experts ([E, out, in/32, 16]): the teacher's forward reads them as
      // transformers' fused [E, in, out] (models/runtime/fused_experts.h).
      const std::string fused = name.substr(0, name.size() - 7);
      TOPHAT_ASSIGN_OR_RETURN(at::Tensor scales, checkpoint->LoadAsStored(fused + "_scales"));
      TOPHAT_ASSIGN_OR_RETURN(at::Tensor values, DequantizeMxfp4(t, scales, at::kFloat,
                                                                 name + ", " + fused + "_scales"));
      models.teacher.emplace(fused, values.transpose(1, 2).contiguous());
      continue;
    }
    models.teacher.emplace(name, t.to(at::kFloat).contiguous());
  }
  for (const char* required : {"model.embed_tokens.weight", "model.norm.weight"}) {
    if (!models.teacher.contains(required)) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.model_dir.string(), ": tensor '", required,
          "' is missing; distill needs the full checkpoint, not a bundle"));
    }
  }
  report.model_parameters = CountParameters(models.teacher);

  AdapterInfo info;
  info.input_layers = m;
  info.num_layers = 1;
  info.intermediate_size = options.intermediate_size;
  info.source_model = identity["model"];
  models.adapter_config = AdapterModelConfig(config, info);
  const int64_t longest_prompt =
      *std::max_element(options.eval_prompt_lengths.begin(), options.eval_prompt_lengths.end());
  models.rope = RopeTable::Create(
      config, std::max(seq, longest_prompt) + options.eval_new_tokens + 16, at::kCPU);

  // Λ starts as a copy of teacher layer init_layer (its MLP cut to the adapter's width). Λ's
  // MLP is dense: where that layer mixes experts, it starts as the layer's first expert.
  {
    const NamedTensors init = InitWeights(models.adapter_config, options.seed);
    const std::map<std::string, ExpertMatrix> expert_roles = {
        {"mlp.gate_proj.weight", ExpertMatrix::kGate},
        {"mlp.up_proj.weight", ExpertMatrix::kUp},
        {"mlp.down_proj.weight", ExpertMatrix::kDown}};
    for (const auto& [name, fresh] : init) {
      if (name.rfind("model.layers.0.", 0) != 0) continue;
      const std::string suffix = name.substr(std::string("model.layers.0.").size());
      std::string source_name = LayerTensorName(options.init_layer, suffix);
      const auto role = expert_roles.find(suffix);
      const bool from_expert = role != expert_roles.end() && config.MoeLayer(options.init_layer);
      if (from_expert && config.gpt_oss()) {
        // Fused ([E, D, 2I] gate and up interleaved, [E, I, D]): expert 0 as linear layers.
        source_name = FusedExpertsTensorName(
            options.init_layer, role->second == ExpertMatrix::kDown ? "down_proj" : "gate_up_proj");
      } else if (from_expert) {
        source_name = ExpertTensorName(config, options.init_layer, 0, role->second);
      }
      const auto found = models.teacher.find(source_name);
      if (found == models.teacher.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            options.model_dir.string(), ": tensor '", source_name,
            "' is missing; the adapter starts as a copy of layer ", options.init_layer));
      }
      at::Tensor source = found->second;
      if (from_expert && config.gpt_oss()) {
        const at::Tensor first = source[0];
        source =
            role->second == ExpertMatrix::kDown
                ? first.t()
                : first.slice(1, role->second == ExpertMatrix::kGate ? 0 : 1, first.size(1), 2).t();
      }
      if (suffix == "mlp.down_proj.weight") {
        source = source.narrow(1, 0, std::min(source.size(1), fresh.size(1)));
      } else if (suffix == "mlp.gate_proj.weight" || suffix == "mlp.up_proj.weight") {
        source = source.narrow(0, 0, std::min(source.size(0), fresh.size(0)));
      }
      at::Tensor value = fresh.clone();
      value.narrow(0, 0, source.size(0)).narrow(-1, 0, source.size(-1)).copy_(source);
      value.set_requires_grad(true);
      models.names.push_back(name);
      models.parameters.push_back(value);
      models.adapter.emplace(name, value);
    }
  }
  report.adapter_parameters = CountParameters(models.adapter);

  const int previous_threads = at::get_num_threads();
  at::set_num_threads(options.threads);
  const fs::path state_dir = options.out_dir / kStateDir;
  absl::Status status = CatchExceptions("distillation", [&]() -> void {
    torch::optim::AdamW optimizer(
        models.parameters,
        torch::optim::AdamWOptions(options.learning_rate).weight_decay(options.weight_decay));
    int64_t first_step = 0;
    double smoothed = 0;
    const json state = ReadJsonOrNull(state_dir / "state.json");
    if (state.is_object() && state.value("options", json()) == identity &&
        fs::exists(state_dir / "optimizer.pt") && fs::exists(state_dir / kAdapterWeightsFile)) {
      auto reader = CheckpointReader::OpenFile(state_dir / kAdapterWeightsFile);
      if (!reader.ok()) throw std::runtime_error(std::string(reader.status().message()));
      at::NoGradGuard no_grad;
      for (const std::string& name : models.names) {
        at::Tensor& p = models.adapter.at(name);
        auto saved = (*reader)->Load(name, p.sizes(), at::kFloat);
        if (!saved.ok()) throw std::runtime_error(std::string(saved.status().message()));
        p.copy_(*saved);
      }
      torch::load(optimizer, (state_dir / "optimizer.pt").string());
      first_step = state.value("step", int64_t{0});
      smoothed = state.value("smoothed_loss", 0.0);
      report.first_train_loss = state.value("first_train_loss", 0.0);
      report.initial_heldout_loss = state.value("initial_heldout_loss", 0.0);
      report.resumed_from_step = first_step;
    }

    // Held-out windows for the loss: fixed, non-overlapping.
    const at::Tensor heldout = at::tensor(heldout_stream, at::kLong);
    const int64_t windows = std::min<int64_t>(8, (heldout.size(0) - 1) / seq);
    const at::Tensor heldout_batch =
        heldout.narrow(0, 0, windows * seq).view({windows, seq});
    const Models::Targets heldout_targets = models.Teacher(heldout_batch);
    auto heldout_loss = [&] {
      at::NoGradGuard no_grad;
      return models.Loss(heldout_targets, models.Student(heldout_targets.shallow), options.ce_weight)
          .item<double>();
    };
    if (first_step == 0) report.initial_heldout_loss = heldout_loss();

    auto save_state = [&](int64_t step) {
      std::error_code ec;
      fs::create_directories(state_dir, ec);
      absl::Status written =
          WriteSafetensors(state_dir / kAdapterWeightsFile, AdapterTensors(models));
      if (!written.ok()) throw std::runtime_error(std::string(written.message()));
      torch::save(optimizer, (state_dir / "optimizer.pt").string());
      written = WriteJsonFile(state_dir / "state.json",
                              {{"options", identity},
                               {"step", step},
                               {"smoothed_loss", smoothed},
                               {"first_train_loss", report.first_train_loss},
                               {"initial_heldout_loss", report.initial_heldout_loss}});
      if (!written.ok()) throw std::runtime_error(std::string(written.message()));
    };

    const at::Tensor train_tokens = at::tensor(train_stream, at::kLong);
    const auto train_start = Clock::now();
    int64_t step = first_step;
    for (; step < options.steps; ++step) {
      if (options.interrupt != nullptr && options.interrupt->load()) break;
      if (options.stop_after > 0 && step - first_step >= options.stop_after) break;
      const double lr = WarmupCosineLearningRate(options.learning_rate, step, options.steps);
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      }
      // The batch of step s depends only on (seed, s), so a resumed run sees the same data.
      std::mt19937_64 rng(options.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(step));
      std::uniform_int_distribution<int64_t> offset(
          0, static_cast<int64_t>(train_stream.size()) - seq - 1);
      std::vector<at::Tensor> rows;
      for (int64_t b = 0; b < options.batch_size; ++b) {
        rows.push_back(train_tokens.narrow(0, offset(rng), seq));
      }
      const Models::Targets targets = models.Teacher(at::stack(rows));
      optimizer.zero_grad();
      at::Tensor loss = models.Loss(targets, models.Student(targets.shallow), options.ce_weight);
      loss.backward();
      torch::nn::utils::clip_grad_norm_(models.parameters, options.clip_norm);
      optimizer.step();
      const double value = loss.item<double>();
      if (step == 0) report.first_train_loss = value;
      smoothed = step == first_step && first_step == 0 ? value : 0.9 * smoothed + 0.1 * value;
      const bool last = step + 1 == options.steps;
      if ((step + 1) % options.checkpoint_every == 0 && !last) save_state(step + 1);
      if (on_progress && ((step + 1) % 10 == 0 || last)) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - train_start).count();
        on_progress(MakeTrainingProgress(step + 1, options.steps, step + 1 - first_step, smoothed,
                                         options.batch_size * seq, elapsed));
      }
    }
    report.steps_done = step;
    report.final_train_loss = smoothed;
    if (step < options.steps) {
      save_state(step);  // interrupted or stopped early: resumable
      return;
    }
    report.finished = true;
    report.heldout_loss = heldout_loss();

    // Held-out acceptance: the teacher continues held-out prompts greedily; then, over those
    // sequences, rounds of greedy drafting (stop below eta or at max_draft) are scored the way
    // verification scores them: accepted = the leading drafts equal to the target's tokens.
    // Returns (tokens per round, drafter top-1 agreement), or nullopt when the held-out text
    // has no prompt that long.
    at::NoGradGuard no_grad;
    const auto acceptance = [&](int64_t prompt_length) -> std::optional<std::pair<double, double>> {
      std::vector<at::Tensor> prompts;
      for (int64_t start : heldout_starts) {
        if (static_cast<int64_t>(prompts.size()) >= options.eval_prompts) break;
        if (start + prompt_length > heldout.size(0)) break;
        prompts.push_back(heldout.narrow(0, start, prompt_length));
      }
      if (prompts.empty()) return std::nullopt;
      at::Tensor sequences = at::stack(prompts);
      for (int64_t g = 0; g < options.eval_new_tokens; ++g) {
        at::Tensor logits = TrainingLogits(config, models.teacher, models.rope, sequences);
        sequences = at::cat({sequences, logits.select(1, -1).argmax(-1, true)}, 1);
      }
      const Models::Targets final_targets = models.Teacher(sequences);
      const at::Tensor draft_logits = TrainingHead(config, models.teacher,
                                                   models.Student(final_targets.shallow));
      const at::Tensor draft_argmax = draft_logits.argmax(-1);
      const at::Tensor confidence = at::softmax(draft_logits, -1).amax(-1);
      const at::Tensor target_argmax = final_targets.logits.argmax(-1);
      const int64_t total = sequences.size(1);
      int64_t rounds = 0;
      int64_t emitted = 0;
      int64_t agree = 0;
      int64_t positions = 0;
      for (int64_t b = 0; b < sequences.size(0); ++b) {
        const at::Tensor row_tokens = sequences[b].contiguous();
        const at::Tensor row_draft = draft_argmax[b].contiguous();
        const at::Tensor row_target = target_argmax[b].contiguous();
        const at::Tensor row_conf = confidence[b].contiguous();
        const auto tokens = row_tokens.accessor<int64_t, 1>();
        const auto draft = row_draft.accessor<int64_t, 1>();
        const auto target = row_target.accessor<int64_t, 1>();
        const auto conf = row_conf.accessor<float, 1>();
        for (int64_t j = prompt_length; j + 1 < total; ++j) {
          agree += draft[j] == target[j];
          ++positions;
        }
        // Position prompt_length holds the first generated token, which prefill produced.
        for (int64_t j = prompt_length; j + 1 < total;) {
          int64_t accepted = 0;
          while (accepted < options.max_draft && j + accepted + 1 < total &&
                 conf[j + accepted] >= options.eta &&
                 draft[j + accepted] == tokens[j + accepted + 1]) {
            ++accepted;
          }
          ++rounds;
          emitted += accepted + 1;
          j += accepted + 1;
        }
      }
      return std::make_pair(static_cast<double>(emitted) / static_cast<double>(rounds),
                            static_cast<double>(agree) / static_cast<double>(positions));
    };
    for (size_t i = 0; i < options.eval_prompt_lengths.size(); ++i) {
      // Minutes at 1,024-token prompts on 2 cores (the teacher recomputes the whole sequence
      // for every token it adds): say what is going on.
      spdlog::info("distill: measuring the drafter's acceptance after {}-token held-out prompts",
                   options.eval_prompt_lengths[i]);
      const std::optional<std::pair<double, double>> measured =
          acceptance(options.eval_prompt_lengths[i]);
      if (!measured) continue;
      report.accept_length_by_prompt_length.emplace_back(options.eval_prompt_lengths[i],
                                                         measured->first);
      if (i == 0) {
        report.heldout_accept_length = measured->first;
        report.heldout_draft_top1 = measured->second;
      }
    }
  });
  at::set_num_threads(previous_threads);
  TOPHAT_RETURN_IF_ERROR(status);
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!report.finished) return report;

  info.num_parameters = report.adapter_parameters;
  info.distillation = {{"options", identity}, {"report", report.ToJson()}};
  TOPHAT_RETURN_IF_ERROR(WriteAdapter(options.out_dir, info, AdapterTensors(models)));
  std::error_code ec;
  fs::remove_all(state_dir, ec);
  if (into_bundle) {
    TOPHAT_RETURN_IF_ERROR(AttachAdapterToBundle(options.out_dir));
    report.attached_to_bundle = true;
  }
  return report;
}

}  // namespace tophat
