// Agent::GenerateOutline: outline-based parallel decoding (Jupiter §IV-C). The pure parts
// (parsing the outline, the points' markers, streaming in point order) are in outline.h.
//
// What is shared between the parts: the outline's KV. The outline runs as a request of its
// own and, when it finishes, the conversation cache keeps it (its device KV, its shallow
// rows, its cloud session parked). Each point is a request of its own whose prompt extends
// the outline's tokens with its marker: it takes a copy of the kept device KV and forks the
// parked cloud session (ForkSession: a copy of its blocks, not copy-on-write), so it computes
// and sends only its marker. Without a conversation cache (conversation_cache.enabled
// false), or with a cloud that does not fork (one that does not park sessions), every point computes
// and sends the whole prefix again. The points decode together; the cloud batches them.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "device_agent/agent.h"
#include "device_agent/app_request.h"
#include "device_agent/outline.h"

namespace tophat {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The totals of a request's parts, in the outer request's stats.
void AddStats(const v1::RequestStats& part, v1::RequestStats& total) {
  total.set_generated_tokens(total.generated_tokens() + part.generated_tokens());
  total.set_cloud_queue_seconds(total.cloud_queue_seconds() + part.cloud_queue_seconds());
  total.set_cloud_compute_seconds(total.cloud_compute_seconds() + part.cloud_compute_seconds());
  total.set_reconnects(total.reconnects() + part.reconnects());
  total.set_decode_rounds(total.decode_rounds() + part.decode_rounds());
  total.set_draft_tokens(total.draft_tokens() + part.draft_tokens());
  total.set_accepted_tokens(total.accepted_tokens() + part.accepted_tokens());
  total.set_forced_tokens(total.forced_tokens() + part.forced_tokens());
  total.set_forced_draft_tokens(total.forced_draft_tokens() + part.forced_draft_tokens());
  total.set_parallel_drafts(total.parallel_drafts() + part.parallel_drafts());
  total.set_parallel_hits(total.parallel_hits() + part.parallel_hits());
}

// `text`'s tokens as they appear after other text: a tokenizer may spell the start of a text
// differently from the same characters inside one (SentencePiece's "▁" at the start, a
// byte-level BPE's leading space), and the directive, markers and stop all follow text.
absl::StatusOr<std::vector<int32_t>> TokensAfterText(const Tokenizer& tokenizer,
                                                     std::string_view text) {
  constexpr std::string_view kContext = "a";
  absl::StatusOr<std::vector<int32_t>> alone = tokenizer.Encode(kContext);
  absl::StatusOr<std::vector<int32_t>> with = tokenizer.Encode(std::string(kContext) + std::string(text));
  if (!alone.ok()) return alone.status();
  if (!with.ok()) return with.status();
  if (with->size() > alone->size() && std::equal(alone->begin(), alone->end(), with->begin())) {
    return std::vector<int32_t>(with->begin() + static_cast<ptrdiff_t>(alone->size()),
                                with->end());
  }
  return tokenizer.Encode(text);  // the context merged with the text: encode it alone
}

}  // namespace

v1::GenerateResponse Agent::GenerateOutline(const v1::GenerateRequest& request,
                                            const std::function<bool(const TokenEvent&)>& on_tokens,
                                            const std::string& caller,
                                            const std::function<bool()>& client_gone) {
  const Clock::time_point start = Clock::now();
  const std::string id = request.request_id().empty() ? NewRequestId() : request.request_id();
  v1::GenerateResponse response;
  response.set_request_id(id);
  const auto fail = [&](const absl::Status& status) {
    response.set_finish_reason(v1::FINISH_REASON_ERROR);
    response.set_error(status.ToString());
    spdlog::warn("request {} (outline) failed: {}", id, status.ToString());
    return response;
  };
  const AgentConfig::Outline& outline = config_.outline;
  if (outline.directive.empty()) {
    return fail(absl::FailedPreconditionError(
        "outline: this agent has no outline template for its model; set outline.directive, "
        "outline.labels, outline.expand and outline.stop in its config (configs/agent.yaml)"));
  }
  const Tokenizer& tokenizer = *bundle_.tokenizer;
  absl::StatusOr<AppRequestPlan> plan =
      PlanAppRequest(request, tokenizer,
                     {.vocab_size = bundle_.config.vocab_size,
                      .context = bundle_.input->max_context(),
                      .max_prompt_bytes = config_.max_prompt_bytes,
                      .default_max_new_tokens = config_.default_max_new_tokens,
                      .eos_token_ids = bundle_.config.eos_token_ids});
  if (!plan.ok()) return fail(plan.status());
  absl::StatusOr<std::vector<int32_t>> directive = TokensAfterText(tokenizer, outline.directive);
  absl::StatusOr<std::vector<int32_t>> stop = TokensAfterText(tokenizer, outline.stop);
  if (!directive.ok()) return fail(directive.status());
  if (!stop.ok()) return fail(stop.status());
  if (stop->size() != 1) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("outline.stop \"", outline.stop, "\" is ", stop->size(),
                     " tokens in this model's vocabulary; it must be one")));
  }
  const size_t max_points = static_cast<size_t>(
      request.outline().max_points() > 0
          ? std::min<int64_t>(request.outline().max_points(), outline.max_points)
          : outline.max_points);

  std::atomic<bool> cancelled{false};
  {
    std::lock_guard<std::mutex> lock(requests_mutex_);
    if (outlines_running_.contains({caller, id}) || running_.contains({caller, id})) {
      return fail(absl::AlreadyExistsError(absl::StrCat("request_id ", id, " is already running")));
    }
    outlines_running_.emplace(std::pair(caller, id), &cancelled);
  }
  struct Unregister {
    Agent& agent;
    std::pair<std::string, std::string> key;
    ~Unregister() {
      std::lock_guard<std::mutex> lock(agent.requests_mutex_);
      agent.outlines_running_.erase(key);
    }
  } unregister{*this, {caller, id}};

  // A part: the request's sampling and options, this prompt, this budget, the outline's stop.
  const auto part = [&](const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                        const std::string& suffix) {
    v1::GenerateRequest r = request;
    r.clear_outline();
    r.clear_trace();
    r.set_request_id(id + suffix);
    r.mutable_prompt_ids()->clear_ids();  // also clears a text prompt (one of)
    for (int32_t token : prompt) r.mutable_prompt_ids()->add_ids(static_cast<uint32_t>(token));
    r.set_max_new_tokens(static_cast<uint32_t>(max_new_tokens));
    r.add_stop_token_ids(static_cast<uint32_t>(stop->front()));
    return r;
  };

  // 1. The outline, held back until it is whole: it must parse before anything is shown.
  std::vector<int32_t> prefix = plan->prompt;
  prefix.insert(prefix.end(), directive->begin(), directive->end());
  std::vector<int32_t> outline_ids;
  const v1::GenerateResponse outlined = Generate(
      part(prefix, std::min(outline.max_outline_tokens, plan->max_new_tokens), "/outline"),
      [&](const TokenEvent& event) {
        outline_ids.insert(outline_ids.end(), event.token_ids.begin(), event.token_ids.end());
        return !cancelled;
      },
      caller, client_gone);
  if (outlined.finish_reason() == v1::FINISH_REASON_ERROR ||
      outlined.finish_reason() == v1::FINISH_REASON_CANCELLED) {
    response = outlined;
    response.set_request_id(id);
    return response;
  }
  absl::StatusOr<std::string> outline_text = tokenizer.Decode(outline_ids);
  if (!outline_text.ok()) return fail(outline_text.status());
  const std::vector<OutlinePoint> points =
      ParseOutline(*outline_text, outline.labels, outline.stop, max_points);

  if (points.size() < 2) {
    // Not an outline: the prompt as it was, decoded sequentially.
    spdlog::info("request {}: the outline has {} point(s); decoding sequentially", id,
                 points.size());
    v1::GenerateRequest sequential = request;
    sequential.clear_outline();
    sequential.set_request_id(id + "/sequential");
    response = Generate(sequential, [&](const TokenEvent& event) {
      TokenEvent renamed = event;
      renamed.request_id = id;
      return !cancelled && on_tokens(renamed);
    }, caller, client_gone);
    response.set_request_id(id);
    response.mutable_stats()->set_outline_fallback(true);
    AddStats(outlined.stats(), *response.mutable_stats());
    return response;
  }

  // 2. The outline goes out, then each point's marker and expansion, in point order while
  // the points decode together.
  double first_token_at = -1;
  double last_token_at = 0;
  int64_t streamed_tokens = 0;
  InOrderStream stream(points.size(), [&](std::span<const int32_t> token_ids,
                                          const std::string& text) {
    last_token_at = SecondsSince(start);
    if (first_token_at < 0) first_token_at = last_token_at;
    streamed_tokens += static_cast<int64_t>(token_ids.size());
    TokenEvent event;
    event.request_id = id;
    event.token_ids.assign(token_ids.begin(), token_ids.end());
    event.text = text;
    if (!on_tokens(event)) cancelled = true;
    return !cancelled;
  });
  {
    // Through point 0's slot, ahead of its marker: the answer starts with the outline.
    stream.Push(0, outline_ids, *outline_text);
  }
  std::vector<v1::GenerateResponse> results(points.size());
  std::vector<std::thread> threads;
  threads.reserve(points.size());
  for (size_t i = 0; i < points.size(); ++i) {
    threads.emplace_back([&, i] {
      const std::string marker = ExpandMarker(outline.expand, points[i]);
      absl::StatusOr<std::vector<int32_t>> marker_ids = TokensAfterText(tokenizer, marker);
      if (!marker_ids.ok()) {
        results[i].set_finish_reason(v1::FINISH_REASON_ERROR);
        results[i].set_error(marker_ids.status().ToString());
        stream.Finish(i);
        return;
      }
      stream.Push(i, *marker_ids, marker);
      std::vector<int32_t> prompt = prefix;
      prompt.insert(prompt.end(), outline_ids.begin(), outline_ids.end());
      prompt.insert(prompt.end(), marker_ids->begin(), marker_ids->end());
      // Each point forks the outline's session (kept by the conversation cache when the
      // outline finished): its prompt and outline are neither computed nor sent again.
      results[i] =
          GenerateWith(part(prompt, std::min(outline.max_point_tokens, plan->max_new_tokens),
                            absl::StrCat("/point-", i)),
                       [&, i](const TokenEvent& event) {
                         return !cancelled && stream.Push(i, event.token_ids, event.text);
                       },
                       caller, client_gone, {.share_conversation = true});
      // The detokenizer's last piece comes with the final response.
      if (!results[i].text().empty()) stream.Push(i, {}, results[i].text());
      stream.Finish(i);
    });
  }
  for (std::thread& thread : threads) thread.join();

  v1::RequestStats* stats = response.mutable_stats();
  stats->set_prompt_tokens(static_cast<uint32_t>(plan->prompt.size()));
  AddStats(outlined.stats(), *stats);
  for (size_t i = 0; i < points.size(); ++i) {
    const v1::GenerateResponse& result = results[i];
    if (result.finish_reason() == v1::FINISH_REASON_ERROR) {
      return fail(absl::InternalError(
          absl::StrCat("outline point ", i + 1, " (", points[i].text, "): ", result.error())));
    }
    AddStats(result.stats(), *stats);
  }
  stats->set_outline_points(static_cast<uint32_t>(points.size()));
  stats->set_time_to_first_token_seconds(std::max(0.0, first_token_at));
  if (streamed_tokens > 1) {
    stats->set_mean_inter_token_seconds((last_token_at - first_token_at) /
                                        static_cast<double>(streamed_tokens - 1));
  }
  response.set_finish_reason(cancelled || stream.stopped() ? v1::FINISH_REASON_CANCELLED
                                                           : v1::FINISH_REASON_STOP);
  return response;
}

}  // namespace tophat
