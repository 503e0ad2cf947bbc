#include "models/training/toy_model.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <map>
#include <numbers>
#include <random>

#include "absl/strings/str_cat.h"
#include "models/runtime/layers.h"
#include "models/runtime/model_init.h"
#include "models/tokenizers/sentencepiece_trainer_util.h"
#include "base/status_macros.h"
#include "models/tokenizers/chat_template.h"
#include "models/tokenizers/tokenizer.h"
#include "models/training/toy_corpus.h"
#include "models/training/training_forward.h"
#include "models/training/distill.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Bumped whenever the corpus, the architecture or the training recipe changes, so that a
// cached model from an older generator is not reused.
constexpr int kGeneratorVersion = 3;  // 3: outline answers in the corpus
constexpr char kStampFile[] = "tophat_toy_model.json";

}  // namespace

json ToyModelOptions::ToJson() const {
  return {{"generator_version", kGeneratorVersion},
          {"seed", seed},
          {"vocab_size", vocab_size},
          {"hidden_size", hidden_size},
          {"intermediate_size", intermediate_size},
          {"num_layers", num_layers},
          {"num_heads", num_heads},
          {"num_kv_heads", num_kv_heads},
          {"sequence_length", sequence_length},
          {"batch_size", batch_size},
          {"steps", steps},
          {"learning_rate", learning_rate},
          {"corpus_documents", corpus_documents},
          {"threads", threads}};
}

json ToyModelReport::ToJson() const {
  return {{"seconds", seconds},
          {"final_train_loss", final_train_loss},
          {"heldout_loss", heldout_loss},
          {"uniform_loss", uniform_loss},
          {"heldout_top1", heldout_top1},
          {"heldout_mean_max_prob", heldout_mean_max_prob}};
}

fs::path DefaultToyModelDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return fs::path(xdg) / "tophat" / "toy-model";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return fs::path(home) / ".cache" / "tophat" / "toy-model";
  }
  return fs::path(".cache") / "tophat" / "toy-model";
}

fs::path DefaultEvalModelDir() { return DefaultToyModelDir().parent_path() / "eval-model"; }

ToyModelOptions EvalModelOptions() {
  ToyModelOptions o;
  o.out_dir = DefaultEvalModelDir();
  o.hidden_size = 256;
  o.intermediate_size = 704;
  o.num_layers = 8;
  o.num_heads = 8;
  o.num_kv_heads = 2;
  o.sequence_length = 1024;
  o.batch_size = 4;
  o.steps = 600;
  o.learning_rate = 1.5e-3;
  o.corpus_documents = 40000;
  o.adapter_input_layers = 2;
  o.adapter_steps = 300;
  o.adapter_sequence_length = 1024;
  o.adapter_batch_size = 4;
  o.acceptance_prompt_lengths = {64, 512, 1024};
  return o;
}

ModelConfig ToyModelConfig(const ToyModelOptions& o) {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.vocab_size = o.vocab_size;
  c.hidden_size = o.hidden_size;
  c.intermediate_size = o.intermediate_size;
  c.num_hidden_layers = o.num_layers;
  c.num_attention_heads = o.num_heads;
  c.num_key_value_heads = o.num_kv_heads;
  c.head_dim = o.hidden_size / o.num_heads;
  c.max_position_embeddings = 2048;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

namespace {

absl::StatusOr<ToyModelReport> TrainToyModel(
    const ToyModelOptions& options,
    const std::function<void(const TrainingProgress&)>& on_progress) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  if (options.out_dir.empty()) return absl::InvalidArgumentError("toy-model: --out is required");
  if (options.hidden_size % options.num_heads != 0 || options.num_heads % options.num_kv_heads) {
    return absl::InvalidArgumentError(
        "toy-model: heads must divide hidden_size and kv heads must divide heads");
  }

  // Reuse a finished model made with the same options.
  const json wanted = options.ToJson();
  const json stamp = ReadJsonOrNull(options.out_dir / kStampFile);
  if (stamp.is_object() && stamp.value("options", json()) == wanted &&
      fs::exists(options.out_dir / "model.safetensors") &&
      fs::exists(options.out_dir / "tokenizer.model")) {
    ToyModelReport report;
    report.reused_cache = true;
    const json r = stamp.value("report", json::object());
    report.final_train_loss = r.value("final_train_loss", 0.0);
    report.heldout_loss = r.value("heldout_loss", 0.0);
    report.uniform_loss = r.value("uniform_loss", 0.0);
    report.heldout_top1 = r.value("heldout_top1", 0.0);
    report.heldout_mean_max_prob = r.value("heldout_mean_max_prob", 0.0);
    return report;
  }

  // Build in a sibling directory and rename at the end, so an interrupted run never leaves
  // a directory that looks finished.
  const fs::path staging = options.out_dir.string() + ".partial";
  std::error_code ec;
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(staging.string(), ": cannot create: ", ec.message()));
  }

  const std::vector<std::string> corpus =
      GenerateToyCorpus(options.seed, options.corpus_documents);
  TOPHAT_RETURN_IF_ERROR(TrainSentencePiece(corpus, static_cast<int>(options.vocab_size),
                                            staging / "tokenizer.model"));
  TOPHAT_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(staging));

  ModelConfig config = ToyModelConfig(options);
  config.vocab_size = tokenizer->vocab_size();
  const int32_t bos = tokenizer->bos_id().value_or(1);
  const int32_t eos = tokenizer->eos_id().value_or(2);
  config.bos_token_id = bos;
  config.eos_token_ids = {eos};

  // One token stream: <s> document </s> <s> document </s> ... Held-out documents are the
  // last 5%, never trained on.
  const size_t heldout_docs = std::max<size_t>(1, corpus.size() / 20);
  std::vector<int64_t> train_stream;
  std::vector<int64_t> heldout_stream;
  for (size_t d = 0; d < corpus.size(); ++d) {
    TOPHAT_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(corpus[d]));
    auto& stream = d + heldout_docs < corpus.size() ? train_stream : heldout_stream;
    stream.push_back(bos);
    stream.insert(stream.end(), ids.begin(), ids.end());
    stream.push_back(eos);
  }
  const int64_t seq = options.sequence_length;
  if (static_cast<int64_t>(train_stream.size()) < seq + 2 ||
      static_cast<int64_t>(heldout_stream.size()) < seq + 2) {
    return absl::InvalidArgumentError("toy-model: corpus too small for the sequence length");
  }

  ToyModelReport report;
  report.uniform_loss = std::log(static_cast<double>(config.vocab_size));
  NamedTensors trained;
  const int previous_threads = at::get_num_threads();
  at::set_num_threads(options.threads);
  absl::Status status = CatchExceptions("toy-model training", [&] {
    std::map<std::string, at::Tensor> weights;
    std::vector<std::string> names;  // checkpoint order
    std::vector<at::Tensor> parameters;
    for (auto& [name, tensor] : InitWeights(config, options.seed)) {
      tensor.set_requires_grad(true);
      parameters.push_back(tensor);
      names.push_back(name);
      weights.emplace(name, tensor);
    }
    const RopeTable rope = RopeTable::Create(config, seq, at::kCPU);
    torch::optim::AdamW optimizer(
        parameters, torch::optim::AdamWOptions(options.learning_rate).weight_decay(0.01));
    std::mt19937_64 rng(options.seed + 1);
    std::uniform_int_distribution<int64_t> offset_dist(
        0, static_cast<int64_t>(train_stream.size()) - seq - 2);
    const at::Tensor train_tokens = at::tensor(train_stream, at::kLong);
    double smoothed = 0.0;
    const auto train_start = Clock::now();
    for (int64_t step = 0; step < options.steps; ++step) {
      const double lr = WarmupCosineLearningRate(options.learning_rate, step, options.steps);
      for (auto& group : optimizer.param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      }
      std::vector<at::Tensor> rows;
      for (int64_t b = 0; b < options.batch_size; ++b) {
        rows.push_back(train_tokens.narrow(0, offset_dist(rng), seq + 1));
      }
      at::Tensor batch = at::stack(rows);
      at::Tensor inputs = batch.narrow(1, 0, seq);
      at::Tensor targets = batch.narrow(1, 1, seq);
      optimizer.zero_grad();
      at::Tensor logits = TrainingLogits(config, weights, rope, inputs);
      at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, config.vocab_size}),
                                               targets.reshape({-1}));
      loss.backward();
      torch::nn::utils::clip_grad_norm_(parameters, 1.0);
      optimizer.step();
      const double value = loss.item<double>();
      smoothed = step == 0 ? value : 0.9 * smoothed + 0.1 * value;
      if (on_progress && (step % 10 == 0 || step + 1 == options.steps)) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - train_start).count();
        on_progress(MakeTrainingProgress(step + 1, options.steps, step + 1, smoothed,
                                         options.batch_size * seq, elapsed));
      }
    }
    report.final_train_loss = smoothed;

    // Held-out evaluation over non-overlapping windows.
    at::NoGradGuard no_grad;
    const at::Tensor heldout = at::tensor(heldout_stream, at::kLong);
    const int64_t windows = std::min<int64_t>(32, (heldout.size(0) - 1) / seq);
    double loss_sum = 0.0;
    double correct = 0.0;
    double max_prob_sum = 0.0;
    for (int64_t w = 0; w < windows; ++w) {
      at::Tensor window = heldout.narrow(0, w * seq, seq + 1).unsqueeze(0);
      at::Tensor logits = TrainingLogits(config, weights, rope, window.narrow(1, 0, seq))[0];
      at::Tensor targets = window.narrow(1, 1, seq)[0];
      loss_sum += at::cross_entropy_loss(logits, targets).item<double>();
      correct += logits.argmax(-1).eq(targets).to(at::kDouble).mean().item<double>();
      max_prob_sum += at::softmax(logits, -1).amax(-1).mean().item<double>();
    }
    report.heldout_loss = loss_sum / static_cast<double>(windows);
    report.heldout_top1 = correct / static_cast<double>(windows);
    report.heldout_mean_max_prob = max_prob_sum / static_cast<double>(windows);

    for (const std::string& name : names) trained.emplace_back(name, weights.at(name).detach());
  });
  at::set_num_threads(previous_threads);
  TOPHAT_RETURN_IF_ERROR(status);
  TOPHAT_RETURN_IF_ERROR(WriteCheckpoint(config, trained, staging));

  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  {
    std::ofstream out(staging / kStampFile);
    out << json{{"options", wanted}, {"report", report.ToJson()}}.dump(2) << "\n";
  }
  fs::remove_all(options.out_dir, ec);
  fs::create_directories(options.out_dir.parent_path(), ec);
  fs::rename(staging, options.out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot move ", staging.string(), " to ",
                                            options.out_dir.string(), ": ", ec.message()));
  }
  return report;
}

// tokenizer_config.json with the toy chat template (chat_template.h), so that chat front ends
// (the agent's OpenAI endpoint) can render conversations for the toy models. Not part of the
// cache key: written beside a reused model too.
absl::Status WriteToyTokenizerConfig(const fs::path& dir) {
  const fs::path path = dir / "tokenizer_config.json";
  const json wanted = {{"chat_template", std::string(kToyChatTemplateSource)}};
  if (ReadJsonOrNull(path) == wanted) return absl::OkStatus();
  std::ofstream out(path);
  out << wanted.dump(2) << "\n";
  if (!out) return absl::InternalError(absl::StrCat(path.string(), ": cannot write"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ToyModelReport> MakeToyModel(
    const ToyModelOptions& options,
    const std::function<void(const TrainingProgress&)>& on_progress,
    const std::function<void(const TrainingProgress&)>& on_adapter_progress) {
  TOPHAT_ASSIGN_OR_RETURN(ToyModelReport report, TrainToyModel(options, on_progress));
  TOPHAT_RETURN_IF_ERROR(WriteToyTokenizerConfig(options.out_dir));
  if (options.adapter_input_layers <= 0) return report;
  DistillOptions distill;
  distill.model_dir = options.out_dir;
  distill.out_dir = options.out_dir;
  distill.input_layers = options.adapter_input_layers;
  distill.steps = options.adapter_steps;
  distill.sequence_length = options.adapter_sequence_length;
  distill.batch_size = options.adapter_batch_size;
  distill.eval_prompt_lengths = options.acceptance_prompt_lengths;
  // Long prompts: four of each length (the teacher recomputes the whole sequence per token).
  if (!options.acceptance_prompt_lengths.empty() &&
      *std::max_element(options.acceptance_prompt_lengths.begin(),
                        options.acceptance_prompt_lengths.end()) > 256) {
    distill.eval_prompts = 4;
  }
  // Long windows need a longer stream than the default 4,000 documents' ~150 K tokens.
  if (options.adapter_sequence_length > 256) distill.toy_documents = 20000;
  // Fresh documents from the same grammar, so the held-out estimate is not on training text.
  distill.seed = options.seed + 1;
  distill.threads = options.threads;
  TOPHAT_ASSIGN_OR_RETURN(DistillReport adapter, Distill(distill, on_adapter_progress));
  report.adapter_reused = adapter.reused;
  report.adapter_seconds = adapter.seconds;
  report.adapter_heldout_accept_length = adapter.heldout_accept_length;
  report.adapter_accept_length_by_prompt_length = adapter.accept_length_by_prompt_length;
  report.adapter_parameters = adapter.adapter_parameters;
  report.model_parameters = adapter.model_parameters;
  return report;
}

}  // namespace tophat
