#include "device_agent/request_stats.h"

#include <chrono>

#include <catch2/catch.hpp>
#include <prometheus/registry.h>

namespace tophat {
namespace {

using Clock = RequestStatsRecorder::Clock;
using std::chrono::milliseconds;

TEST_CASE("Request stats time the first token and split each later round over its tokens") {
  prometheus::Registry registry;
  AgentMetrics metrics(registry);
  const Clock::time_point arrival = Clock::now();
  RequestStatsRecorder recorder(&metrics, arrival);
  recorder.RecordTokens(arrival + milliseconds(400), 1);
  // A round of 4 tokens 200 ms later: 50 ms each. Then one token 100 ms after that.
  recorder.RecordTokens(arrival + milliseconds(600), 4);
  recorder.RecordTokens(arrival + milliseconds(700), 1);
  v1::ForwardResult result;
  result.set_queue_seconds(0.25);
  result.set_compute_seconds(0.5);
  recorder.RecordResult(result);
  recorder.RecordResult(result);
  recorder.RecordReconnect();
  recorder.RecordDecodeNetwork(0.03);
  recorder.RecordDecodeNetwork(0.09);
  recorder.RecordDecodeNetwork(-0.001);  // rounding: the cloud's durations exceed our round trip

  const v1::RequestStats stats =
      recorder.Finish(v1::FINISH_REASON_LENGTH,
                      {.prompt_tokens = 7, .generated_tokens = 6, .prompt_chunk_size = 16});
  CHECK(stats.time_to_first_token_seconds() == Approx(0.4));
  // (4 x 50 ms + 100 ms) / 5 inter-token gaps.
  CHECK(stats.mean_inter_token_seconds() == Approx(0.06));
  CHECK(stats.cloud_queue_seconds() == 0.5);
  CHECK(stats.cloud_compute_seconds() == 1.0);
  CHECK(stats.reconnects() == 1);
  CHECK(stats.prompt_tokens() == 7);
  CHECK(stats.generated_tokens() == 6);
  CHECK(stats.prompt_chunk_size() == 16);
  CHECK(stats.decode_network_seconds() == Approx(0.12));
  CHECK(stats.decode_network_chunks() == 3);
  CHECK(stats.decode_network_max_seconds() == Approx(0.09));
  CHECK(metrics.decode_network_seconds.Collect().histogram.sample_count == 3);
  CHECK(metrics.generation_tokens.Value() == 6);
  CHECK(metrics.time_to_first_token_seconds.Collect().histogram.sample_count == 1);
  CHECK(metrics.inter_token_latency_seconds.Collect().histogram.sample_count == 5);
  CHECK(metrics.requests_length.Value() == 1);
  CHECK(metrics.requests_stop.Value() == 0);
}

TEST_CASE("Request stats complete the last round trace when the cloud confirms its rollback") {
  RequestStatsRecorder recorder(/*metrics=*/nullptr, Clock::now());
  recorder.RecordTruncated(3);  // before any round: only the length is kept
  CHECK(recorder.cloud_kv_length() == 3);
  v1::DecodeRound first;
  first.set_cloud_kv_length(9);
  recorder.AddRoundTrace(first);
  recorder.AddRoundTrace(v1::DecodeRound());
  recorder.RecordTruncated(12);
  const v1::RequestStats stats = recorder.Finish(v1::FINISH_REASON_STOP, {});
  REQUIRE(stats.rounds_size() == 2);
  CHECK(stats.rounds(0).cloud_kv_length() == 9);
  CHECK(stats.rounds(1).cloud_kv_length() == 12);
}

}  // namespace
}  // namespace tophat
