#include "device_agent/cli/serving_commands.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "device_agent/client.h"
#include "device_agent/workload.h"

namespace tophat::cli {
namespace {

int Fail(const absl::Status& status) {
  spdlog::error("{}", status.ToString());
  return 1;
}

const char* FinishName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case v1::FINISH_REASON_ERROR:
      return "error";
    case v1::FINISH_REASON_UNSPECIFIED:
    case v1::FinishReason_INT_MIN_SENTINEL_DO_NOT_USE_:
    case v1::FinishReason_INT_MAX_SENTINEL_DO_NOT_USE_:
      break;
  }
  return "unspecified";
}

v1::GenerateRequest MakeRequest(const ChatArgs& args, const std::string& prompt) {
  v1::GenerateRequest request;
  request.set_prompt(prompt);
  request.set_max_new_tokens(static_cast<uint32_t>(args.max_new_tokens));
  request.mutable_sampling()->set_temperature(static_cast<float>(args.temperature));
  request.mutable_sampling()->set_top_k(static_cast<uint32_t>(args.top_k));
  request.mutable_sampling()->set_top_p(static_cast<float>(args.top_p));
  request.mutable_sampling()->set_seed(args.seed);
  request.set_trace(!args.trace_path.empty());
  return request;
}

}  // namespace

int RunChat(const ChatArgs& args) {
  auto client = Client::Connect(args.agent);
  if (!client.ok()) return Fail(client.status());
  const auto ask = [&](const std::string& prompt) -> int {
    auto result = (*client)->Generate(MakeRequest(args, prompt),
                                      [](const v1::GenerateResponse& update) {
                                        std::cout << update.text() << std::flush;
                                      });
    std::cout << "\n";
    if (!result.ok()) return Fail(result.status());
    if (!result->ok()) return Fail(absl::InternalError(result->error));
    if (!args.trace_path.empty()) {
      // The request's stats with its per-chunk and per-round trace, as JSON.
      std::string json;
      google::protobuf::util::JsonPrintOptions options;
      options.add_whitespace = true;
      options.preserve_proto_field_names = true;
      if (!google::protobuf::util::MessageToJsonString(result->stats, &json, options).ok()) {
        return Fail(absl::InternalError("cannot print the trace as JSON"));
      }
      if (args.trace_path == "-") {
        std::cerr << json << "\n";
      } else {
        std::ofstream out(args.trace_path);
        out << json << "\n";
        if (!out) return Fail(absl::InternalError(absl::StrCat(args.trace_path, ": write failed")));
      }
    }
    if (args.stats) {
      std::fprintf(stderr, "[%s: %zu tokens, TTFT %.1f ms, mean TBT %.2f ms]\n",
                   FinishName(result->finish_reason), result->token_ids.size(),
                   result->time_to_first_token_seconds() * 1e3,
                   result->mean_inter_token_seconds() * 1e3);
    }
    return 0;
  };
  if (!args.prompt.empty()) return ask(args.prompt);
  std::string line;
  std::fprintf(stderr, "tophat chat: one prompt per line, Ctrl-D to quit\n");
  while (std::fprintf(stderr, "> "), std::getline(std::cin, line)) {
    if (line.empty()) continue;
    if (int rc = ask(line); rc != 0) return rc;
  }
  return 0;
}

int RunBench(const BenchArgs& args) {
  if (args.agents.empty()) return Fail(absl::InvalidArgumentError("--agents: none given"));
  std::vector<std::unique_ptr<Client>> clients;
  int64_t max_context = 0;
  uint32_t vocab = 0;
  for (const std::string& address : args.agents) {
    auto client = Client::Connect(address);
    if (!client.ok()) return Fail(client.status());
    auto info = (*client)->Info();
    if (!info.ok()) return Fail(info.status());
    max_context = max_context == 0 ? info->max_context()
                                   : std::min<int64_t>(max_context, info->max_context());
    vocab = info->vocab_size();
    clients.push_back(*std::move(client));
  }

  std::mt19937_64 rng(args.seed);
  std::vector<v1::GenerateRequest> requests;
  std::vector<double> arrivals;
  if (!args.prompts.empty()) {
    for (const std::string& prompt : args.prompts) {
      v1::GenerateRequest request;
      request.set_prompt(prompt);
      request.set_max_new_tokens(static_cast<uint32_t>(args.output_tokens));
      requests.push_back(request);
      arrivals.push_back(0);
    }
  } else {
    auto lengths = PromptLengthSampler::FromSpec(args.prompt_lengths);
    if (!lengths.ok()) return Fail(lengths.status());
    const int64_t max_prompt = max_context - args.output_tokens;
    if (max_prompt < 1) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--output-tokens ", args.output_tokens, " leaves no room for a prompt in the agents' ",
          max_context, "-position context")));
    }
    // Random ids from the ordinary part of the vocabulary: timing does not depend on
    // content, and the run needs no tokenizer.
    std::uniform_int_distribution<uint32_t> token(3, std::max<uint32_t>(3, vocab - 1));
    for (int64_t i = 0; i < args.requests; ++i) {
      v1::GenerateRequest request;
      const int64_t length = lengths->Sample(rng, max_prompt);
      for (int64_t t = 0; t < length; ++t) request.mutable_prompt_ids()->add_ids(token(rng));
      request.set_max_new_tokens(static_cast<uint32_t>(args.output_tokens));
      request.set_ignore_eos(true);
      requests.push_back(request);
    }
    arrivals = PoissonArrivals(args.rate, args.requests, rng);
  }

  struct Outcome {
    size_t agent = 0;
    absl::Status status;
    GenerateResult result;
    double e2e = 0;
  };
  std::vector<Outcome> outcomes(requests.size());
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::duration<double>(arrivals[i])));
      Outcome& outcome = outcomes[i];
      outcome.agent = i % clients.size();
      const auto sent = std::chrono::steady_clock::now();
      auto result = clients[outcome.agent]->Generate(requests[i]);
      outcome.e2e = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
      if (!result.ok()) {
        outcome.status = result.status();
      } else {
        outcome.result = *std::move(result);
        if (!outcome.result.ok()) outcome.status = absl::InternalError(outcome.result.error);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<double> ttft;
  std::vector<double> tbt;
  std::vector<double> e2e;
  int64_t tokens = 0;
  int64_t failed = 0;
  int64_t within_sla = 0;
  nlohmann::json per_request = nlohmann::json::array();
  if (args.per_request || !args.prompts.empty()) {
    std::printf("%-4s %-16s %7s %7s %10s %14s  %-9s %s\n", "req", "agent", "prompt", "tokens",
                "TTFT ms", "mean TBT ms", "finish", "text");
  }
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const Outcome& o = outcomes[i];
    const GenerateResult& r = o.result;
    const double first = r.time_to_first_token_seconds();
    const double gap = r.mean_inter_token_seconds();
    if (!o.status.ok()) {
      ++failed;
    } else {
      ttft.push_back(first);
      if (r.token_ids.size() > 1) tbt.push_back(gap);
      e2e.push_back(o.e2e);
      tokens += static_cast<int64_t>(r.token_ids.size());
      if (first <= args.sla_ttft_s && gap <= args.sla_tbt_s) ++within_sla;
    }
    if (args.per_request || !args.prompts.empty()) {
      std::string text = o.status.ok() ? r.text : std::string(o.status.message());
      std::replace(text.begin(), text.end(), '\n', ' ');
      if (text.size() > 60) text = text.substr(0, 57) + "...";
      std::printf("%-4zu %-16s %7u %7zu %10.1f %14.2f  %-9s %s\n", i,
                  args.agents[o.agent].c_str(), r.stats.prompt_tokens(), r.token_ids.size(),
                  first * 1e3, gap * 1e3, o.status.ok() ? FinishName(r.finish_reason) : "error",
                  text.c_str());
    }
    per_request.push_back({{"agent", args.agents[o.agent]},
                           {"arrival_s", arrivals[i]},
                           {"ok", o.status.ok()},
                           {"error", std::string(o.status.message())},
                           {"prompt_tokens", r.stats.prompt_tokens()},
                           {"generated_tokens", r.token_ids.size()},
                           {"ttft_s", first},
                           {"mean_tbt_s", gap},
                           {"e2e_s", o.e2e},
                           {"reconnects", r.stats.reconnects()}});
  }
  const LatencySummary ttft_summary = Summarize(ttft);
  const LatencySummary tbt_summary = Summarize(tbt);
  const LatencySummary e2e_summary = Summarize(e2e);
  const double compliance =
      outcomes.empty() ? 0.0 : static_cast<double>(within_sla) / outcomes.size();
  std::printf("\n%-10s %10s %10s %10s %10s\n", "ms", "mean", "p50", "p90", "p99");
  for (const auto& [name, s] : {std::pair{"TTFT", ttft_summary}, std::pair{"TBT", tbt_summary},
                                std::pair{"E2E", e2e_summary}}) {
    std::printf("%-10s %10.1f %10.1f %10.1f %10.1f\n", name, s.mean * 1e3, s.p50 * 1e3,
                s.p90 * 1e3, s.p99 * 1e3);
  }
  std::printf("\n%zu requests (%lld failed) in %.2f s: %.1f tokens/s, %.2f requests/s; "
              "SLA (TTFT <= %.0f ms, TBT <= %.0f ms) met by %.1f%%\n",
              outcomes.size(), static_cast<long long>(failed), wall, tokens / wall,
              (outcomes.size() - failed) / wall, args.sla_ttft_s * 1e3, args.sla_tbt_s * 1e3,
              compliance * 100);

  const auto summary_json = [](const LatencySummary& s) {
    return nlohmann::json{{"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}};
  };
  nlohmann::json report = {
      {"agents", args.agents},
      {"requests", outcomes.size()},
      {"failed", failed},
      {"rate", args.rate},
      {"prompt_lengths", args.prompts.empty() ? args.prompt_lengths : "prompts"},
      {"output_tokens", args.output_tokens},
      {"wall_seconds", wall},
      {"output_tokens_per_second", tokens / wall},
      {"ttft_seconds", summary_json(ttft_summary)},
      {"tbt_seconds", summary_json(tbt_summary)},
      {"e2e_seconds", summary_json(e2e_summary)},
      {"sla", {{"ttft_s", args.sla_ttft_s}, {"tbt_s", args.sla_tbt_s}, {"compliance", compliance}}},
      {"per_request", per_request}};
  if (!args.json_path.empty()) {
    std::ofstream out(args.json_path);
    out << report.dump(2) << "\n";
    if (!out) {
      return Fail(absl::UnavailableError(absl::StrCat("--json: cannot write ", args.json_path)));
    }
  }
  return failed == 0 ? 0 : 2;
}

}  // namespace tophat::cli
