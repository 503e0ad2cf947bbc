// The submodel on a CUDA device against the same checkpoint on the CPU (label `gpu`; skipped
// without a device). float32 must agree to rounding; bfloat16 is measured and bounded.
#include <catch2/catch.hpp>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#ifdef TOPHAT_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime.h>
#endif

#include "kernels/cuda_device.h"
#include "kernels/small_batch_gemm.h"
#include "models/runtime/decode_graphs.h"
#include "models/runtime/gemm_tactics.h"
#include "models/runtime/model_init.h"
#include "models/runtime/submodel.h"
#include "base/test_util.h"

namespace tophat {
namespace {

// A random checkpoint of `config` (weights of `seed`) written to `dir`, opened.
std::unique_ptr<CheckpointReader> RandomCheckpoint(const ModelConfig& config, uint64_t seed,
                                                   const testing::TempDir& dir) {
  REQUIRE(WriteCheckpoint(config, InitWeights(config, seed), dir.path()).ok());
  auto checkpoint = CheckpointReader::Open(dir.path());
  REQUIRE(checkpoint.ok());
  return std::move(*checkpoint);
}

using SmallBatchGemm = SubmodelOptions::SmallBatchGemm;

std::unique_ptr<Submodel> Load(const ModelConfig& config, const CheckpointReader& checkpoint,
                               at::ScalarType dtype, at::Device device,
                               const SubmodelSpec& spec,
                               SmallBatchGemm small_batch_gemm = SmallBatchGemm::kMeasured) {
  auto model = Submodel::Load(config, checkpoint, spec,
                              {.dtype = dtype,
                               .device = device,
                               .max_context = 256,
                               .small_batch_gemm = small_batch_gemm});
  REQUIRE(model.ok());
  return std::move(*model);
}

// Runs the same schedule of batched steps (two sequences: chunked prefill, then batched
// decode with a multi-token verification chunk in the middle) on `model` over paged caches,
// and returns the float32 CPU logits of every step, concatenated.
at::Tensor RunSchedule(const Submodel& model, const std::vector<int64_t>& tokens_a,
                       const std::vector<int64_t>& tokens_b) {
  auto pool = model.NewPagedPool(64, 4);
  REQUIRE(pool.ok());
  KvCache a(*pool);
  KvCache b(*pool);
  int32_t next_block = 0;
  auto grow = [&](KvCache& cache, int64_t positions) {
    while (cache.capacity() < positions) cache.AppendBlock(next_block++);
  };
  // (tokens of a, tokens of b) per step.
  const std::vector<std::pair<int64_t, int64_t>> steps = {{13, 0}, {9, 7}, {1, 6}, {1, 1},
                                                          {4, 1}, {1, 3}, {1, 1}};
  size_t ia = 0;
  size_t ib = 0;
  std::vector<at::Tensor> logits;
  for (const auto& [na, nb] : steps) {
    std::vector<int64_t> ids(tokens_a.begin() + ia, tokens_a.begin() + ia + na);
    ids.insert(ids.end(), tokens_b.begin() + ib, tokens_b.begin() + ib + nb);
    grow(a, a.length() + na);
    grow(b, b.length() + nb);
    std::vector<SequenceChunk> chunks = {{&a, na}, {&b, nb}};
    auto hidden = model.Embed(at::tensor(ids, at::kLong));
    REQUIRE(hidden.ok());
    auto out = model.Forward(*hidden, chunks);
    REQUIRE(out.ok());
    auto step_logits = model.Logits(*out);
    REQUIRE(step_logits.ok());
    logits.push_back(step_logits->to(at::kCPU, at::kFloat));
    ia += na;
    ib += nb;
  }
  return at::cat(logits);
}

std::vector<int64_t> RandomTokens(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  std::vector<int64_t> out(n);
  for (auto& t : out) t = dist(rng);
  return out;
}

// The reference (float32 on the CPU) and the GPU run of one variant's checkpoint over the
// same mixed prefill/decode schedule, as CPU float32 logits.
struct LogitPair {
  at::Tensor cpu;
  at::Tensor gpu;
};
LogitPair RunOnBoth(const ModelConfig& config, at::ScalarType gpu_dtype, std::mt19937& rng) {
  testing::TempDir dir;
  const auto checkpoint = RandomCheckpoint(config, 7, dir);
  const SubmodelSpec full = SubmodelSpec::Full(config);
  auto cpu = Load(config, *checkpoint, at::kFloat, at::kCPU, full);
  auto gpu = Load(config, *checkpoint, gpu_dtype, at::Device(at::kCUDA, 0), full);
  const auto a = RandomTokens(rng, 40, config.vocab_size);
  const auto b = RandomTokens(rng, 40, config.vocab_size);
  return {RunSchedule(*cpu, a, b), RunSchedule(*gpu, a, b)};
}

TEST_CASE("On CUDA in float32 the model matches the CPU within 1e-4", "[gpu][submodel]") {
  std::mt19937 rng(21);
  for (const auto& [name, config] : TinyTestVariants()) {
    // CPU only for now (Gemma, experts): Submodel::Load refuses a GPU.
    if (!Submodel::ArchitectureRunsOn(config, at::Device(at::kCUDA, 0)).ok()) continue;
    const auto [ref, got] = RunOnBoth(config, at::kFloat, rng);
    const double max_error = (got - ref).abs().max().item<double>();
    INFO(name << ": max |logit error| " << max_error);
    CHECK(max_error < 1e-4);
  }
}

TEST_CASE("On CUDA in bfloat16 the logits stay close to float32 on the CPU",
          "[gpu][submodel]") {
  std::mt19937 rng(22);
  for (const auto& [name, config] : TinyTestVariants()) {
    // CPU only for now (Gemma, experts): Submodel::Load refuses a GPU.
    if (!Submodel::ArchitectureRunsOn(config, at::Device(at::kCUDA, 0)).ok()) continue;
    const auto [ref, got] = RunOnBoth(config, at::kBFloat16, rng);
    const at::Tensor error = (got - ref).abs();
    const double max_error = error.max().item<double>();
    const double mean_error = error.mean().item<double>();
    const double scale = ref.abs().max().item<double>();
    const double agree =
        got.argmax(-1).eq(ref.argmax(-1)).to(at::kFloat).mean().item<double>();
    std::printf("bf16 %-24s max |logit error| %.4f, mean %.5f (max |logit| %.3f), argmax "
                "agreement %.3f\n", name.c_str(), max_error, mean_error, scale, agree);
    INFO(name << ": max error " << max_error << " of " << scale);
    // bf16 keeps 8 mantissa bits (relative rounding 2^-9 per op): a few layers stay well
    // under 5% of the largest logit.
    CHECK(max_error < 0.05 * scale);
    CHECK(agree > 0.9);
    // The head multiplies into float32 (at::mm with an output dtype): logits rounded to
    // bfloat16 would all survive a round trip through it.
    const double rounded_share =
        got.to(at::kBFloat16).to(got.scalar_type()).eq(got).to(at::kFloat).mean()
            .item<double>();
    INFO("share of logits that are bfloat16 values " << rounded_share);
    CHECK(rounded_share < 0.5);
  }
}

TEST_CASE("On CUDA in bfloat16 the head multiplies the float32 normed state into float32 "
          "logits, as the CPU does",
          "[gpu][submodel]") {
  // cuBLAS takes half operands only: the normed state goes in as two bfloat16 rows, its
  // rounding and the remainder (SplitForHalfProducts). With only the rounding, the logits
  // were about 2e-3 of the largest off; with both, a few 1e-6.
  const ModelConfig config = TinyTestConfig();
  testing::TempDir dir;
  const auto checkpoint = RandomCheckpoint(config, 9, dir);
  const auto model = Load(config, *checkpoint, at::kBFloat16, at::Device(at::kCUDA, 0),
                          SubmodelSpec::Full(config));
  REQUIRE(model->lm_head().dense.scalar_type() == at::kBFloat16);
  const at::Tensor head = model->lm_head().dense.to(at::kCPU, at::kDouble);
  const at::Tensor norm = model->final_norm().to(at::kCPU, at::kDouble);
  at::manual_seed(4);
  for (int64_t rows : {1, 6}) {
    INFO(rows << " rows");
    const at::Tensor hidden = at::randn({rows, config.hidden_size}).to(at::kBFloat16);
    auto logits = model->Logits(hidden.to(at::Device(at::kCUDA, 0)));
    INFO(logits.status().ToString());
    REQUIRE(logits.ok());
    REQUIRE(logits->scalar_type() == at::kFloat);
    const at::Tensor x = hidden.to(at::kDouble);
    const at::Tensor normed = x * at::rsqrt((x * x).mean(-1, true) + config.rms_norm_eps) * norm;
    const at::Tensor exact = at::linear(normed, head);
    const double scale = exact.abs().max().item<double>();
    const double error = (logits->to(at::kCPU, at::kDouble) - exact).abs().max().item<double>();
    std::printf("bf16 head on CUDA, %lld rows: max |logit error| %.3g of %.3f\n",
                static_cast<long long>(rows), error, scale);
    CHECK(error < 3e-5 * scale);
  }
}

TEST_CASE("On CUDA in bfloat16 steps through the small-batch GEMM compute what cuBLAS's do, "
          "and a measured choice holds for every layer",
          "[gpu][submodel]") {
  std::mt19937 rng(23);
  const ModelConfig config = TinyDecodeKernelConfig();
  testing::TempDir dir;
  const auto checkpoint = RandomCheckpoint(config, 9, dir);
  const SubmodelSpec full = SubmodelSpec::Full(config);
  const at::Device cuda(at::kCUDA, 0);
  const auto kernel =
      Load(config, *checkpoint, at::kBFloat16, cuda, full, SmallBatchGemm::kAlways);
  const auto blas = Load(config, *checkpoint, at::kBFloat16, cuda, full, SmallBatchGemm::kNever);
  const auto measured = Load(config, *checkpoint, at::kBFloat16, cuda, full);
  CHECK(kernel->layers()[0].o_proj.small_batch_rows == 0x1feu);  // rows 1..8
  CHECK(blas->layers()[0].o_proj.small_batch_rows == 0u);
  for (const DecoderLayerWeights& w : measured->layers()) {
    CHECK(w.qkv.small_batch_rows == measured->layers()[0].qkv.small_batch_rows);
    CHECK(w.down.small_batch_rows == measured->layers()[0].down.small_batch_rows);
  }
  // The schedule's decode steps have 1-2 rows (the kernel's), its prompt chunks more (BLAS).
  const auto a = RandomTokens(rng, 40, config.vocab_size);
  const auto b = RandomTokens(rng, 40, config.vocab_size);
  const at::Tensor want = RunSchedule(*blas, a, b);
  const at::Tensor got = RunSchedule(*kernel, a, b);
  const double error = (got - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  INFO("max |logit difference| " << error << " of " << scale);
  // Both sum in float32 and round each output once; only the order of the sums differs, and
  // bfloat16 rounding of a layer's output can then differ by a step.
  CHECK(error <= 0.02 * scale);
  CHECK(got.argmax(-1).eq(want.argmax(-1)).to(at::kFloat).mean().item<double>() > 0.95);
}

TEST_CASE("On CUDA the small-batch timings of qkv and gate_up time the fused forms against "
          "cuBLAS and the kernel each replaces, at every row count",
          "[gpu][submodel]") {
  const ModelConfig config = TinyDecodeKernelConfig();
  const at::TensorOptions options =
      at::TensorOptions().dtype(at::kBFloat16).device(at::Device(at::kCUDA, 0));
  const int64_t k = config.hidden_size;
  const int64_t qkv_rows = config.q_size() + 2 * config.kv_size();
  const std::vector<at::Tensor> qkv = {at::randn({qkv_rows, k}, options),
                                       at::randn({qkv_rows, k}, options)};
  const std::vector<at::Tensor> qkv_bias = {at::randn({qkv_rows}, options),
                                            at::randn({qkv_rows}, options)};
  const std::vector<at::Tensor> gate_up = {at::randn({2 * config.intermediate_size, k}, options)};
  const SmallBatchEpilogue rotary{.kind = SmallBatchEpilogue::Kind::kRotaryQkv,
                                  .heads = config.num_attention_heads,
                                  .kv_heads = config.num_key_value_heads,
                                  .head_dim = config.head_dim};
  const SmallBatchEpilogue swiglu{.kind = SmallBatchEpilogue::Kind::kSwiGlu};
  struct Case {
    const char* name;
    const std::vector<at::Tensor>& weights;
    std::vector<at::Tensor> biases;
    SmallBatchEpilogue epilogue;
  };
  for (const Case& c : {Case{"qkv+rotary", qkv, {}, rotary},
                        Case{"qkv+rotary with bias", qkv, qkv_bias, rotary},
                        Case{"gate_up+swiglu", gate_up, {}, swiglu}}) {
    INFO(c.name);
    const absl::StatusOr<SmallBatchTimings> timings =
        TimeSmallBatchGemm(c.weights, c.biases, kernels::kSmallBatchGemmMaxRows, c.epilogue);
    INFO(timings.status().ToString());
    REQUIRE(timings.ok());
    REQUIRE(timings->kernel_seconds.size() ==
            static_cast<size_t>(kernels::kSmallBatchGemmMaxRows));
    for (size_t r = 0; r < timings->kernel_seconds.size(); ++r) {
      INFO(r + 1 << " rows");
      CHECK(timings->kernel_seconds[r] > 0);
      CHECK(timings->blas_seconds[r] > 0);
    }
  }
}

#ifdef TOPHAT_HAVE_CUDA
// Blocks the caching allocator has handed out on device 0 so far (cache hits included: a
// hit is still an allocation inside the step).
int64_t CudaAllocations() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  return stats.allocation[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .allocated;
}

TEST_CASE("A submodel and a KV pool made on \"cuda\" (no index) run a step in step buffers",
          "[gpu][submodel][step_buffers]") {
  // Daemons name the device "cuda"; tensors always carry an index ("cuda:0"). The first GPU
  // run of the engine benchmark refused its warm-up step over exactly that difference.
  const ModelConfig config = TinyDecodeKernelConfig();
  testing::TempDir dir;
  const auto checkpoint = RandomCheckpoint(config, 5, dir);
  const auto loaded = Load(config, *checkpoint, at::kBFloat16, at::Device(at::kCUDA),
                           SubmodelSpec::Middle(config, 1, 1));
  const Submodel& model = *loaded;
  CHECK(model.options().device.has_index());
  // A pipeline stage makes its pool from the config's device name, not from the submodel.
  auto pool = KvBlockPool::Create(config, model.spec().layers.size(), 16, 4, at::kBFloat16,
                                  at::Device(at::kCUDA));
  REQUIRE(pool.ok());
  CHECK((*pool)->device() == model.options().device);
  KvCache cache(*pool);
  for (int b = 0; b < 4; ++b) cache.AppendBlock(b);
  const SequenceChunk chunk{.cache = &cache, .num_tokens = 5};
  StepBuffers buffers = model.NewStepBuffers(8, 4);
  at::Tensor input = buffers.residual.narrow(0, 0, 5);
  input.normal_();
  auto out = model.Forward(input, std::span<const SequenceChunk>(&chunk, 1), buffers);
  INFO(out.status().ToString());
  REQUIRE(out.ok());
  CHECK(out->is_cuda());
}

TEST_CASE("On CUDA a decode step in step buffers allocates nothing after warm-up",
          "[gpu][submodel][step_buffers]") {
  // Heads the batched decode kernel takes: the composite attention it falls back to
  // otherwise allocates.
  const ModelConfig config = TinyDecodeKernelConfig();
  testing::TempDir dir;
  const auto checkpoint = RandomCheckpoint(config, 3, dir);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << c10::toString(dtype));
    const auto loaded = Load(config, *checkpoint, dtype, at::Device(at::kCUDA, 0),
                             SubmodelSpec::Middle(config, 1, 1));
    const Submodel& model = *loaded;
    const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(at::kCUDA);
    auto pool = model.NewPagedPool(64, 4);
    REQUIRE(pool.ok());
    std::vector<KvCache> caches;
    int32_t next_block = 0;
    for (int64_t i = 0; i < 3; ++i) {
      caches.emplace_back(*pool);
      for (int b = 0; b < 6; ++b) caches.back().AppendBlock(next_block++);
      REQUIRE(model.Forward(at::randn({3 + 4 * i, config.hidden_size}, options),
                            caches.back()).ok());
    }
    std::vector<SequenceChunk> chunks;
    for (KvCache& cache : caches) chunks.push_back({.cache = &cache, .num_tokens = 1});
    StepBuffers buffers = model.NewStepBuffers(16, 4);
    at::Tensor input = buffers.residual.narrow(0, 0, 3);
    input.normal_();
    REQUIRE(model.Forward(input, chunks, buffers).ok());  // warm-up (cuBLAS's workspace)
    for (int step = 0; step < 5; ++step) {
      INFO("step " << step);
      const at::Tensor step_input = at::randn({3, config.hidden_size}, options);
      input.copy_(step_input);
      const int64_t before = CudaAllocations();
      auto out = model.Forward(input, chunks, buffers);
      const int64_t allocations = CudaAllocations() - before;
      REQUIRE(out.ok());
      CHECK(allocations == 0);
      const at::Tensor kept = out->clone();
      for (KvCache& cache : caches) REQUIRE(cache.Truncate(cache.length() - 1).ok());
      const int64_t one_off_before = CudaAllocations();
      auto again = model.Forward(step_input, chunks);
      REQUIRE(again.ok());
      CHECK(CudaAllocations() - one_off_before > 0);  // the counter sees a step that does
      CHECK(at::allclose(again->to(at::kFloat), kept.to(at::kFloat), 1e-3, 1e-3));
    }
    // Speculative verification chunks (decode rows, kDecodeRowsMaxChunkTokens) allocate
    // nothing either.
    std::vector<SequenceChunk> verify = chunks;
    verify[0].num_tokens = 2;
    verify[1].num_tokens = 3;
    at::Tensor verify_input = buffers.residual.narrow(0, 0, 6);
    for (int step = 0; step < 3; ++step) {
      INFO("verification step " << step);
      verify_input.normal_();
      const int64_t before = CudaAllocations();
      auto out = model.Forward(verify_input, verify, buffers);
      const int64_t allocations = CudaAllocations() - before;
      REQUIRE(out.ok());
      CHECK(allocations == 0);
      for (size_t i = 0; i < caches.size(); ++i) {
        REQUIRE(caches[i].Truncate(caches[i].length() - verify[i].num_tokens).ok());
      }
    }
  }
}

TEST_CASE("On CUDA a replayed decode graph computes what the eager step does",
          "[gpu][submodel][decode_graphs]") {
  const ModelConfig config = TinyDecodeKernelConfig();  // heads the batched kernels take
  testing::TempDir dir;
  const auto checkpoint = RandomCheckpoint(config, 4, dir);
  // bfloat16 twice: its few-row GEMMs through the small-batch kernel and through cuBLAS.
  for (const auto& [dtype, small_batch_gemm] :
       {std::pair{at::kFloat, SmallBatchGemm::kMeasured},
        std::pair{at::kBFloat16, SmallBatchGemm::kAlways},
        std::pair{at::kBFloat16, SmallBatchGemm::kNever}}) {
    INFO("dtype " << c10::toString(dtype) << ", small-batch GEMM "
                  << (small_batch_gemm == SmallBatchGemm::kAlways ? "always" : "measured/never"));
    const auto loaded = Load(config, *checkpoint, dtype, at::Device(at::kCUDA, 0),
                             SubmodelSpec::Middle(config, 1, 1), small_batch_gemm);
    const Submodel& model = *loaded;
    const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(at::kCUDA);
    auto pool = model.NewPagedPool(128, 4);
    REQUIRE(pool.ok());
    StepBuffers buffers = model.NewStepBuffers(8, 4);
    auto graphs = DecodeGraphs::Capture(model, **pool, buffers, 8);
    REQUIRE(graphs.ok());
    CHECK((*graphs)->buckets() == std::vector<int64_t>{1, 2, 4, 8});
    // Five sequences (a bucket of 8: three padding rows) with their twins decoded eagerly.
    std::vector<KvCache> replayed;
    std::vector<KvCache> eager;
    int32_t next_block = 0;
    for (int64_t i = 0; i < 5; ++i) {
      const at::Tensor history = at::randn({2 + 3 * i, config.hidden_size}, options);
      for (std::vector<KvCache>* set : {&replayed, &eager}) {
        set->emplace_back(*pool);
        for (int b = 0; b < 8; ++b) set->back().AppendBlock(next_block++);
        REQUIRE(model.Forward(history, set->back()).ok());
      }
    }
    // Decode steps, and steps with speculative verification chunks (a decode row per token:
    // 8 and 7 rows, replayed in the bucket of 8).
    const std::vector<std::vector<int64_t>> tokens = {
        {1, 1, 1, 1, 1}, {1, 3, 2, 1, 1}, {2, 1, 1, 1, 2}, {1, 1, 1, 1, 1}};
    for (int step = 0; step < 4; ++step) {
      INFO("step " << step);
      int64_t rows = 0;
      for (int64_t n : tokens[step]) rows += n;
      const at::Tensor input = at::randn({rows, config.hidden_size}, options);
      std::vector<SequenceChunk> graph_chunks;
      std::vector<SequenceChunk> eager_chunks;
      for (int64_t i = 0; i < 5; ++i) {
        graph_chunks.push_back({.cache = &replayed[i], .num_tokens = tokens[step][i]});
        eager_chunks.push_back({.cache = &eager[i], .num_tokens = tokens[step][i]});
      }
      REQUIRE((*graphs)->Fits(graph_chunks));
      auto got = (*graphs)->Run(input, graph_chunks);
      REQUIRE(got.ok());
      const at::Tensor got_host = got->to(at::kCPU, at::kFloat);
      auto expected = model.Forward(input, eager_chunks);
      REQUIRE(expected.ok());
      const at::Tensor expected_host = expected->to(at::kCPU, at::kFloat);
      const double error = (got_host - expected_host).abs().max().item<double>();
      CHECK(error <= 1e-3 * expected_host.abs().max().item<double>() + 1e-4);
      CHECK(replayed[0].length() == eager[0].length());
    }
    CHECK((*graphs)->replays() == 4);
    // A prompt chunk longer than a verification chunk does not fit a decode graph, nor do
    // more rows than the largest bucket.
    std::vector<SequenceChunk> prefill = {
        {.cache = &replayed[0], .num_tokens = kDecodeRowsMaxChunkTokens + 1}};
    CHECK_FALSE((*graphs)->Fits(prefill));
    std::vector<SequenceChunk> too_many = {{.cache = &replayed[0], .num_tokens = 5},
                                           {.cache = &replayed[1], .num_tokens = 4}};
    CHECK_FALSE((*graphs)->Fits(too_many));
  }
}

// Runs `body` with tophat's kernels launched overlapped (programmatic dependent launch) or
// serialized, and puts the process-wide setting back after.
template <typename Fn>
auto WithOverlap(bool overlap, Fn&& body) {
  struct Restore {
    ~Restore() { kernels::SetOverlapKernelLaunches(true); }
  } restore;
  kernels::SetOverlapKernelLaunches(overlap);
  return body();
}

bool ComputeCapabilityAtLeast9() {
  int major = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  return major >= 9;
}

TEST_CASE("On CUDA overlapped kernel launches compute exactly what serialized ones do, eager "
          "and in replayed decode graphs",
          "[gpu][submodel][overlap]") {
  // On an H100/H200 the setting takes effect; before compute capability 9.0 it must not.
  CHECK(WithOverlap(true, [] { return kernels::OverlapKernelLaunches(); }) ==
        ComputeCapabilityAtLeast9());
  CHECK_FALSE(WithOverlap(false, [] { return kernels::OverlapKernelLaunches(); }));
  std::mt19937 rng(31);
  const ModelConfig config = TinyDecodeKernelConfig();
  testing::TempDir dir;
  const auto checkpoint = RandomCheckpoint(config, 12, dir);
  const at::Device cuda(at::kCUDA, 0);
  // Every few-row GEMM through the small-batch kernel: a decode step is then tophat's
  // kernels only, each overlapping the one before.
  const auto model = Load(config, *checkpoint, at::kBFloat16, cuda, SubmodelSpec::Full(config),
                          SmallBatchGemm::kAlways);
  const auto a = RandomTokens(rng, 40, config.vocab_size);
  const auto b = RandomTokens(rng, 40, config.vocab_size);
  const at::Tensor serialized = WithOverlap(false, [&] { return RunSchedule(*model, a, b); });
  // Same kernels, same arithmetic order: equal to the bit, every time (a read before the
  // predecessor's write would show as a difference in some run).
  for (int run = 0; run < 5; ++run) {
    INFO("eager run " << run);
    const at::Tensor overlapped = WithOverlap(true, [&] { return RunSchedule(*model, a, b); });
    CHECK(at::equal(overlapped, serialized));
  }

  // Replayed graphs, captured with each setting, over the same caches' twins.
  const auto middle = Load(config, *checkpoint, at::kBFloat16, cuda,
                           SubmodelSpec::Middle(config, 1, 1), SmallBatchGemm::kAlways);
  const at::TensorOptions options = at::TensorOptions().dtype(at::kBFloat16).device(cuda);
  auto decode = [&](bool overlap, const std::vector<at::Tensor>& histories,
                    const std::vector<at::Tensor>& inputs) {
    return WithOverlap(overlap, [&] {
      auto pool = middle->NewPagedPool(128, 4);
      REQUIRE(pool.ok());
      StepBuffers buffers = middle->NewStepBuffers(8, 4);
      auto graphs = DecodeGraphs::Capture(*middle, **pool, buffers, 8);
      REQUIRE(graphs.ok());
      std::vector<KvCache> caches;
      int32_t next_block = 0;
      for (const at::Tensor& history : histories) {
        caches.emplace_back(*pool);
        for (int block = 0; block < 8; ++block) caches.back().AppendBlock(next_block++);
        REQUIRE(middle->Forward(history, caches.back()).ok());
      }
      std::vector<at::Tensor> outputs;
      for (const at::Tensor& input : inputs) {
        std::vector<SequenceChunk> chunks;
        for (KvCache& cache : caches) chunks.push_back({.cache = &cache, .num_tokens = 1});
        REQUIRE((*graphs)->Fits(chunks));
        auto out = (*graphs)->Run(input, chunks);
        REQUIRE(out.ok());
        outputs.push_back(out->to(at::kCPU, at::kFloat));
      }
      CHECK((*graphs)->replays() == static_cast<int64_t>(inputs.size()));
      return at::cat(outputs);
    });
  };
  std::vector<at::Tensor> histories;
  for (int64_t i = 0; i < 3; ++i) histories.push_back(at::randn({5 + 7 * i, config.hidden_size}, options));
  std::vector<at::Tensor> inputs;
  for (int step = 0; step < 6; ++step) inputs.push_back(at::randn({3, config.hidden_size}, options));
  const at::Tensor want = decode(false, histories, inputs);
  for (int run = 0; run < 3; ++run) {
    INFO("graph run " << run);
    CHECK(at::equal(decode(true, histories, inputs), want));
  }
}
#endif

}  // namespace
}  // namespace tophat
