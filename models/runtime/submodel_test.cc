#include "models/runtime/submodel.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <deque>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/test_util.h"
#include "kernels/gemm_f32.h"
#include "models/runtime/generate.h"
#include "models/runtime/layers.h"
#include "models/runtime/model_init.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;

// A fresh directory for this process's case, removed when the process exits (each CTest
// case is its own process, so nothing piles up in the temp directory across runs).
fs::path TempDir(const std::string& name) {
  static std::deque<testing::TempDir> dirs;
  return dirs.emplace_back().path() / name;
}

struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<CheckpointReader> checkpoint;
  std::unique_ptr<Submodel> full;
};

LoadedModel MakeModel(const ModelConfig& config, const std::string& name, uint64_t seed = 7) {
  fs::path dir = TempDir(name);
  REQUIRE(WriteCheckpoint(config, InitWeights(config, seed), dir).ok());
  LoadedModel m;
  m.config = config;
  auto checkpoint = CheckpointReader::Open(dir);
  REQUIRE(checkpoint.ok());
  m.checkpoint = std::move(*checkpoint);
  auto full = Submodel::Load(config, *m.checkpoint, SubmodelSpec::Full(config));
  REQUIRE(full.ok());
  m.full = std::move(*full);
  return m;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> out(n);
  for (auto& t : out) t = dist(rng);
  return out;
}

at::Tensor Ids(const std::vector<int32_t>& tokens) {
  return at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), at::kLong);
}

// A deliberately different formulation of the Llama forward (explicit repeat_kv, rotate_half
// with duplicated cos/sin, additive mask) to check Submodel against, on a whole sequence,
// in every build (no Python needed). The arbiter is transformers (tests/hf_reference_test.py):
// this takes its rotary table from RopeTable, so it cannot see a wrong rope.
at::Tensor ReferenceLogits(const ModelConfig& c, const std::map<std::string, at::Tensor>& w,
                           const std::vector<int32_t>& tokens) {
  const int64_t t = static_cast<int64_t>(tokens.size());
  const int64_t hd = c.head_dim;
  // Gemma's norms scale by 1 + g.
  const double offset = c.gemma() ? 1.0 : 0.0;
  auto norm = [&](const at::Tensor& x, const at::Tensor& g) {
    return x / at::sqrt((x * x).mean(-1, true) + c.rms_norm_eps) * (g + offset);
  };
  RopeTable rope = RopeTable::Create(c, t, at::kCPU);
  RopeTable local_rope = RopeTable::CreateLocal(c, t, at::kCPU);
  // transformers' partial rotary (Phi-3) in the stored order: the first rotary_dim dimensions
  // turn by the table's first rotary_dim / 2 columns, the rest pass (the runtime reorders
  // the heads instead: RotaryHeadOrder).
  const int64_t rd = c.rotary_dim();
  auto rotate = [&](const at::Tensor& x, const RopeTable& table) {
    const at::Tensor turned_cos = table.cos.narrow(-1, 0, rd / 2);
    const at::Tensor turned_sin = table.sin.narrow(-1, 0, rd / 2);
    at::Tensor cos = at::cat({turned_cos, turned_cos}, -1).unsqueeze(1);  // [t, 1, rd]
    at::Tensor sin = at::cat({turned_sin, turned_sin}, -1).unsqueeze(1);
    at::Tensor turned = x.narrow(-1, 0, rd);
    at::Tensor x1 = turned.narrow(-1, 0, rd / 2);
    at::Tensor x2 = turned.narrow(-1, rd / 2, rd / 2);
    return at::cat({turned * cos + at::cat({-x2, x1}, -1) * sin, x.narrow(-1, rd, hd - rd)}, -1);
  };
  const at::Tensor causal = at::full({t, t}, -INFINITY).triu(1);
  at::Tensor x = w.at("model.embed_tokens.weight").index_select(0, Ids(tokens));
  if (c.gemma()) x = x * std::sqrt(static_cast<double>(c.hidden_size));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    at::Tensor mask = causal;
    if (const std::optional<int64_t> window = c.LayerWindow(i)) {
      mask = mask + at::full({t, t}, -INFINITY).tril(-*window);
    }
    const RopeTable& table = c.LocalRope(i) ? local_rope : rope;
    auto p = [&](const std::string& s) { return w.at(LayerTensorName(i, s)); };
    auto maybe = [&](const std::string& s) {
      auto it = w.find(LayerTensorName(i, s));
      return it == w.end() ? at::Tensor() : it->second;
    };
    at::Tensor h = norm(x, p("input_layernorm.weight"));
    at::Tensor q = at::linear(h, p("self_attn.q_proj.weight"), maybe("self_attn.q_proj.bias"));
    at::Tensor k = at::linear(h, p("self_attn.k_proj.weight"), maybe("self_attn.k_proj.bias"));
    at::Tensor v = at::linear(h, p("self_attn.v_proj.weight"), maybe("self_attn.v_proj.bias"));
    q = q.view({t, c.num_attention_heads, hd});
    k = k.view({t, c.num_key_value_heads, hd});
    // Qwen3: each head normed by the layer's [hd] weights before rotary.
    if (const at::Tensor q_norm = maybe("self_attn.q_norm.weight"); q_norm.defined()) {
      q = norm(q, q_norm);
      k = norm(k, p("self_attn.k_norm.weight"));
    }
    q = rotate(q, table);
    k = rotate(k, table);
    v = v.view({t, c.num_key_value_heads, hd});
    const int64_t group = c.num_attention_heads / c.num_key_value_heads;
    k = k.repeat_interleave(group, 1);
    v = v.repeat_interleave(group, 1);
    const double scalar = c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : double(hd);
    at::Tensor scores = at::einsum("thd,shd->hts", {q, k}) / std::sqrt(scalar);
    if (c.attn_logit_softcapping > 0) {  // Gemma 2: cap * tanh(s / cap)
      scores = c.attn_logit_softcapping * at::tanh(scores / c.attn_logit_softcapping);
    }
    scores = scores + mask;
    at::Tensor probs;
    if (const at::Tensor sinks = maybe("self_attn.sinks"); sinks.defined()) {
      // gpt-oss: a sink logit per head joins the softmax and is dropped after it.
      const at::Tensor column = sinks.view({-1, 1, 1}).expand({-1, t, 1});
      probs = at::softmax(at::cat({scores, column}, -1), -1).narrow(-1, 0, t);
    } else {
      probs = at::softmax(scores, -1);
    }
    at::Tensor out = at::einsum("hts,shd->thd", {probs, v}).reshape({t, -1});
    out = at::linear(out, p("self_attn.o_proj.weight"), maybe("self_attn.o_proj.bias"));
    if (c.gemma()) {
      // Gemma: each sublayer's output normed before its add; a GELU (tanh) gate.
      x = x + norm(out, p("post_attention_layernorm.weight"));
      h = norm(x, p("pre_feedforward_layernorm.weight"));
      const at::Tensor gate = at::linear(h, p("mlp.gate_proj.weight"));
      const at::Tensor gelu =
          0.5 * gate * (1 + at::tanh(std::sqrt(2 / M_PI) * (gate + 0.044715 * gate.pow(3))));
      const at::Tensor mlp = gelu * at::linear(h, p("mlp.up_proj.weight"));
      x = x +
          norm(at::linear(mlp, p("mlp.down_proj.weight")), p("post_feedforward_layernorm.weight"));
      continue;
    }
    x = x + out;
    h = norm(x, p("post_attention_layernorm.weight"));
    if (c.MoeLayer(i) && c.gpt_oss()) {
      // transformers' GptOssMLP: the router's top K logits softmaxed; each expert from the
      // fused tensors as stored (x @ W, gate and up interleaved), its SwiGLU clamped.
      const at::Tensor logits = at::linear(h, w.at(RouterTensorName(c, i)), p("mlp.router.bias"));
      auto [top, chosen] = at::topk(logits, c.num_experts_per_token, -1);
      const at::Tensor gates = at::zeros_like(logits).scatter(1, chosen, at::softmax(top, -1));
      at::Tensor mixed = at::zeros_like(x);
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const at::Tensor gate_up =
            at::matmul(h, p("mlp.experts.gate_up_proj")[e]) + p("mlp.experts.gate_up_proj_bias")[e];
        const at::Tensor gate = gate_up.slice(-1, 0, gate_up.size(-1), 2).clamp_max(7.0);
        const at::Tensor up = gate_up.slice(-1, 1, gate_up.size(-1), 2).clamp(-7.0, 7.0);
        const at::Tensor act = (up + 1) * (gate * at::sigmoid(gate * 1.702));
        const at::Tensor expert =
            at::matmul(act, p("mlp.experts.down_proj")[e]) + p("mlp.experts.down_proj_bias")[e];
        mixed = mixed + gates.narrow(1, e, 1) * expert;
      }
      x = x + mixed;
      continue;
    }
    if (c.MoeLayer(i)) {
      // Every expert on every token, weighted by a gate that is zero outside the top K.
      const at::Tensor probs = at::softmax(at::linear(h, w.at(RouterTensorName(c, i))), -1);
      auto [top, chosen] = at::topk(probs, c.num_experts_per_token, -1);
      if (c.normalize_expert_weights) top = top / top.sum(-1, true);
      const at::Tensor gates = at::zeros_like(probs).scatter(1, chosen, top);
      at::Tensor mixed = at::zeros_like(x);
      for (int64_t e = 0; e < c.num_experts; ++e) {
        auto m = [&](ExpertMatrix role) { return w.at(ExpertTensorName(c, i, e, role)); };
        const at::Tensor expert = at::linear(
            at::silu(at::linear(h, m(ExpertMatrix::kGate))) * at::linear(h, m(ExpertMatrix::kUp)),
            m(ExpertMatrix::kDown));
        mixed = mixed + gates.narrow(1, e, 1) * expert;
      }
      if (c.shared_expert_intermediate_size > 0) {
        auto m = [&](ExpertMatrix role) { return w.at(SharedExpertTensorName(i, role)); };
        const at::Tensor shared = at::linear(
            at::silu(at::linear(h, m(ExpertMatrix::kGate))) * at::linear(h, m(ExpertMatrix::kUp)),
            m(ExpertMatrix::kDown));
        mixed = mixed + at::sigmoid(at::linear(h, w.at(SharedExpertGateTensorName(i)))) * shared;
      }
      x = x + mixed;
      continue;
    }
    at::Tensor mlp = at::silu(at::linear(h, p("mlp.gate_proj.weight"))) *
                     at::linear(h, p("mlp.up_proj.weight"));
    x = x + at::linear(mlp, p("mlp.down_proj.weight"));
  }
  x = norm(x, w.at("model.norm.weight"));
  const at::Tensor& head = c.tie_word_embeddings ? w.at("model.embed_tokens.weight")
                                                 : w.at("lm_head.weight");
  const at::Tensor logits = at::linear(x, head);
  const double cap = c.final_logit_softcapping;
  return cap > 0 ? cap * at::tanh(logits / cap) : logits;
}

at::Tensor FullLogits(const Submodel& model, const std::vector<int32_t>& tokens) {
  KvCache cache = model.NewCache();
  auto hidden = model.Embed(Ids(tokens));
  REQUIRE(hidden.ok());
  auto out = model.Forward(*hidden, cache);
  REQUIRE(out.ok());
  auto logits = model.Logits(*out);
  REQUIRE(logits.ok());
  return *logits;
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST_CASE("A device that is not there fails the load with UNAVAILABLE naming it, before any "
          "weight loads", "[submodel]") {
  LoadedModel m = MakeModel(TinyTestConfig(), "absent_device");
  // No host has a 100th GPU: on a GPU server the index is past the driver's count, on a
  // CPU machine the driver is missing; either way the message names the device.
  auto loaded = Submodel::Load(m.config, *m.checkpoint, SubmodelSpec::Middle(m.config, 1, 1),
                               {.device = at::Device("cuda:99")});
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kUnavailable);
  INFO(loaded.status().ToString());
  CHECK(loaded.status().message().find("device cuda:99 is not") != std::string::npos);
  if (!at::hasCUDA()) {
    // And the device of no index, on a machine without a driver, the same way.
    auto current = Submodel::Load(m.config, *m.checkpoint, SubmodelSpec::Middle(m.config, 1, 1),
                                  {.device = at::Device("cuda")});
    REQUIRE_FALSE(current.ok());
    CHECK(current.status().code() == absl::StatusCode::kUnavailable);
    CHECK(current.status().message().find("device cuda is not usable") != std::string::npos);
  }
}

TEST_CASE(
    "Gemma 2 and 3 and the mixtures of experts on a GPU are refused before anything loads, "
    "naming the architecture",
    "[submodel]") {
  int cpu_only = 0;
  for (const auto& [name, config] : TinyTestVariants()) {
    if (!config.gemma() && config.num_experts == 0) continue;
    ++cpu_only;
    INFO(name);
    LoadedModel m = MakeModel(config, name + "_gpu");
    // Before the device is even asked for: the same on a machine with or without a GPU.
    auto loaded = Submodel::Load(m.config, *m.checkpoint, SubmodelSpec::Middle(m.config, 1, 1),
                                 {.device = at::Device("cuda:0")});
    REQUIRE_FALSE(loaded.ok());
    CHECK(loaded.status().code() == absl::StatusCode::kUnimplemented);
    CHECK_THAT(std::string(loaded.status().message()),
               Catch::Contains(absl::StrCat(std::string(ArchitectureName(config.architecture)),
                                            " runs on the CPU only for now (cuda:0 asked)")));
  }
  CHECK(cpu_only == 6);
}

TEST_CASE("A mixture of experts holds every expert, and a token reads K of them", "[submodel]") {
  int mixtures = 0;
  for (const auto& [name, config] : TinyTestVariants()) {
    if (config.num_experts == 0) continue;
    ++mixtures;
    INFO(name);
    LoadedModel m = MakeModel(config, name + "_bytes");
    CHECK(m.full->StoredWeightBytes() == 4 * config.ParameterCount());
    auto middle = Submodel::Load(config, *m.checkpoint, SubmodelSpec::Middle(config, 1, 1));
    REQUIRE(middle.ok());
    // gpt-oss's experts have two biases each.
    const int64_t expert_bytes =
        4 * (3 * config.hidden_size * config.moe_intermediate_size +
             (config.gpt_oss() ? 2 * config.moe_intermediate_size + config.hidden_size : 0));
    int64_t unread = 0;  // the experts a token does not read
    for (int64_t layer = 1; layer < config.num_hidden_layers - 1; ++layer) {
      if (config.MoeLayer(layer)) {
        unread += (config.num_experts - config.num_experts_per_token) * expert_bytes;
      }
    }
    CHECK(unread > 0);
    CHECK((*middle)->StoredWeightBytes() - (*middle)->WeightBytes() == unread);
    // A step that computed every expert of its sparse layers read all it stores.
    const int64_t sparse_layers =
        unread / ((config.num_experts - config.num_experts_per_token) * expert_bytes);
    CHECK((*middle)->WeightBytesRead(sparse_layers * config.num_experts) ==
          (*middle)->StoredWeightBytes());
  }
  CHECK(mixtures == 4);
}

TEST_CASE("Full model matches an independent reference formulation", "[submodel]") {
  std::mt19937 rng(1);
  for (const auto& [name, config] : TinyTestVariants()) {
    SECTION(name) {
      LoadedModel m = MakeModel(config, name);
      std::map<std::string, at::Tensor> weights;
      for (auto& [n, t] : InitWeights(config, 7)) weights.emplace(n, t);
      auto tokens = RandomTokens(rng, 23, config.vocab_size);
      at::Tensor ours = FullLogits(*m.full, tokens);
      at::Tensor ref = ReferenceLogits(config, weights, tokens);
      CHECK(MaxDiff(ours, ref) < 1e-4);
    }
  }
}

TEST_CASE("Chunks attending through scaled_dot_product_attention match the reference",
          "[submodel]") {
  // Float64 takes the fused-attention path (as every GPU dtype does): a first chunk plainly
  // causal, later chunks with history and, for the sliding-window variant, a window, each
  // by its own mask. Chunked prefill then decode against the whole-sequence reference.
  std::mt19937 rng(31);
  for (const auto& [name, config] : TinyTestVariants()) {
    SECTION(name) {
      LoadedModel m = MakeModel(config, name);
      auto model = Submodel::Load(config, *m.checkpoint, SubmodelSpec::Full(config),
                                  {.dtype = at::kDouble});
      REQUIRE(model.ok());
      std::map<std::string, at::Tensor> weights;
      for (auto& [n, t] : InitWeights(config, 7)) weights.emplace(n, t);
      const auto tokens = RandomTokens(rng, 17, config.vocab_size);
      KvCache cache = (*model)->NewCache();
      std::vector<at::Tensor> logits;
      size_t begin = 0;
      for (size_t n : {5, 4, 3, 1, 1, 3}) {
        const std::vector<int32_t> chunk(tokens.begin() + begin, tokens.begin() + begin + n);
        begin += n;
        auto hidden = (*model)->Forward(*(*model)->Embed(Ids(chunk)), cache);
        REQUIRE(hidden.ok());
        logits.push_back(*(*model)->Logits(*hidden));
      }
      const at::Tensor ref = ReferenceLogits(config, weights, tokens);
      CHECK(MaxDiff(at::cat(logits).to(at::kFloat), ref) < 1e-4);
    }
  }
}

TEST_CASE("Split input -> middle -> output equals the monolithic model", "[submodel][split]") {
  std::mt19937 rng(2);
  for (const auto& [name, config] : TinyTestVariants()) {
    LoadedModel m = MakeModel(config, name);
    for (int64_t input_layers : {1, 2}) {
      for (int64_t output_layers : {0, 1}) {
        auto input = Submodel::Load(config, *m.checkpoint, SubmodelSpec::Input(input_layers));
        auto middle = Submodel::Load(
            config, *m.checkpoint, SubmodelSpec::Middle(config, input_layers, output_layers));
        auto output =
            Submodel::Load(config, *m.checkpoint, SubmodelSpec::Output(config, output_layers));
        REQUIRE(input.ok());
        REQUIRE(middle.ok());
        REQUIRE(output.ok());
        for (int trial = 0; trial < 3; ++trial) {
          auto tokens = RandomTokens(rng, 5 + trial * 9, config.vocab_size);
          KvCache ci = (*input)->NewCache();
          KvCache cm = (*middle)->NewCache();
          KvCache co = (*output)->NewCache();
          at::Tensor h = *(*input)->Embed(Ids(tokens));
          h = *(*input)->Forward(h, ci);
          h = *(*middle)->Forward(h, cm);
          h = *(*output)->Forward(h, co);
          at::Tensor split_logits = *(*output)->Logits(h);
          at::Tensor full_logits = FullLogits(*m.full, tokens);
          INFO(name << " m=" << input_layers << " k=" << output_layers);
          CHECK(MaxDiff(split_logits, full_logits) <= 1e-5);
        }
        // The split path's greedy tokens are identical to the monolithic model's.
        auto split_gen = PipelineGenerator::Create({input->get(), middle->get(), output->get()});
        auto full_gen = PipelineGenerator::Create({m.full.get()});
        REQUIRE(split_gen.ok());
        REQUIRE(full_gen.ok());
        GenerationOptions options{.max_new_tokens = 24};
        auto prompt = RandomTokens(rng, 11, config.vocab_size);
        auto a = split_gen->Generate(prompt, options);
        auto b = full_gen->Generate(prompt, options);
        REQUIRE(a.ok());
        REQUIRE(b.ok());
        CHECK(a->tokens == b->tokens);
      }
    }
  }
}

TEST_CASE("Incremental decoding with the KV cache equals full recomputation", "[submodel]") {
  std::mt19937 rng(3);
  for (const auto& [name, config] : TinyTestVariants()) {
    LoadedModel m = MakeModel(config, name);
    auto tokens = RandomTokens(rng, 20, config.vocab_size);
    at::Tensor full = FullLogits(*m.full, tokens);
    KvCache cache = m.full->NewCache();
    for (size_t i = 0; i < tokens.size(); ++i) {
      at::Tensor h = *m.full->Embed(Ids({tokens[i]}));
      at::Tensor logits = *m.full->Logits(*m.full->Forward(h, cache));
      INFO(name << " position " << i);
      CHECK(MaxDiff(logits[0], full[static_cast<int64_t>(i)]) < 1e-5);
    }
    CHECK(cache.length() == static_cast<int64_t>(tokens.size()));
  }
}

TEST_CASE("Chunked prefill of mixed chunk sizes equals one-shot prefill", "[submodel]") {
  std::mt19937 rng(4);
  for (const auto& [name, config] : TinyTestVariants()) {
    LoadedModel m = MakeModel(config, name);
    auto tokens = RandomTokens(rng, 1 + 7 + 64 + 7 + 1, config.vocab_size);
    at::Tensor full = FullLogits(*m.full, tokens);
    KvCache cache = m.full->NewCache();
    std::vector<at::Tensor> pieces;
    size_t begin = 0;
    for (size_t size : {1, 7, 64, 7, 1}) {
      std::vector<int32_t> chunk(tokens.begin() + begin, tokens.begin() + begin + size);
      at::Tensor h = *m.full->Embed(Ids(chunk));
      pieces.push_back(*m.full->Logits(*m.full->Forward(h, cache)));
      begin += size;
    }
    INFO(name);
    CHECK(MaxDiff(at::cat(pieces), full) < 1e-5);
  }
}

TEST_CASE("Batched forward of several sequences equals running each alone", "[submodel]") {
  std::mt19937 rng(5);
  LoadedModel m = MakeModel(TinyTestConfig(), "batched");
  auto a = RandomTokens(rng, 9, 300);
  auto b = RandomTokens(rng, 4, 300);
  KvCache ca = m.full->NewCache();
  KvCache cb = m.full->NewCache();
  // Give the sequences different histories so that positions differ inside the batch.
  REQUIRE(m.full->Forward(*m.full->Embed(Ids({a[0], a[1], a[2]})), ca).ok());
  std::vector<int32_t> a_rest(a.begin() + 3, a.end());
  at::Tensor h = at::cat({*m.full->Embed(Ids(a_rest)), *m.full->Embed(Ids(b))});
  SequenceChunk chunks[] = {{&ca, static_cast<int64_t>(a_rest.size())},
                            {&cb, static_cast<int64_t>(b.size())}};
  at::Tensor batched = *m.full->Logits(*m.full->Forward(h, chunks));
  at::Tensor ref_a = FullLogits(*m.full, a).narrow(0, 3, a_rest.size());
  at::Tensor ref_b = FullLogits(*m.full, b);
  CHECK(MaxDiff(batched.narrow(0, 0, a_rest.size()), ref_a) < 1e-5);
  CHECK(MaxDiff(batched.narrow(0, a_rest.size(), b.size()), ref_b) < 1e-5);
  CHECK(ca.length() == 9);
  CHECK(cb.length() == 4);
}

TEST_CASE("KV truncation rolls back to an earlier state", "[submodel]") {
  std::mt19937 rng(6);
  LoadedModel m = MakeModel(TinyTestConfig(), "truncate");
  auto tokens = RandomTokens(rng, 12, 300);
  at::Tensor full = FullLogits(*m.full, tokens);
  KvCache cache = m.full->NewCache();
  std::vector<int32_t> head(tokens.begin(), tokens.begin() + 8);
  REQUIRE(m.full->Forward(*m.full->Embed(Ids(head)), cache).ok());
  // Speculate three wrong tokens, then roll back and continue with the right ones.
  REQUIRE(m.full->Forward(*m.full->Embed(Ids({5, 6, 7})), cache).ok());
  REQUIRE(cache.Truncate(8).ok());
  std::vector<int32_t> tail(tokens.begin() + 8, tokens.end());
  at::Tensor logits = *m.full->Logits(*m.full->Forward(*m.full->Embed(Ids(tail)), cache));
  CHECK(MaxDiff(logits, full.narrow(0, 8, 4)) < 1e-5);
  CHECK_FALSE(cache.Truncate(13).ok());
}

TEST_CASE("Forward rejects malformed input with a clear error", "[submodel]") {
  LoadedModel m = MakeModel(TinyTestConfig(), "errors");
  KvCache cache = m.full->NewCache(4);
  auto wrong_width = m.full->Forward(at::zeros({2, 65}), cache);
  REQUIRE_FALSE(wrong_width.ok());
  CHECK_THAT(std::string(wrong_width.status().message()), Catch::Contains("[T, 64]"));
  auto wrong_dtype = m.full->Forward(at::zeros({2, 64}, at::kDouble), cache);
  REQUIRE_FALSE(wrong_dtype.ok());
  auto overflow = m.full->Forward(at::zeros({5, 64}), cache);
  REQUIRE_FALSE(overflow.ok());
  CHECK(overflow.status().code() == absl::StatusCode::kResourceExhausted);
  auto bad_id = m.full->Embed(Ids({300}));
  REQUIRE_FALSE(bad_id.ok());
  CHECK_THAT(std::string(bad_id.status().message()), Catch::Contains("300"));
}

// A stand-in for the cloud's block allocator: hands out a pool's ids in a shuffled order, as
// a free list does after churn, so a sequence's blocks are neither consecutive nor sorted.
class ShuffledBlocks {
 public:
  ShuffledBlocks(int64_t num_blocks, uint32_t seed) : free_(static_cast<size_t>(num_blocks)) {
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), std::mt19937(seed));
  }
  // Appends blocks until `cache` can hold `positions` positions.
  void Grow(KvCache& cache, int64_t positions) {
    while (cache.capacity() < positions) {
      REQUIRE_FALSE(free_.empty());
      cache.AppendBlock(free_.back());
      free_.pop_back();
    }
  }
  void Free(const std::vector<int32_t>& ids) { free_.insert(free_.end(), ids.begin(), ids.end()); }
  size_t num_free() const { return free_.size(); }

 private:
  std::vector<int32_t> free_;
};

// Equal to float32's rounding: within 1e-6 of each other, or of the largest value where the
// states are larger than 1 (Gemma's, normed before each residual add, reach 8 here; a GEMM
// of another row count sums in another order, a few units in the last place apart).
bool Same(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(1.0, b.abs().max().item<double>());
  return at::allclose(a, b, 1e-6, 1e-6 * scale);
}

TEST_CASE("Paged and contiguous KV caches give identical hidden states", "[submodel][paged]") {
  std::mt19937 rng(11);
  for (const auto& [name, config] : TinyTestVariants()) {
    LoadedModel m = MakeModel(config, name);
    auto tokens = RandomTokens(rng, 30, config.vocab_size);
    // 1: every position its own block; 64: one block longer than the sequence.
    for (int64_t block_size : {1, 3, 4, 16, 64}) {
      auto pool = m.full->NewPagedPool(40, block_size);
      REQUIRE(pool.ok());
      ShuffledBlocks blocks(40, static_cast<uint32_t>(block_size));
      KvCache paged(*pool);
      KvCache contiguous = m.full->NewCache();
      size_t begin = 0;
      // Prompt chunks that start and end inside blocks, then decode steps.
      for (size_t size : {5, 7, 1, 9, 1, 1, 1, 1, 1, 1, 1, 1}) {
        std::vector<int32_t> chunk(tokens.begin() + begin, tokens.begin() + begin + size);
        at::Tensor h = *m.full->Embed(Ids(chunk));
        auto expected = m.full->Forward(h, contiguous);
        blocks.Grow(paged, paged.length() + static_cast<int64_t>(size));
        auto actual = m.full->Forward(h, paged);
        REQUIRE(expected.ok());
        REQUIRE(actual.ok());
        INFO(name << " block_size=" << block_size << " positions " << begin << ".."
                  << begin + size);
        CHECK(Same(*actual, *expected));
        begin += size;
      }
      CHECK(paged.length() == 30);
      CHECK(static_cast<int64_t>(paged.block_table().size()) == (*pool)->BlocksFor(30));
    }
  }
}

TEST_CASE("A batch of paged sequences equals each sequence alone", "[submodel][paged]") {
  std::mt19937 rng(12);
  for (const auto& [name, config] : TinyTestVariants()) {
    LoadedModel m = MakeModel(config, name);
    for (int64_t block_size : {1, 4}) {
      auto pool = m.full->NewPagedPool(100, block_size);
      REQUIRE(pool.ok());
      ShuffledBlocks blocks(100, 5);
      // Different histories, then one batched chunk each (a decode step for two of them).
      const std::vector<int64_t> history = {0, 3, 9, 17};
      const std::vector<int64_t> chunk_size = {6, 1, 5, 1};
      std::vector<KvCache> paged;
      std::vector<KvCache> alone;
      std::vector<at::Tensor> inputs;
      std::vector<at::Tensor> expected;
      for (size_t i = 0; i < history.size(); ++i) {
        auto tokens = RandomTokens(rng, history[i] + chunk_size[i], config.vocab_size);
        at::Tensor h = *m.full->Embed(Ids(tokens));
        paged.emplace_back(*pool);
        alone.push_back(m.full->NewCache());
        auto past = h.narrow(0, 0, history[i]);
        // Grow the sequences in turn, so that their blocks interleave in the pool.
        blocks.Grow(paged[i], history[i]);
        REQUIRE(m.full->Forward(past, paged[i]).ok());
        REQUIRE(m.full->Forward(past, alone[i]).ok());
        inputs.push_back(h.narrow(0, history[i], chunk_size[i]));
        expected.push_back(*m.full->Forward(inputs.back(), alone[i]));
      }
      std::vector<SequenceChunk> chunks;
      for (size_t i = 0; i < paged.size(); ++i) {
        blocks.Grow(paged[i], history[i] + chunk_size[i]);
        chunks.push_back({&paged[i], chunk_size[i]});
      }
      auto batched = m.full->Forward(at::cat(inputs), chunks);
      REQUIRE(batched.ok());
      int64_t row = 0;
      for (size_t i = 0; i < paged.size(); ++i) {
        INFO(name << " block_size=" << block_size << " sequence " << i);
        CHECK(Same(batched->narrow(0, row, chunk_size[i]), expected[i]));
        CHECK(paged[i].length() == history[i] + chunk_size[i]);
        row += chunk_size[i];
      }

      // One decode step for all four, with a contiguous cache in the same batch.
      std::vector<at::Tensor> step_inputs;
      std::vector<at::Tensor> step_expected;
      KvCache mixed = m.full->NewCache();
      REQUIRE(m.full->Forward(inputs[0], mixed).ok());
      at::Tensor mixed_input = *m.full->Embed(Ids({7}));
      chunks.clear();
      for (size_t i = 0; i < paged.size(); ++i) {
        step_inputs.push_back(*m.full->Embed(Ids({static_cast<int32_t>(10 + i)})));
        step_expected.push_back(*m.full->Forward(step_inputs.back(), alone[i]));
        blocks.Grow(paged[i], paged[i].length() + 1);
        chunks.push_back({&paged[i], 1});
      }
      step_inputs.push_back(mixed_input);
      chunks.push_back({&mixed, 1});
      KvCache mixed_alone = m.full->NewCache();
      REQUIRE(m.full->Forward(inputs[0], mixed_alone).ok());
      step_expected.push_back(*m.full->Forward(mixed_input, mixed_alone));
      auto step = m.full->Forward(at::cat(step_inputs), chunks);
      REQUIRE(step.ok());
      for (size_t i = 0; i < chunks.size(); ++i) {
        INFO(name << " block_size=" << block_size << " decode, sequence " << i);
        CHECK(Same((*step)[static_cast<int64_t>(i)], step_expected[i][0]));
      }
    }
  }
}

TEST_CASE("A paged cache rolls back and grows again (speculative rejection)",
          "[submodel][paged]") {
  std::mt19937 rng(13);
  for (const auto& [name, config] : TinyTestVariants()) {
    LoadedModel m = MakeModel(config, name);
    auto tokens = RandomTokens(rng, 16, config.vocab_size);
    at::Tensor full = FullLogits(*m.full, tokens);
    for (int64_t block_size : {1, 3, 8}) {
      for (bool release : {false, true}) {
        auto pool = m.full->NewPagedPool(32, block_size);
        REQUIRE(pool.ok());
        ShuffledBlocks blocks(32, 9);
        KvCache cache(*pool);
        std::vector<int32_t> head(tokens.begin(), tokens.begin() + 10);
        blocks.Grow(cache, 10);
        REQUIRE(m.full->Forward(*m.full->Embed(Ids(head)), cache).ok());
        // Speculate five wrong tokens (into new blocks), then roll back to 10.
        blocks.Grow(cache, 15);
        REQUIRE(m.full->Forward(*m.full->Embed(Ids({5, 6, 7, 8, 9})), cache).ok());
        REQUIRE(cache.Truncate(10).ok());
        if (release) {
          std::vector<int32_t> freed = cache.ReleaseUnusedBlocks();
          CHECK(static_cast<int64_t>(freed.size()) ==
                (*pool)->BlocksFor(15) - (*pool)->BlocksFor(10));
          blocks.Free(freed);
        }
        // The accepted continuation: a verification chunk of three, then decode steps.
        std::vector<int32_t> verify(tokens.begin() + 10, tokens.begin() + 13);
        blocks.Grow(cache, 13);
        at::Tensor logits = *m.full->Logits(*m.full->Forward(*m.full->Embed(Ids(verify)), cache));
        INFO(name << " block_size=" << block_size << " release=" << release);
        CHECK(MaxDiff(logits, full.narrow(0, 10, 3)) < 1e-5);
        for (int64_t i = 13; i < 16; ++i) {
          blocks.Grow(cache, i + 1);
          at::Tensor step = *m.full->Logits(
              *m.full->Forward(*m.full->Embed(Ids({tokens[i]})), cache));
          CHECK(MaxDiff(step[0], full[i]) < 1e-5);
        }
        CHECK(blocks.num_free() + cache.block_table().size() == 32);
      }
    }
  }
}

TEST_CASE("Paged caches outside float32 take the composite path with gathered blocks",
          "[submodel][paged]") {
  ModelConfig config = TinyTestConfig();
  LoadedModel m = MakeModel(config, "paged_double");
  auto model = Submodel::Load(config, *m.checkpoint, SubmodelSpec::Full(config),
                              {.dtype = at::kDouble});
  REQUIRE(model.ok());
  auto pool = (*model)->NewPagedPool(16, 2);
  REQUIRE(pool.ok());
  ShuffledBlocks blocks(16, 3);
  KvCache paged(*pool);
  KvCache contiguous = (*model)->NewCache();
  std::mt19937 rng(14);
  auto tokens = RandomTokens(rng, 9, config.vocab_size);
  // A prompt of five (crossing blocks of two), then decode steps.
  size_t begin = 0;
  for (size_t n : {5, 1, 1, 1, 1}) {
    std::vector<int32_t> chunk(tokens.begin() + begin, tokens.begin() + begin + n);
    begin += n;
    at::Tensor h = *(*model)->Embed(Ids(chunk));
    blocks.Grow(paged, paged.length() + static_cast<int64_t>(n));
    auto a = (*model)->Forward(h, paged);
    auto b = (*model)->Forward(h, contiguous);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->scalar_type() == at::kDouble);
    CHECK(Same(*a, *b));
  }
}

TEST_CASE("A growing cache computes what a full-length one does, growing chunk by chunk",
          "[submodel]") {
  ModelConfig config = TinyTestConfig();
  LoadedModel m = MakeModel(config, "growing");
  std::mt19937 rng(12);
  const std::vector<int32_t> tokens = RandomTokens(rng, 90, config.vocab_size);
  KvCache fixed = m.full->NewCache(90);
  KvCache growing = m.full->NewGrowingCache(90, /*growth_step=*/4);
  CHECK(growing.capacity() == 0);
  std::vector<int64_t> capacities;
  size_t done = 0;
  // A prompt in chunks, then one token at a time: the cache grows several times on the way.
  for (size_t n : {5, 11, 1, 1, 30, 1, 1, 1, 20, 1, 18}) {
    const std::vector<int32_t> chunk(tokens.begin() + done, tokens.begin() + done + n);
    at::Tensor h = *m.full->Embed(Ids(chunk));
    auto a = m.full->Forward(h, fixed);
    auto b = m.full->Forward(h, growing);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    INFO("after " << done + n << " positions");
    CHECK(at::allclose(*a, *b, 1e-6, 1e-6));
    if (capacities.empty() || capacities.back() != growing.capacity()) {
      capacities.push_back(growing.capacity());
    }
    done += n;
  }
  CHECK(done == tokens.size());
  CHECK(growing.length() == 90);
  CHECK(capacities.size() >= 4);
  CHECK(capacities.back() <= 90);
  at::Tensor one = *m.full->Embed(Ids({1}));
  auto past = m.full->Forward(one, growing);
  REQUIRE_FALSE(past.ok());
  CHECK(past.status().code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("Forward rejects paged caches without blocks or of another shape",
          "[submodel][paged]") {
  ModelConfig config = TinyTestConfig();
  LoadedModel m = MakeModel(config, "paged_errors");
  auto pool = m.full->NewPagedPool(4, 4);
  REQUIRE(pool.ok());
  KvCache cache(*pool);
  at::Tensor h = *m.full->Embed(Ids({1, 2, 3, 4, 5}));
  auto none = m.full->Forward(h, cache);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(none.status().message()), Catch::Contains("reach 5 positions"));
  CHECK_THAT(std::string(none.status().message()), Catch::Contains("holds 0"));
  cache.AppendBlock(2);
  auto short_by_one = m.full->Forward(h, cache);
  REQUIRE_FALSE(short_by_one.ok());
  CHECK_THAT(std::string(short_by_one.status().message()), Catch::Contains("holds 4"));
  CHECK(cache.length() == 0);
  cache.AppendBlock(0);
  REQUIRE(m.full->Forward(h, cache).ok());
  CHECK(cache.length() == 5);

  // A pool made for another submodel (layer count) or another model (head size, dtype).
  auto input = Submodel::Load(config, *m.checkpoint, SubmodelSpec::Input(1));
  REQUIRE(input.ok());
  auto input_pool = (*input)->NewPagedPool(4, 4);
  REQUIRE(input_pool.ok());
  KvCache wrong_layers(*input_pool);
  wrong_layers.AppendBlock(0);
  auto layers = m.full->Forward(*m.full->Embed(Ids({1})), wrong_layers);
  REQUIRE_FALSE(layers.ok());
  CHECK(layers.status().code() == absl::StatusCode::kInvalidArgument);
  ModelConfig other = config;
  other.head_dim = 8;
  for (auto [cfg, dtype] : {std::pair{other, at::kFloat}, std::pair{config, at::kDouble}}) {
    auto wrong_pool = KvBlockPool::Create(cfg, config.num_hidden_layers, 4, 4, dtype, at::kCPU);
    REQUIRE(wrong_pool.ok());
    KvCache wrong(*wrong_pool);
    wrong.AppendBlock(0);
    auto result = m.full->Forward(*m.full->Embed(Ids({1})), wrong);
    REQUIRE_FALSE(result.ok());
    CHECK(result.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(wrong.length() == 0);
  }
}

TEST_CASE("Loading reports the tensor with the wrong shape", "[submodel]") {
  ModelConfig config = TinyTestConfig();
  fs::path dir = TempDir("wrong_shape");
  NamedTensors weights = InitWeights(config, 1);
  for (auto& [name, t] : weights) {
    if (name == "model.layers.2.mlp.up_proj.weight") t = at::zeros({config.intermediate_size, 63});
  }
  REQUIRE(WriteCheckpoint(config, weights, dir).ok());
  auto model = LoadFullModel(dir);
  REQUIRE_FALSE(model.ok());
  const std::string message(model.status().message());
  CHECK_THAT(message, Catch::Contains("model.layers.2.mlp.up_proj.weight"));
  CHECK_THAT(message, Catch::Contains("model.safetensors"));
}

TEST_CASE("F16 and BF16 checkpoints load and compute in float32", "[submodel]") {
  ModelConfig config = TinyTestConfig();
  NamedTensors weights = InitWeights(config, 3);
  std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
  for (at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    fs::path dir = TempDir(std::string("dtype_") + c10::toString(dtype));
    REQUIRE(WriteCheckpoint(config, weights, dir, dtype).ok());
    auto model = LoadFullModel(dir);
    REQUIRE(model.ok());
    CHECK((*model)->layers()[0].qkv.dense.scalar_type() == at::kFloat);
    // Same weights rounded to 16 bits: the logits stay close to the float32 ones.
    NamedTensors rounded;
    for (auto& [n, t] : weights) rounded.emplace_back(n, t.to(dtype).to(at::kFloat));
    fs::path ref_dir = TempDir(std::string("dtype_ref_") + c10::toString(dtype));
    REQUIRE(WriteCheckpoint(config, rounded, ref_dir).ok());
    auto ref = LoadFullModel(ref_dir);
    REQUIRE(ref.ok());
    CHECK(MaxDiff(FullLogits(**model, tokens), FullLogits(**ref, tokens)) < 1e-5);
  }
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

// Logits of `tokens` continuing `cache`: embedding (float32 rows, whatever the weights'
// storage), layers, head.
at::Tensor StepLogits(const Submodel& model, KvCache& cache, const std::vector<int32_t>& tokens) {
  auto hidden = model.Embed(Ids(tokens));
  REQUIRE(hidden.ok());
  CHECK(hidden->scalar_type() == at::kFloat);
  auto out = model.Forward(*hidden, cache);
  REQUIRE(out.ok());
  auto result = model.Logits(*out);
  REQUIRE(result.ok());
  return *result;
}

// The weight matrices quantize_int8 turns into int8: every 2-D weight (the layers', the
// embedding and the LM head); norms and biases stay float.
bool QuantizedMatrix(const std::string& name, const at::Tensor& t) {
  return t.dim() == 2 && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
}

// gpt-oss's fused experts ([E, in, out], x @ W): the runtime quantizes each expert's matrix
// as a linear layer's [out, in] rows.
bool FusedExpertMatrix(const std::string& name, const at::Tensor& t) {
  return t.dim() == 3 &&
         (name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj"));
}

at::Tensor AsQuantized(const std::string& name, const at::Tensor& t) {
  if (QuantizedMatrix(name, t)) return kernels::QuantizeInt8PerRow(t).Dequantize();
  if (!FusedExpertMatrix(name, t)) return t;
  std::vector<at::Tensor> experts;
  for (int64_t e = 0; e < t.size(0); ++e) {
    experts.push_back(kernels::QuantizeInt8PerRow(t[e].t().contiguous()).Dequantize().t());
  }
  return at::stack(experts);
}

TEST_CASE("gpt-oss's MXFP4 experts, held packed, compute as their dequantized float32") {
  const ModelConfig config = [] {
    for (const auto& [name, c] : TinyTestVariants()) {
      if (name == "gpt_oss") return c;
    }
    FAIL("no gpt_oss variant");
    return ModelConfig{};
  }();
  const int64_t e = config.num_experts;
  const int64_t d = config.hidden_size;
  const int64_t width = config.moe_intermediate_size;
  // The experts in MXFP4, as released: random codes, exponents around 2^-6.
  at::manual_seed(9);
  NamedTensors weights;
  for (auto& [name, t] : InitWeights(config, 13)) {
    if (name.ends_with("mlp.experts.gate_up_proj") || name.ends_with("mlp.experts.down_proj")) {
      const bool gate_up = name.ends_with("gate_up_proj");
      const int64_t out = gate_up ? 2 * width : d;
      const int64_t in = gate_up ? d : width;
      weights.emplace_back(name + "_blocks", at::randint(0, 256, {e, out, in / 32, 16}, at::kByte));
      weights.emplace_back(name + "_scales", at::randint(118, 124, {e, out, in / 32}, at::kByte));
      continue;
    }
    weights.emplace_back(name, t);
  }
  const fs::path dir = TempDir("mxfp4_experts");
  REQUIRE(WriteCheckpoint(config, weights, dir).ok());
  auto packed = LoadFullModel(dir);
  auto dequantized = LoadFullModel(dir, {.mxfp4_experts = false});
  REQUIRE(packed.ok());
  REQUIRE(dequantized.ok());
  const DecoderLayerWeights& first = (*packed)->layers()[0];
  REQUIRE(first.sparse());
  CHECK(first.expert_gate_up[0].mxfp4.defined());
  CHECK(first.expert_down[0].mxfp4.defined());
  CHECK_FALSE((*dequantized)->layers()[0].expert_down[0].mxfp4.defined());
  // An expert's gate_up: 17 bytes a block of 32 against 128 in float32.
  CHECK(first.expert_gate_up[0].bytes() == 2 * width * (d / 32) * 17);
  CHECK((*packed)->WeightBytes() < (*dequantized)->WeightBytes());

  // A prompt of 23 rows (an expert's routed rows past the kernel's 16: dequantized blocks and
  // BLAS), then decode rows one at a time and a few at once (the kernel).
  std::mt19937 rng(3);
  const std::vector<int32_t> tokens = RandomTokens(rng, 23, config.vocab_size);
  CHECK(MaxDiff(FullLogits(**packed, tokens), FullLogits(**dequantized, tokens)) < 1e-4);
  KvCache cache = (*packed)->NewCache();
  KvCache ref_cache = (*dequantized)->NewCache();
  for (int64_t rows : {1, 1, 3, 16}) {
    const std::vector<int32_t> step = RandomTokens(rng, rows, config.vocab_size);
    INFO(rows << " rows");
    CHECK(MaxDiff(StepLogits(**packed, cache, step), StepLogits(**dequantized, ref_cache, step)) <
          1e-4);
  }

  // With int8 activations the packed experts round their inputs too (LinearMxfp4A8Out): a
  // prompt's rows at once (BLAS over the rounded rows) and the same rows in steps of 16 and 7
  // (the integer kernel) give the same logits up to float sums, a little off those of float32
  // activations.
  auto w4a8 = LoadFullModel(dir, {.quantize_int8 = true, .int8_activations = true});
  REQUIRE(w4a8.ok());
  const DecoderLayerWeights& rounded = (*w4a8)->layers()[0];
  CHECK(rounded.expert_gate_up[0].mxfp4.defined());
  CHECK(rounded.expert_gate_up[0].int8_activations);
  CHECK(rounded.expert_down[0].int8_activations);
  CHECK((*w4a8)->rounds_activations());
  CHECK_FALSE((*packed)->rounds_activations());
  // Float weights with MXFP4 experts: only the experts round their inputs.
  auto float_w4a8 = LoadFullModel(dir, {.int8_activations = true});
  REQUIRE(float_w4a8.ok());
  CHECK((*float_w4a8)->rounds_activations());
  CHECK((*float_w4a8)->layers()[0].expert_down[0].int8_activations);
  CHECK_FALSE((*float_w4a8)->layers()[0].qkv.int8_activations);
  const at::Tensor whole = FullLogits(**w4a8, tokens);
  KvCache rounded_cache = (*w4a8)->NewCache();
  const at::Tensor steps_first =
      StepLogits(**w4a8, rounded_cache, {tokens.begin(), tokens.begin() + 16});
  const at::Tensor steps_rest =
      StepLogits(**w4a8, rounded_cache, {tokens.begin() + 16, tokens.end()});
  CHECK(MaxDiff(at::cat({steps_first, steps_rest}), whole) < 1e-4);
  // Against the same weights with float32 activations: moved, but not far. The rounding
  // reaches the router too, where a token whose top experts swap moves further than any one
  // matrix's rounding would move it (here 7% of the largest logit): a wrong code, sign or
  // scale in the kernel moves the logits by as much as they are.
  auto int8 = LoadFullModel(dir, {.quantize_int8 = true});
  REQUIRE(int8.ok());
  const at::Tensor unrounded = FullLogits(**int8, tokens);
  const double moved = MaxDiff(whole, unrounded);
  CHECK(moved > 1e-4);
  CHECK(moved < 0.15 * unrounded.abs().max().item<double>());
}

TEST_CASE("int8 weights compute the model as quantized, one row and many, in a quarter of "
          "the bytes",
          "[submodel]") {
  std::mt19937 rng(8);
  for (const auto& [variant, config] : TinyTestVariants()) {
    SECTION(variant) {
      const NamedTensors weights = InitWeights(config, 7);
      // The model as quantized: each matrix replaced by its dequantized int8 form.
      NamedTensors dequantized;
      for (const auto& [name, t] : weights) {
        dequantized.emplace_back(name, AsQuantized(name, t));
      }
      const fs::path dir = TempDir("int8_" + variant);
      const fs::path ref_dir = TempDir("int8_ref_" + variant);
      REQUIRE(WriteCheckpoint(config, weights, dir).ok());
      REQUIRE(WriteCheckpoint(config, dequantized, ref_dir).ok());
      auto int8 = LoadFullModel(dir, {.quantize_int8 = true});
      auto reference = LoadFullModel(ref_dir);
      auto float32 = LoadFullModel(dir);
      REQUIRE(int8.ok());
      REQUIRE(reference.ok());
      REQUIRE(float32.ok());
      CHECK((*int8)->int8_weights());
      CHECK_FALSE((*float32)->int8_weights());
      const DecoderLayerWeights& first = (*int8)->layers()[0];
      for (const WeightMatrix* mlp :
           {first.sparse() ? &first.expert_gate_up.back() : &first.gate_up,
            first.sparse() ? &first.router : &first.down}) {
        CHECK(mlp->int8.values.scalar_type() == at::kChar);
      }
      CHECK((*int8)->lm_head().is_int8());
      // Matrices are a quarter of float32's bytes; norms, scales and biases add a little.
      const double ratio = static_cast<double>((*int8)->WeightBytes()) /
                           static_cast<double>((*float32)->WeightBytes());
      CHECK(ratio > 0.25);
      CHECK(ratio < 0.30);

      // A prompt of 23 rows: more than the int8 kernel takes (dequantized blocks, BLAS) for
      // the layers, and the head over every row.
      const std::vector<int32_t> tokens = RandomTokens(rng, 23, config.vocab_size);
      const at::Tensor ours = FullLogits(**int8, tokens);
      const at::Tensor theirs = FullLogits(**reference, tokens);
      CHECK(MaxDiff(ours, theirs) < 1e-4);
      // Then decode rows one at a time and a few at once (the int8 kernel).
      KvCache cache = (*int8)->NewCache();
      KvCache ref_cache = (*reference)->NewCache();
      for (int64_t rows : {1, 1, 3, 16}) {
        const std::vector<int32_t> step = RandomTokens(rng, rows, config.vocab_size);
        INFO(rows << " rows");
        CHECK(MaxDiff(StepLogits(**int8, cache, step), StepLogits(**reference, ref_cache, step)) <
              1e-4);
      }
      // And it is not the float32 model: quantization moved the logits.
      CHECK(MaxDiff(ours, FullLogits(**float32, tokens)) > 1e-4);
    }
  }
}

TEST_CASE("int8 activations round each linear layer's input per block of 32, alike for a "
          "prompt's many rows and a step's few",
          "[submodel]") {
  std::mt19937 rng(10);
  const ModelConfig config = TinyTestConfig();
  const fs::path dir = TempDir("w8a8");
  REQUIRE(WriteCheckpoint(config, InitWeights(config, 7), dir).ok());
  auto w8a8 = LoadFullModel(dir, {.quantize_int8 = true, .int8_activations = true});
  auto int8 = LoadFullModel(dir, {.quantize_int8 = true});
  REQUIRE(w8a8.ok());
  REQUIRE(int8.ok());
  CHECK((*w8a8)->layers()[0].qkv.int8_activations);
  CHECK((*w8a8)->lm_head().int8_activations);
  CHECK_FALSE((*int8)->layers()[0].down.int8_activations);
  // 23 prompt rows at once (BLAS over the rounded rows) against the same rows in steps of
  // 16 and 7 (the integer kernel): the same rounding, so the same logits up to float sums.
  const std::vector<int32_t> tokens = RandomTokens(rng, 23, config.vocab_size);
  const at::Tensor whole = FullLogits(**w8a8, tokens);
  KvCache cache = (*w8a8)->NewCache();
  const at::Tensor first = StepLogits(**w8a8, cache, {tokens.begin(), tokens.begin() + 16});
  const at::Tensor rest = StepLogits(**w8a8, cache, {tokens.begin() + 16, tokens.end()});
  CHECK(MaxDiff(at::cat({first, rest}), whole) < 1e-4);
  // Rounding the activations moved the logits from the weight-only model's, a little.
  const double moved = MaxDiff(whole, FullLogits(**int8, tokens));
  CHECK(moved > 1e-4);
  CHECK(moved < 0.05 * whole.abs().max().item<double>());
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

TEST_CASE("bfloat16 weights compute the float32 model of the bfloat16-rounded matrices, in "
          "half the bytes",
          "[submodel]") {
  std::mt19937 rng(9);
  const ModelConfig config = TinyTestConfig();
  const NamedTensors weights = InitWeights(config, 5);
  NamedTensors rounded;
  for (const auto& [name, t] : weights) {
    rounded.emplace_back(name, t.dim() == 2 ? t.to(at::kBFloat16).to(at::kFloat) : t);
  }
  const fs::path dir = TempDir("bf16w");
  const fs::path ref_dir = TempDir("bf16w_ref");
  REQUIRE(WriteCheckpoint(config, weights, dir).ok());
  REQUIRE(WriteCheckpoint(config, rounded, ref_dir).ok());
  auto bf16 = LoadFullModel(dir, {.bf16_weights = true});
  auto reference = LoadFullModel(ref_dir);
  auto float32 = LoadFullModel(dir);
  REQUIRE(bf16.ok());
  REQUIRE(reference.ok());
  REQUIRE(float32.ok());
  CHECK((*bf16)->layers()[0].qkv.dense.scalar_type() == at::kBFloat16);
  CHECK((*bf16)->lm_head().dense.scalar_type() == at::kBFloat16);
  const double ratio = static_cast<double>((*bf16)->WeightBytes()) /
                       static_cast<double>((*float32)->WeightBytes());
  CHECK(ratio > 0.5);
  CHECK(ratio < 0.55);
  const std::vector<int32_t> tokens = RandomTokens(rng, 23, config.vocab_size);
  CHECK(MaxDiff(FullLogits(**bf16, tokens), FullLogits(**reference, tokens)) < 1e-4);
  KvCache cache = (*bf16)->NewCache();
  KvCache ref_cache = (*reference)->NewCache();
  for (int64_t rows : {1, 1, 4}) {
    const std::vector<int32_t> step = RandomTokens(rng, rows, config.vocab_size);
    INFO(rows << " rows");
    CHECK(MaxDiff(StepLogits(**bf16, cache, step), StepLogits(**reference, ref_cache, step)) <
          1e-4);
  }

  // bf16_activations: a prompt's rows (32 or more) rounded to bfloat16 in the layers' linear
  // layers, where the CPU has AVX512_BF16; the head keeps float32 products, and decode rows
  // float32 activations.
  auto bf16a16 = LoadFullModel(dir, {.bf16_weights = true, .bf16_activations = true});
  REQUIRE(bf16a16.ok());
  CHECK((*bf16a16)->layers()[0].qkv.bf16_activations);
  CHECK((*bf16a16)->layers()[0].down.bf16_activations);
  CHECK_FALSE((*bf16a16)->lm_head().bf16_activations);
  CHECK_FALSE((*bf16)->layers()[0].qkv.bf16_activations);
  const std::vector<int32_t> prompt = RandomTokens(rng, 40, config.vocab_size);
  const at::Tensor float_products = FullLogits(**bf16, prompt);
  const at::Tensor bf16_products = FullLogits(**bf16a16, prompt);
  const double moved = MaxDiff(bf16_products, float_products);
  if (kernels::Bf16PromptKernelAvailable()) {
    // Moved by bfloat16's rounding of the activations (2^-9 of each), not more.
    CHECK(moved > 1e-5);
    CHECK(moved < 0.05 * float_products.abs().max().item<double>());
  } else {
    CHECK(moved == 0.0);
    WARN("this CPU has no AVX512_BF16: bf16_activations changes nothing here");
  }
  // Decode rows are float32's whatever the option says.
  KvCache a_cache = (*bf16a16)->NewCache();
  KvCache f_cache = (*bf16)->NewCache();
  const std::vector<int32_t> step = RandomTokens(rng, 3, config.vocab_size);
  CHECK(MaxDiff(StepLogits(**bf16a16, a_cache, step), StepLogits(**bf16, f_cache, step)) == 0.0);
}

TEST_CASE("In bfloat16 on the CPU the logits are float32: the final norm and the head's "
          "products of the bfloat16 states and weights, none rounded to bfloat16",
          "[submodel]") {
  // Rounded to bfloat16, a logit or a normed state keeps 8 bits: greedy choices within a few
  // hundredths of each other tie or swap (issue 31's agreement goal).
  const ModelConfig config = TinyTestConfig();
  LoadedModel m = MakeModel(config, "bf16_head");
  auto model = Submodel::Load(config, *m.checkpoint, SubmodelSpec::Full(config),
                              {.dtype = at::kBFloat16});
  REQUIRE(model.ok());
  REQUIRE((*model)->lm_head().dense.scalar_type() == at::kBFloat16);
  const at::Tensor head = (*model)->lm_head().dense.to(at::kDouble);
  const at::Tensor norm = (*model)->final_norm().to(at::kDouble);
  at::manual_seed(3);
  for (int64_t rows : {1, 5}) {
    INFO(rows << " rows");
    const at::Tensor hidden = at::randn({rows, config.hidden_size}).to(at::kBFloat16);
    auto logits = (*model)->Logits(hidden);
    REQUIRE(logits.ok());
    REQUIRE(logits->scalar_type() == at::kFloat);
    // float64 from the same bfloat16 states and weights.
    const at::Tensor x = hidden.to(at::kDouble);
    const at::Tensor normed = x * at::rsqrt((x * x).mean(-1, true) + config.rms_norm_eps) * norm;
    const at::Tensor exact = at::linear(normed, head);
    const double scale = exact.abs().max().item<double>();
    INFO("largest logit " << scale);
    REQUIRE(scale > 0.1);
    CHECK((logits->to(at::kDouble) - exact).abs().max().item<double>() < 1e-5 * scale);
    // What rounding would have lost, each far past that bound: the logits rounded (up to half
    // of bfloat16's step, 2^-9 of the value), or the normed state rounded before the head.
    CHECK((exact.to(at::kBFloat16).to(at::kDouble) - exact).abs().max().item<double>() >
          1e-3 * scale);
    const at::Tensor from_rounded = at::linear(normed.to(at::kBFloat16).to(at::kDouble), head);
    CHECK((from_rounded - exact).abs().max().item<double>() > 1e-4 * scale);
  }
}

TEST_CASE("A float32 row split into two half-precision rows keeps 16 of its mantissa bits, "
          "and so do a matrix's products with them, summed",
          "[submodel]") {
  // How a GPU's head multiplies the float32 normed state (cuBLAS takes half operands only).
  at::manual_seed(5);
  const at::Tensor x = at::randn({3, 96}) * at::exp(at::randn({3, 96}));  // varied magnitudes
  const at::Tensor weight = at::randn({40, 96}).to(at::kBFloat16).to(at::kDouble);
  const at::Tensor exact = at::linear(x.to(at::kDouble), weight);
  const double scale = exact.abs().max().item<double>();
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    INFO(c10::toString(dtype));
    const at::Tensor halves = SplitForHalfProducts(x, dtype);
    REQUIRE(halves.scalar_type() == dtype);
    REQUIRE(halves.sizes() == at::IntArrayRef({6, 96}));
    const at::Tensor rounded = halves.narrow(0, 0, 3).to(at::kDouble);
    const at::Tensor left = halves.narrow(0, 3, 3).to(at::kDouble);
    CHECK(rounded.equal(x.to(dtype).to(at::kDouble)));
    const at::Tensor products = at::linear(rounded, weight) + at::linear(left, weight);
    CHECK((products - exact).abs().max().item<double>() < 1e-5 * scale);
    if (dtype == at::kBFloat16) {
      // The remainder is itself rounded: at most 2^-9 of 2^-9 of each value (bfloat16 has
      // float32's exponents; float16's remainders of tiny values fall below its range).
      const at::Tensor error = (rounded + left - x.to(at::kDouble)).abs();
      CHECK((error <= x.to(at::kDouble).abs() * std::ldexp(1.0, -17)).all().item<bool>());
      // The rounded row alone is 2^-9 off and moves the products far past the bound above.
      CHECK((at::linear(rounded, weight) - exact).abs().max().item<double>() > 1e-4 * scale);
    }
  }
  CHECK_THROWS(SplitForHalfProducts(x.to(at::kBFloat16), at::kBFloat16));
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

// Decodes `steps` tokens after a prompt of 5 through `model` and returns every step's
// hidden state and logits, from Forward without buffers, with buffers, or over a paged cache.
enum class StepPath { kPlain, kBuffers, kPaged };

std::vector<at::Tensor> DecodeOutputs(const Submodel& model, const std::vector<int32_t>& tokens,
                                      StepPath path) {
  std::shared_ptr<KvBlockPool> pool;
  KvCache cache = model.NewGrowingCache(64, 8);
  if (path == StepPath::kPaged) {
    pool = *model.NewPagedPool(8, 4);
    cache = KvCache(pool);
    for (int32_t block : {5, 2, 7, 0, 3, 1}) cache.AppendBlock(block);  // out of order
  }
  StepBuffers buffers = model.NewStepBuffers(8);
  std::vector<at::Tensor> outputs;
  auto step = [&](const std::vector<int32_t>& ids) {
    const at::Tensor embedded = *model.Embed(Ids(ids));
    absl::StatusOr<at::Tensor> hidden;
    if (path == StepPath::kBuffers) {
      SequenceChunk chunk{.cache = &cache, .num_tokens = static_cast<int64_t>(ids.size())};
      hidden = model.Forward(embedded, std::span<const SequenceChunk>(&chunk, 1), buffers);
    } else {
      hidden = model.Forward(embedded, cache);
    }
    REQUIRE(hidden.ok());
    outputs.push_back(hidden->clone());
    outputs.push_back(*model.Logits(*hidden));
  };
  step({tokens.begin(), tokens.begin() + 5});
  for (size_t i = 5; i < tokens.size(); ++i) step({tokens[i]});
  return outputs;
}

TEST_CASE("The fused one-token CPU step gives the layer-by-layer path's numbers, bit for bit",
          "[submodel][fused_decode]") {
  std::mt19937 rng(12);
  // The test variants (biases, rope scaling, a sliding window the decode runs past), and a
  // model large enough that the step splits over threads (kernels::DecodeStepThreads).
  std::vector<std::pair<std::string, ModelConfig>> configs = TinyTestVariants();
  ModelConfig wide = TinyTestConfig();
  wide.hidden_size = 256;
  wide.intermediate_size = 512;
  wide.head_dim = wide.hidden_size / wide.num_attention_heads;
  configs.emplace_back("wide", wide);
  for (const auto& [variant, config] : configs) {
    const fs::path dir = TempDir("fused_" + variant);
    REQUIRE(WriteCheckpoint(config, InitWeights(config, 3), dir).ok());
    for (const auto& [form, options] : std::vector<std::pair<std::string, SubmodelOptions>>{
             {"float32", {}},
             {"bfloat16", {.bf16_weights = true}},
             {"int8", {.quantize_int8 = true}},
             {"int8 activations", {.quantize_int8 = true, .int8_activations = true}}}) {
      SubmodelOptions unfused_options = options;
      unfused_options.fused_cpu_decode = false;
      auto fused = LoadFullModel(dir, options);
      auto unfused = LoadFullModel(dir, unfused_options);
      REQUIRE(fused.ok());
      REQUIRE(unfused.ok());
      const std::vector<int32_t> tokens = RandomTokens(rng, 17, config.vocab_size);
      for (StepPath path : {StepPath::kPlain, StepPath::kBuffers, StepPath::kPaged}) {
        INFO(variant << ", " << form << " weights, path " << static_cast<int>(path));
        const std::vector<at::Tensor> ours = DecodeOutputs(**fused, tokens, path);
        const std::vector<at::Tensor> theirs = DecodeOutputs(**unfused, tokens, path);
        REQUIRE(ours.size() == theirs.size());
        for (size_t i = 0; i < ours.size(); ++i) {
          INFO("output " << i);
          CHECK(at::equal(ours[i], theirs[i]));
        }
      }
    }
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace tophat
