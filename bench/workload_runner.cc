#include "bench/workload_runner.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tophat::bench {

absl::StatusOr<WorkloadRun> RunWorkload(const std::vector<std::string>& agents,
                                        const WorkloadSpec& spec) {
  if (agents.empty()) return absl::InvalidArgumentError("--agents: none given");
  std::vector<std::unique_ptr<Client>> clients;
  int64_t max_context = 0;
  uint32_t vocab = 0;
  for (const std::string& address : agents) {
    auto client = Client::Connect(address);
    if (!client.ok()) return client.status();
    auto info = (*client)->Info();
    if (!info.ok()) return info.status();
    max_context = max_context == 0 ? info->max_context()
                                   : std::min<int64_t>(max_context, info->max_context());
    vocab = info->vocab_size();
    clients.push_back(*std::move(client));
  }

  std::mt19937_64 rng(spec.seed);
  std::vector<v1::GenerateRequest> requests;
  std::vector<double> arrivals;
  if (!spec.prompts.empty()) {
    for (const std::string& prompt : spec.prompts) {
      v1::GenerateRequest request;
      request.set_prompt(prompt);
      request.set_max_new_tokens(static_cast<uint32_t>(spec.output_tokens));
      requests.push_back(request);
      arrivals.push_back(0);
    }
  } else {
    auto lengths = PromptLengthSampler::FromSpec(spec.prompt_lengths);
    if (!lengths.ok()) return lengths.status();
    const int64_t max_prompt = max_context - spec.output_tokens;
    if (max_prompt < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--output-tokens ", spec.output_tokens, " leaves no room for a prompt in the agents' ",
          max_context, "-position context"));
    }
    // Random ids from the ordinary part of the vocabulary: timing does not depend on
    // content, and the run needs no tokenizer.
    std::uniform_int_distribution<uint32_t> token(3, std::max<uint32_t>(3, vocab - 1));
    const auto text_size = static_cast<int64_t>(spec.text_tokens.size());
    for (int64_t i = 0; i < spec.requests; ++i) {
      v1::GenerateRequest request;
      const int64_t length = lengths->Sample(rng, max_prompt);
      if (text_size >= length) {
        std::uniform_int_distribution<int64_t> offset(0, text_size - length);
        const int64_t first = offset(rng);
        for (int64_t t = 0; t < length; ++t) {
          request.mutable_prompt_ids()->add_ids(spec.text_tokens[first + t]);
        }
      } else {
        for (int64_t t = 0; t < length; ++t) request.mutable_prompt_ids()->add_ids(token(rng));
      }
      request.set_max_new_tokens(static_cast<uint32_t>(spec.output_tokens));
      request.set_ignore_eos(true);
      requests.push_back(request);
    }
    arrivals = PoissonArrivals(spec.rate, spec.requests, rng);
  }

  for (v1::GenerateRequest& request : requests) request.set_trace(spec.trace);

  WorkloadRun run;
  run.outcomes.resize(requests.size());
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::duration<double>(arrivals[i])));
      RequestOutcome& outcome = run.outcomes[i];
      outcome.agent = i % clients.size();
      outcome.arrival_s = arrivals[i];
      const auto sent = std::chrono::steady_clock::now();
      auto result = clients[outcome.agent]->Generate(requests[i]);
      outcome.e2e_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
      if (!result.ok()) {
        outcome.status = result.status();
      } else {
        outcome.result = *std::move(result);
        if (!outcome.result.ok()) outcome.status = absl::InternalError(outcome.result.error);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  run.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

WorkloadSummary SummarizeRun(const WorkloadRun& run, const SlaTargets& sla) {
  WorkloadSummary summary;
  std::vector<double> ttft;
  std::vector<double> tbt;
  std::vector<double> e2e;
  int64_t within_sla = 0;
  for (const RequestOutcome& outcome : run.outcomes) {
    ++summary.requests;
    if (!outcome.status.ok()) {
      ++summary.failed;
      continue;
    }
    const GenerateResult& result = outcome.result;
    const double first = result.time_to_first_token_seconds();
    const double gap = result.mean_inter_token_seconds();
    ttft.push_back(first);
    if (result.token_ids.size() > 1) tbt.push_back(gap);
    e2e.push_back(outcome.e2e_s);
    summary.generated_tokens += static_cast<int64_t>(result.token_ids.size());
    if (first <= sla.ttft_s && gap <= sla.tbt_s) ++within_sla;
  }
  summary.ttft = Summarize(ttft);
  summary.tbt = Summarize(tbt);
  summary.e2e = Summarize(e2e);
  if (run.wall_seconds > 0) {
    summary.output_tokens_per_second = summary.generated_tokens / run.wall_seconds;
  }
  if (summary.requests > 0) {
    summary.sla_compliance = static_cast<double>(within_sla) / summary.requests;
  }
  return summary;
}

namespace {

// The prompt's way to the first token from its chunk trace, in seconds since the agent took
// the request: when its first and last chunks went onto the uplink (the uplink's share is
// the span between), when the last one's result came back, and the cloud's queue and
// compute summed over the chunks. What overlapping requests share shows up here: a link
// or pacer in the span, the cloud in queue and compute.
nlohmann::json PromptPathJson(const v1::RequestStats& stats) {
  double device = 0;
  double queue = 0;
  double compute = 0;
  double first_sent = stats.chunks(0).sent_at();
  double last_sent = 0;
  double last_result = 0;
  for (const v1::ChunkTrace& chunk : stats.chunks()) {
    device += chunk.device_seconds();
    queue += chunk.cloud_queue_seconds();
    compute += chunk.cloud_compute_seconds();
    first_sent = std::min(first_sent, chunk.sent_at());
    last_sent = std::max(last_sent, chunk.sent_at());
    last_result = std::max(last_result, chunk.result_at());
  }
  return nlohmann::json{{"chunks", stats.chunks_size()},
                        {"device_s", device},
                        {"first_sent_at_s", first_sent},
                        {"last_sent_at_s", last_sent},
                        {"last_result_at_s", last_result},
                        {"cloud_queue_s", queue},
                        {"cloud_compute_s", compute}};
}

}  // namespace

nlohmann::json OutcomeJson(const RequestOutcome& outcome) {
  const GenerateResult& r = outcome.result;
  nlohmann::json json{{"arrival_s", outcome.arrival_s},
                        {"ok", outcome.status.ok()},
                        {"error", std::string(outcome.status.message())},
                        {"prompt_tokens", r.stats.prompt_tokens()},
                        {"generated_tokens", r.token_ids.size()},
                        {"prompt_chunk_size", r.stats.prompt_chunk_size()},
                        {"ttft_s", r.time_to_first_token_seconds()},
                        {"mean_tbt_s", r.mean_inter_token_seconds()},
                        {"e2e_s", outcome.e2e_s},
                        {"decode_rounds", r.stats.decode_rounds()},
                        {"reconnects", r.stats.reconnects()}};
  if (r.stats.chunks_size() > 0) json["prompt_path"] = PromptPathJson(r.stats);
  return json;
}

nlohmann::json LatencyJson(const LatencySummary& s) {
  return nlohmann::json{{"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}};
}

nlohmann::json SummaryJson(const WorkloadSummary& summary) {
  return nlohmann::json{{"requests", summary.requests},
                        {"failed", summary.failed},
                        {"generated_tokens", summary.generated_tokens},
                        {"output_tokens_per_second", summary.output_tokens_per_second},
                        {"ttft_seconds", LatencyJson(summary.ttft)},
                        {"tbt_seconds", LatencyJson(summary.tbt)},
                        {"e2e_seconds", LatencyJson(summary.e2e)},
                        {"sla_compliance", summary.sla_compliance}};
}

}  // namespace tophat::bench
