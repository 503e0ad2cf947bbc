#include "sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <span>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "scheduler/batch_planner.h"
#include "scheduler/cloud_placement.h"
#include "scheduler/decode_decisions.h"
#include "scheduler/moving_average.h"
#include "scheduler/step_time_predictor.h"
#include "scheduler/uplink_pacer.h"
#include "scheduler/wire_bytes.h"

namespace tophat::sim {
namespace {

// Percentiles of millions of samples without keeping them: buckets 1% wide on a log scale
// from 1 µs, so a percentile is within 1% of the exact one.
class LogHistogram {
 public:
  void Add(double seconds) {
    const double x = std::max(seconds, kMin);
    const auto bucket = static_cast<size_t>(std::log(x / kMin) / kLogStep);
    if (bucket >= counts_.size()) counts_.resize(bucket + 1, 0);
    ++counts_[bucket];
    ++total_;
    sum_ += seconds;
  }
  LatencySummary Summary() const {
    LatencySummary s;
    if (total_ == 0) return s;
    s.mean = sum_ / static_cast<double>(total_);
    s.p50 = Quantile(0.5);
    s.p90 = Quantile(0.9);
    s.p99 = Quantile(0.99);
    return s;
  }

 private:
  static constexpr double kMin = 1e-6;
  static constexpr double kLogStep = 0.00995033;  // log(1.01)
  double Quantile(double q) const {
    // Nearest rank, as Summarize: the smallest bucket holding ceil(q·n) samples.
    const auto rank = static_cast<int64_t>(std::ceil(q * static_cast<double>(total_)));
    int64_t seen = 0;
    for (size_t b = 0; b < counts_.size(); ++b) {
      seen += counts_[b];
      if (seen >= rank) return kMin * std::exp((static_cast<double>(b) + 0.5) * kLogStep);
    }
    return 0;
  }
  std::vector<int64_t> counts_;
  int64_t total_ = 0;
  double sum_ = 0;
};

enum class EventType : uint8_t {
  kArrival,         // a request arrives at device `a`
  kInputDone,       // request `a`'s input submodel finished `b` positions (b = 0: decode)
  kOpenAtCloud,     // request `a`'s Open reaches its cloud
  kWorkAtCloud,     // `b` positions of request `a` reach its cloud (b = 0: a decode token)
  kStepDone,        // cloud `a` finished its oldest step in flight
  kStageFree,       // cloud `a`'s first stage can take another step
  kResultAtDevice,  // `b` positions' results of request `a` reach its device (0: decode)
  kOutputDone,      // the device's output submodel finished them
  kCloseAtCloud,    // request `a`'s Close reaches its cloud
  kHostCheck,       // the shared host's next job may be done (a: the epoch it was planned in)
  kCloudDown,       // cloud `a` stops (an outage)
  kCloudUp,         // cloud `a` is back, empty
  kFailover,        // request `a` notices its cloud is gone and moves
  kChunkRead,       // device `a`'s prompt chunk `b` (its pacer's sequence) reaches the cloud
  kChunkReceipt,    // the cloud's receipt of device `a`'s chunk `b` reaches the device
  kPacerCheck,      // device `a`'s uplink pacer may release a held chunk now
};

struct Event {
  double time;
  uint64_t sequence;  // ties in time run in the order scheduled: deterministic
  EventType type;
  int64_t a;
  int64_t b;
  // For a request's events that involve its cloud, and a cloud's own: the request's (or the
  // cloud's) epoch when scheduled; a later failover (outage) makes them stale.
  uint32_t epoch;
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

struct Request {
  int64_t device = 0;
  int64_t cloud = 0;
  int64_t prompt = 0;
  int64_t output = 0;
  double arrival = 0;
  int64_t kv_blocks = 0;
  int64_t chunk = 0;  // a replayed request's recorded chunk size (0: choose)
  bool admitted = false;
  int64_t held = 0;              // prompt positions at the cloud before admission
  int64_t held_replay = 0;       // ... of a failover's replay
  int64_t prompt_returned = 0;   // positions whose results the device has processed
  int64_t generated = 0;
  int64_t round = 1;  // positions of its current decode round (1 + drafts)
  bool in_step = false;  // in a cloud step in flight (a session is in at most one)
  int64_t prompt_at_cloud = 0;   // prompt positions its cloud has been given as work
  bool decoding_at_cloud = false;  // past its prompt at its cloud (the engine's `decoding`)
  // The engine's Session::decode_away_seconds: from its last decode result's leaving the
  // cloud to its next decode work's arrival (the shortest seen; 0 until measured).
  double last_decode_done = -1;
  double decode_away = 0;
  uint64_t planned_in = 0;       // the last step planning that saw its head of line
  bool started = false;   // placed on a cloud (its Open sent)
  bool finished = false;
  uint32_t epoch = 0;     // failovers so far: events of an earlier cloud are stale
  int64_t prompt_sent = 0;      // prompt positions put on the uplink
  int64_t prompt_received = 0;  // prompt positions whose results reached the device
  bool round_in_flight = false;  // a decode round sent, its result not yet at the device
  int64_t replay_total = 0;      // positions of the replay in progress (failover)
  int64_t replay_received = 0;
  bool replay_carries_round = false;  // the replay holds the decode round that was in flight
  bool replay_pending = false;   // at the cloud, its replay not yet all in steps: work after
                                 // it waits (a session's work runs in order)
  double last_token = 0;
  double first_token = 0;
};

// A device's compute job on a shared host: `work` seconds of one core, then `done` happens.
struct HostJob {
  double work = 0;
  EventType done = EventType::kInputDone;
  int64_t a = 0;
  int64_t b = 0;
};

// A prompt chunk computed and held for the uplink pacer.
struct HeldChunk {
  int64_t request = 0;
  int64_t positions = 0;
};

struct Device {
  std::deque<int64_t> queue;  // requests waiting for a free slot
  // On a shared host: the jobs of its prompt lane [0] and decode lane [1], first come first
  // served within a lane; each lane's head is in progress.
  std::deque<HostJob> host_lanes[2];
  int64_t running = 0;
  double compute_free = 0;
  double decode_compute_free = 0;
  double uplink_free = 0;
  double downlink_free = 0;
  // The agent's uplink pacing (scheduler/uplink_pacer.h, the agent's own code): prompt
  // chunks wait here until the pacer releases them, on the cloud's receipts. Absent when
  // pacing is off.
  std::optional<UplinkPacer> pacer;
  std::deque<HeldChunk> held;
  uint64_t next_sequence = 0;
  double pacer_check_at = -1;  // a kPacerCheck planned for then
  // While a step is planned (stamped with its number): the device's group in that plan.
  uint64_t planned_in = 0;
  int32_t plan_group = 0;
};

struct CloudState {
  std::vector<PendingWork> pending;   // admitted work in arrival order
  std::vector<int64_t> pending_request;
  std::vector<uint8_t> pending_replay;  // each item: a failover's replay (results skip output)
  bool alive = true;
  uint32_t epoch = 0;  // outages so far: its steps' events from before one are stale
  std::deque<int64_t> waiting;        // requests waiting for KV
  int64_t kv_free = 0;
  int64_t running = 0;
  // Steps in flight through the stages, oldest first: each one's (request, positions; 0:
  // decode) results. At most `stages` of them, as the engine's Launch/Complete.
  struct StepResult {
    int64_t request = 0;
    int64_t positions = 0;  // 0: decode
    bool replay = false;
  };
  std::deque<std::vector<StepResult>> in_flight;
  double first_stage_free = 0;  // when stage 0 can take the next step
  double last_done = 0;         // when the newest step in flight leaves the last stage
  bool wakeup_scheduled = false;
  std::vector<PlannedWork> plan;
  std::vector<PendingWork> plannable;      // the heads of line of sessions not in flight
  std::vector<size_t> plannable_index;     // each one's index in `pending`
  std::vector<int32_t> plannable_group;    // each one's plan group (its device's)
  RoundRobinOrder plan_order;              // plannable items in the engine's order
  std::vector<GroupShare> shares;          // per plan group (a device with work in this step)
  std::vector<int64_t> plan_group_device;  // each plan group's device
  int64_t decoding = 0;                    // admitted sessions past their prompts
  std::vector<int32_t> decoding_by_device; // ... per device (sized on first use)
  std::multiset<double> decoding_away;     // ... their decode_away, where measured
  BatchPlanner planner;
  // What the agents know of it: its last load report.
  CloudCandidate reported;
  double reported_at = -1;
  uint64_t report_epoch = 1;
  MovingAverage recent_tokens{0.8};  // of batched tokens per step (μ)
  CloudStats stats;
};

class Simulation {
 public:
  explicit Simulation(const SimConfig& config, PromptLengthSampler prompts)
      : config_(config),
        prompts_(std::move(prompts)),
        rng_(config.seed),
        acceptance_rng_(config.seed ^ 0x5eedacce97a11ceULL),
        placement_rng_(config.seed ^ 0x91ace3e47d0c1a55ULL),
        predictor_(8192, 0.0), devices_(static_cast<size_t>(config.devices)),
        clouds_(static_cast<size_t>(config.clouds)),
        placed_(static_cast<size_t>(config.devices * config.clouds), {0, 0}) {
    if (config.device.pacing_lead_s >= 0) {
      for (Device& device : devices_) device.pacer.emplace(config.device.pacing_lead_s);
    }
    for (const StepPoint& p : config.cloud.step_time) {
      predictor_.Observe(static_cast<int64_t>(std::llround(p.tokens)), p.seconds);
    }
    for (CloudState& cloud : clouds_) {
      cloud.kv_free = config.cloud.kv_blocks;
      cloud.reported = {.connected = true, .epoch = 1, .kv_blocks_free = config.cloud.kv_blocks,
                        .kv_blocks_total = config.cloud.kv_blocks};
    }
  }

  SimResult Run() {
    for (size_t i = 0; i < config_.replay.size(); ++i) {
      Schedule(config_.replay[i].arrival_s, EventType::kArrival, config_.replay[i].device,
               static_cast<int64_t>(i) + 1);
    }
    const double rate = config_.replay.empty() ? config_.workload.requests_per_device_per_second
                                               : 0.0;
    for (int64_t d = 0; d < config_.devices && rate > 0; ++d) {
      const double first = Exponential(rate);
      if (first < config_.duration_s) Schedule(first, EventType::kArrival, d, 0);
    }
    for (const CloudOutage& outage : config_.outages) {
      Schedule(outage.down_at_s, EventType::kCloudDown, outage.cloud, 0);
      if (std::isfinite(outage.up_at_s)) {
        Schedule(outage.up_at_s, EventType::kCloudUp, outage.cloud, 0);
      }
    }
    const double end = config_.duration_s + config_.drain_limit_s;
    while (!events_.empty()) {
      const Event e = events_.top();
      if (e.time > end) break;
      events_.pop();
      now_ = e.time;
      ++result_.events;
      Handle(e);
    }
    result_.simulated_seconds = now_;
    result_.ttft_s = ttft_.Summary();
    result_.tbt_s = tbt_.Summary();
    result_.e2e_s = e2e_.Summary();
    result_.request_tbt_s = Summarize(request_tbt_);
    for (const CloudState& cloud : clouds_) result_.clouds.push_back(cloud.stats);
    return result_;
  }

 private:
  void Schedule(double time, EventType type, int64_t a, int64_t b, uint32_t epoch = 0) {
    events_.push({time, sequence_++, type, a, b, epoch});
  }
  // A request's event that involves its current cloud: stale after a failover.
  void ScheduleForRequest(double time, EventType type, int64_t id, int64_t b) {
    Schedule(time, type, id, b, requests_[static_cast<size_t>(id)].epoch);
  }
  bool Stale(const Event& e) const {
    switch (e.type) {
      case EventType::kOpenAtCloud:
      case EventType::kWorkAtCloud:
      case EventType::kResultAtDevice:
      case EventType::kFailover:
        return requests_[static_cast<size_t>(e.a)].epoch != e.epoch;
      case EventType::kStepDone:
      case EventType::kStageFree:
        return clouds_[static_cast<size_t>(e.a)].epoch != e.epoch;
      case EventType::kCloseAtCloud:  // b: the cloud it closes on
        return clouds_[static_cast<size_t>(e.b)].epoch != e.epoch;
      default:
        return false;
    }
  }
  double Exponential(double rate) { return std::exponential_distribution<double>(rate)(rng_); }
  // Acceptance draws have a generator of their own, so that a run with speculation draws the
  // same arrivals and prompts as one without.
  double Uniform() { return std::uniform_real_distribution<double>(0, 1)(acceptance_rng_); }
  double Jitter() {
    const double sigma = config_.device.bandwidth_log_sigma;
    return sigma > 0 ? std::exp(std::normal_distribution<double>(0, sigma)(rng_)) : 1.0;
  }
  // Time on the device's compute, first come first served: prompt chunks on one lane, and
  // decode positions on another when they run beside them.
  // Then `type` (a, b) happens when it is done: on the device's own CPU, or on the shared
  // host's cores.
  void Compute(int64_t d, double seconds, bool decode, EventType type, int64_t a, int64_t b) {
    Device& device = devices_[static_cast<size_t>(d)];
    const bool decode_lane = decode && config_.device.decode_beside_prefill;
    if (config_.host_cores <= 0) {
      double& lane = decode_lane ? device.decode_compute_free : device.compute_free;
      lane = std::max(now_, lane) + seconds;
      return Schedule(lane, type, a, b);
    }
    std::deque<HostJob>& lane = device.host_lanes[decode_lane ? 1 : 0];
    lane.push_back({.work = seconds, .done = type, .a = a, .b = b});
    if (lane.size() > 1) return;  // behind the lane's job in progress
    AdvanceHost();
    host_active_.insert({host_work_done_ + seconds, d * 2 + (decode_lane ? 1 : 0)});
    PlanHost();
  }

  // Processor sharing by virtual time: `host_work_done_` is the work each job in progress
  // has done since the start (all progress at one rate), so a job started at V with w to do
  // ends when it reaches V + w.
  double HostRate() const {
    if (host_active_.empty()) return 0;
    const double free_cores = std::max(0.0, config_.host_cores - host_cloud_busy_);
    return std::min(1.0, free_cores / static_cast<double>(host_active_.size()));
  }
  void AdvanceHost() {
    host_work_done_ += (now_ - host_updated_) * HostRate();
    host_updated_ = now_;
  }
  // After the jobs in progress or the clouds' share changed: when the first job will end.
  void PlanHost() {
    ++host_epoch_;
    const double rate = HostRate();
    if (host_active_.empty() || rate <= 0) return;
    const double remaining = std::max(0.0, host_active_.begin()->first - host_work_done_);
    Schedule(now_ + remaining / rate, EventType::kHostCheck, static_cast<int64_t>(host_epoch_),
             0);
  }
  void OnHostCheck(uint64_t epoch) {
    if (epoch != host_epoch_) return;  // planned before a change; a later check stands
    AdvanceHost();
    while (!host_active_.empty() && host_active_.begin()->first <= host_work_done_ + 1e-12) {
      const int64_t key = host_active_.begin()->second;
      host_active_.erase(host_active_.begin());
      std::deque<HostJob>& lane = devices_[static_cast<size_t>(key / 2)].host_lanes[key % 2];
      const HostJob job = lane.front();
      lane.pop_front();
      Schedule(now_, job.done, job.a, job.b);
      if (!lane.empty()) host_active_.insert({host_work_done_ + lane.front().work, key});
    }
    PlanHost();
  }
  // The clouds' share of the host: `host_cloud_cores` for each cloud with a step in flight.
  void UpdateHostCloudShare() {
    if (config_.host_cores <= 0) return;
    double busy = 0;
    for (const CloudState& cloud : clouds_) busy += cloud.in_flight.empty() ? 0 : 1;
    busy *= config_.host_cloud_cores;
    if (busy == host_cloud_busy_) return;
    AdvanceHost();
    host_cloud_busy_ = busy;
    PlanHost();
  }
  double MessageBytes(int64_t positions) const {
    return MessageWireBytes(positions, config_.bytes_per_token);
  }
  // Simulated seconds on the pacer's clock, rounded up: at a wake-up planned for the pacer's
  // own release time, the pacer must see that time reached, not a nanosecond before it.
  static UplinkPacer::Clock::time_point PacerTime(double seconds) {
    return UplinkPacer::Clock::time_point(
        std::chrono::ceil<UplinkPacer::Clock::duration>(std::chrono::duration<double>(seconds)));
  }
  // A transfer on a link of `bytes_per_second`, after those before it; when it arrives.
  double Transfer(double& link_free, double bytes, double bytes_per_second) {
    link_free = std::max(now_, link_free) + bytes / (bytes_per_second * Jitter());
    return link_free + config_.device.one_way_delay_s;
  }

  void Handle(const Event& e) {
    if (Stale(e)) return;
    switch (e.type) {
      case EventType::kArrival: return OnArrival(e.a, e.b);
      case EventType::kInputDone: return OnInputDone(e.a, e.b);
      case EventType::kOpenAtCloud: return OnOpen(e.a);
      case EventType::kWorkAtCloud: return OnWork(e.a, e.b);
      case EventType::kStepDone: return OnStepDone(e.a);
      case EventType::kStageFree:
        clouds_[static_cast<size_t>(e.a)].wakeup_scheduled = false;
        return StartStep(e.a);
      case EventType::kResultAtDevice: return OnResult(e.a, e.b);
      case EventType::kOutputDone: return OnOutputDone(e.a, e.b);
      case EventType::kCloseAtCloud: return OnClose(e.a, e.b);
      case EventType::kHostCheck: return OnHostCheck(static_cast<uint64_t>(e.a));
      case EventType::kCloudDown: return OnCloudDown(e.a);
      case EventType::kCloudUp: return OnCloudUp(e.a);
      case EventType::kFailover: return Failover(e.a);
      case EventType::kChunkRead: return OnChunkRead(e.a, e.b);
      case EventType::kChunkReceipt: return OnChunkReceipt(e.a, e.b);
      case EventType::kPacerCheck:
        devices_[static_cast<size_t>(e.a)].pacer_check_at = -1;
        return ReleaseChunks(e.a);
    }
  }

  // `replayed`: 1 + the index of a replayed request, 0 for a Poisson arrival.
  void OnArrival(int64_t d, int64_t replayed) {
    Request r{.device = d, .arrival = now_};
    if (replayed > 0) {
      const ReplayRequest& recorded = config_.replay[static_cast<size_t>(replayed - 1)];
      r.prompt = recorded.prompt_tokens;
      r.output = recorded.output_tokens;
      r.chunk = recorded.prompt_chunk;
    } else {
      const double rate = config_.workload.requests_per_device_per_second;
      const double next = now_ + Exponential(rate);
      if (next < config_.duration_s) Schedule(next, EventType::kArrival, d, 0);
      r.prompt = prompts_.Sample(rng_, config_.workload.max_prompt_tokens);
      r.output = config_.workload.output_tokens;
    }
    ++result_.requests_arrived;
    const int64_t block = config_.cloud.kv_block_size;
    r.kv_blocks = (r.prompt + r.output + block - 1) / block;
    requests_.push_back(r);
    const auto id = static_cast<int64_t>(requests_.size() - 1);
    Device& device = devices_[static_cast<size_t>(d)];
    const int64_t limit = config_.device.concurrent_requests;
    if (limit > 0 && device.running >= limit) {
      device.queue.push_back(id);
    } else {
      Start(id);
    }
  }

  void Start(int64_t id) {
    Request& r = requests_[static_cast<size_t>(id)];
    Device& device = devices_[static_cast<size_t>(r.device)];
    ++device.running;
    if (r.kv_blocks > config_.cloud.kv_blocks) {
      ++result_.requests_rejected;
      return Finish(id, /*finished=*/false);
    }
    Begin(id);
  }

  // Places a request that has not started on a cloud and starts its prompt; with no cloud
  // alive, it waits for one (as the agent waits to connect).
  void Begin(int64_t id) {
    Request& r = requests_[static_cast<size_t>(id)];
    r.cloud = Place(r.device);
    if (r.cloud < 0) {
      cloudless_.push_back(id);
      return;
    }
    r.started = true;
    CloudState& cloud = clouds_[static_cast<size_t>(r.cloud)];
    ++cloud.stats.sessions;
    ScheduleForRequest(now_ + config_.device.one_way_delay_s, EventType::kOpenAtCloud, id, 0);
    // The prompt's chunks through the input submodel, back to back; each goes up when done.
    const int64_t chunk = ChunkSize(r, cloud);
    for (int64_t done = 0; done < r.prompt; done += chunk) {
      const int64_t n = std::min(chunk, r.prompt - done);
      Compute(r.device, static_cast<double>(n) * config_.device.input_seconds_per_token,
              /*decode=*/false, EventType::kInputDone, id, n);
    }
  }

  double Uplink(int64_t d) const {
    return config_.device_links.empty()
               ? config_.device.uplink_bytes_per_second
               : config_.device_links[static_cast<size_t>(d)].uplink_bytes_per_second;
  }
  double Downlink(int64_t d) const {
    return config_.device_links.empty()
               ? config_.device.downlink_bytes_per_second
               : config_.device_links[static_cast<size_t>(d)].downlink_bytes_per_second;
  }

  int64_t ChunkSize(const Request& r, const CloudState& cloud) const {
    if (r.chunk > 0) return r.chunk;
    if (config_.prompt_chunk > 0) return config_.prompt_chunk;
    const double mean_batched_tokens = std::max(1.0, cloud.recent_tokens.value());
    const ChunkSizeInputs inputs{.prompt_tokens = r.prompt,
                                 .bytes_per_token = config_.bytes_per_token,
                                 .uplink_bytes_per_second = Uplink(r.device),
                                 .mean_batched_tokens = mean_batched_tokens,
                                 .min_chunk = config_.min_chunk,
                                 .max_chunk = config_.max_chunk,
                                 .max_step_seconds = config_.max_step_seconds};
    return std::max<int64_t>(1, ChooseChunkSize(inputs, predictor_));
  }

  // The agent's placement (scheduler/cloud_placement.h) over what the clouds last reported
  // and what this device placed since.
  int64_t Place(int64_t d) {
    if (config_.clouds == 1) return clouds_[0].alive ? 0 : -1;
    candidates_.clear();
    for (size_t c = 0; c < clouds_.size(); ++c) {
      CloudState& cloud = clouds_[c];
      if (now_ - cloud.reported_at >= config_.cloud.load_report_interval_s) {
        cloud.reported.running_sessions = cloud.running;
        cloud.reported.waiting_sessions = static_cast<int64_t>(cloud.waiting.size());
        cloud.reported.kv_blocks_free = cloud.kv_free;
        cloud.reported_at = now_;
        ++cloud.report_epoch;
      }
      CloudCandidate candidate = cloud.reported;
      const auto& [epoch, count] = placed_[static_cast<size_t>(d) * clouds_.size() + c];
      candidate.placed_since_report = epoch == cloud.report_epoch ? count : 0;
      candidates_.push_back(candidate);
    }
    const std::optional<size_t> chosen =
        PlaceRequest(candidates_, {.random = placement_rng_()});
    if (!chosen) return -1;  // none alive
    const size_t c = *chosen;
    auto& [epoch, count] = placed_[static_cast<size_t>(d) * clouds_.size() + c];
    count = epoch == clouds_[c].report_epoch ? count + 1 : 1;
    epoch = clouds_[c].report_epoch;
    return static_cast<int64_t>(c);
  }

  void OnInputDone(int64_t id, int64_t positions) {
    Request& r = requests_[static_cast<size_t>(id)];
    Device& device = devices_[static_cast<size_t>(r.device)];
    if (positions > 0 && device.pacer.has_value()) {
      // A prompt chunk waits for the pacer; a decode round goes past the chunks it holds.
      device.held.push_back({.request = id, .positions = positions});
      return ReleaseChunks(r.device);
    }
    const double arrives = Transfer(device.uplink_free,
                                    MessageBytes(positions == 0 ? r.round : positions),
                                    Uplink(r.device));
    if (positions > 0) {
      r.prompt_sent += positions;
    } else {
      r.round_in_flight = true;
    }
    if (!r.started) return;  // no cloud to send to: the replay will carry it
    ScheduleForRequest(arrives, EventType::kWorkAtCloud, id, positions);
  }

  // The held prompt chunks the device's pacer lets go now, in order; a wake-up when it will
  // let the next go without a receipt.
  void ReleaseChunks(int64_t d) {
    Device& device = devices_[static_cast<size_t>(d)];
    const double rate = Uplink(d);
    while (!device.held.empty()) {
      if (!device.pacer->MayRelease(PacerTime(now_), rate)) {
        if (const auto at = device.pacer->ReleaseAt(rate)) {
          // Never now: a wake-up that finds the pacer still closed would plan itself again.
          const double when =
              std::max(std::chrono::duration<double>(at->time_since_epoch()).count(),
                       std::nextafter(now_, std::numeric_limits<double>::infinity()));
          if (device.pacer_check_at != when) {
            device.pacer_check_at = when;
            Schedule(when, EventType::kPacerCheck, d, 0);
          }
        }
        return;
      }
      const HeldChunk chunk = device.held.front();
      device.held.pop_front();
      Request& r = requests_[static_cast<size_t>(chunk.request)];
      r.prompt_sent += chunk.positions;
      if (!r.started) continue;  // no cloud to send to: the replay will carry it
      const double bytes = MessageBytes(chunk.positions);
      const double arrives = Transfer(device.uplink_free, bytes, rate);
      const uint64_t sequence = device.next_sequence++;
      device.pacer->Released(0, sequence, static_cast<size_t>(bytes), PacerTime(now_), rate);
      ScheduleForRequest(arrives, EventType::kWorkAtCloud, chunk.request, chunk.positions);
      Schedule(arrives, EventType::kChunkRead, d, static_cast<int64_t>(sequence));
    }
  }
  // The cloud read a chunk: its receipt goes down the device's downlink, behind the results
  // already on it (a cloud that died with the chunk on the link frees the pacer as a broken
  // stream does).
  void OnChunkRead(int64_t d, int64_t sequence) {
    constexpr int64_t kReceiptBytes = 24;  // ChunkReceived: session and sequence
    Device& device = devices_[static_cast<size_t>(d)];
    const double arrives = Transfer(device.downlink_free,
                                    static_cast<double>(OnWireBytes(kReceiptBytes)), Downlink(d));
    Schedule(arrives, EventType::kChunkReceipt, d, sequence);
  }
  void OnChunkReceipt(int64_t d, int64_t sequence) {
    devices_[static_cast<size_t>(d)].pacer->Acknowledged(0, static_cast<uint64_t>(sequence),
                                                         PacerTime(now_));
    ReleaseChunks(d);
  }

  void OnOpen(int64_t id) {
    Request& r = requests_[static_cast<size_t>(id)];
    CloudState& cloud = clouds_[static_cast<size_t>(r.cloud)];
    if (!cloud.alive) return;  // gone before it arrived: the failover reopens elsewhere
    if (cloud.waiting.empty() && CanAdmit(cloud, r)) {
      Admit(id, cloud);
    } else if (static_cast<int64_t>(cloud.waiting.size()) >=
               config_.cloud.max_waiting_sessions) {
      // As the engine: RESOURCE_EXHAUSTED, and the agent fails the request. What the device
      // still computes or sends for it goes nowhere (the new epoch drops what is on its way).
      ++cloud.stats.refused;
      ++result_.requests_refused;
      ++r.epoch;
      r.started = false;
      Finish(id, /*finished=*/false);
    } else {
      cloud.waiting.push_back(id);
      cloud.stats.max_waiting =
          std::max(cloud.stats.max_waiting, static_cast<int64_t>(cloud.waiting.size()));
    }
  }

  bool CanAdmit(const CloudState& cloud, const Request& r) const {
    return cloud.running < config_.cloud.max_running_sessions && cloud.kv_free >= r.kv_blocks;
  }

  void Admit(int64_t id, CloudState& cloud) {
    Request& r = requests_[static_cast<size_t>(id)];
    cloud.kv_free -= r.kv_blocks;
    ++cloud.running;
    cloud.stats.max_running = std::max(cloud.stats.max_running, cloud.running);
    r.admitted = true;
    if (r.held_replay > 0) {
      AddWork(cloud, id, r.held_replay, false, /*replay=*/true);
      r.held_replay = 0;
    }
    if (r.held > 0) {
      AddWork(cloud, id, r.held, false);
      r.held = 0;
    }
  }

  // `positions` < 0: a failover's replay of -positions positions (a prompt to the cloud).
  void OnWork(int64_t id, int64_t positions) {
    Request& r = requests_[static_cast<size_t>(id)];
    CloudState& cloud = clouds_[static_cast<size_t>(r.cloud)];
    if (!cloud.alive) return;  // lost with it: the failover's replay carries it
    if (!r.admitted) {
      // Decode cannot come before admission: the prompt (or the replay) comes first.
      (positions < 0 ? r.held_replay : r.held) += std::abs(positions);
      return;
    }
    AddWork(cloud, id, std::abs(positions), positions == 0, positions < 0);
  }

  void AddWork(CloudState& cloud, int64_t id, int64_t positions, bool decode,
               bool replay = false) {
    Request& r = requests_[static_cast<size_t>(id)];
    // The engine's `decoding`: its last prompt chunk (or a decode round, or a replay of a
    // request past its prompt) has arrived.
    if (!decode) r.prompt_at_cloud += positions;
    if (decode && r.last_decode_done >= 0 && now_ > r.last_decode_done) {
      const double away = now_ - r.last_decode_done;
      SetDecodeAway(cloud, r, r.decode_away == 0 ? away : std::min(r.decode_away, away));
    }
    if (decode || r.prompt_at_cloud >= r.prompt || (replay && r.generated > 0)) {
      SetDecoding(cloud, r, true);
    }
    cloud.pending.push_back({.num_tokens = decode ? r.round : positions,
                             .decode = decode,
                             .group = static_cast<int32_t>(r.device)});
    cloud.pending_request.push_back(id);
    cloud.pending_replay.push_back(replay ? 1 : 0);
    if (replay) requests_[static_cast<size_t>(id)].replay_pending = true;
    StartStep(r.cloud);
  }

  void SetDecoding(CloudState& cloud, Request& r, bool decoding) {
    if (r.decoding_at_cloud == decoding) return;
    r.decoding_at_cloud = decoding;
    if (cloud.decoding_by_device.empty()) {
      cloud.decoding_by_device.assign(static_cast<size_t>(config_.devices), 0);
    }
    const int32_t change = decoding ? 1 : -1;
    cloud.decoding += change;
    cloud.decoding_by_device[static_cast<size_t>(r.device)] += change;
    if (r.decode_away > 0) {
      if (decoding) {
        cloud.decoding_away.insert(r.decode_away);
      } else {
        cloud.decoding_away.erase(cloud.decoding_away.find(r.decode_away));
      }
    }
  }
  void SetDecodeAway(CloudState& cloud, Request& r, double away) {
    if (r.decoding_at_cloud && r.decode_away > 0) {
      cloud.decoding_away.erase(cloud.decoding_away.find(r.decode_away));
    }
    r.decode_away = away;
    if (r.decoding_at_cloud) cloud.decoding_away.insert(away);
  }

  // Starts a step if the first stage is free, fewer than `stages` steps are in flight, and
  // some session not already in one has work. With one stage: a step at a time.
  void StartStep(int64_t c) {
    CloudState& cloud = clouds_[static_cast<size_t>(c)];
    const int64_t stages = config_.cloud.stages;
    if (!cloud.alive || cloud.pending.empty() || static_cast<int64_t>(cloud.in_flight.size()) >= stages) return;
    if (now_ < cloud.first_stage_free) {
      if (!cloud.wakeup_scheduled) {
        cloud.wakeup_scheduled = true;
        Schedule(cloud.first_stage_free, EventType::kStageFree, c, 0, cloud.epoch);
      }
      return;
    }
    // As the engine's Launch: each session's head of line only (its work runs in order),
    // first come first served within a device and round-robin across devices (a device's
    // oldest session before any device's second), each device a group of weight 1 whose
    // prompts are capped while another device decodes (DecodeStretchStepTokens).
    const uint64_t stamp = ++plannings_;
    cloud.plannable_index.clear();
    cloud.plannable_group.clear();
    cloud.plan_group_device.clear();
    for (size_t i = 0; i < cloud.pending.size(); ++i) {
      Request& r = requests_[static_cast<size_t>(cloud.pending_request[i])];
      if (r.in_step || r.planned_in == stamp) continue;
      if (r.replay_pending && cloud.pending_replay[i] == 0) continue;  // behind its replay
      r.planned_in = stamp;  // later items of the session wait behind this one
      Device& device = devices_[static_cast<size_t>(r.device)];
      if (device.planned_in != stamp) {
        device.planned_in = stamp;
        device.plan_group = static_cast<int32_t>(cloud.plan_group_device.size());
        cloud.plan_group_device.push_back(r.device);
      }
      cloud.plannable_index.push_back(i);
      cloud.plannable_group.push_back(device.plan_group);
    }
    if (cloud.plannable_index.empty()) return;  // a step in flight finishing brings it back
    const std::span<const int32_t> ordered = cloud.plan_order.Order(
        cloud.plannable_group, static_cast<int32_t>(cloud.plan_group_device.size()));
    cloud.plannable.clear();
    for (const int32_t k : ordered) {
      PendingWork work = cloud.pending[cloud.plannable_index[k]];
      work.group = devices_[static_cast<size_t>(work.group)].plan_group;
      cloud.plannable.push_back(work);
    }
    BatchLimits limits{.max_batch_tokens = config_.cloud.max_batch_tokens,
                       .max_sequences = config_.cloud.max_running_sessions};
    const std::optional<int64_t> capped_step =
        DecodeStretchStepTokens(predictor_, cloud.decoding, config_.cloud.decode_step_stretch,
                                cloud.decoding_away.empty() ? 0.0 : *cloud.decoding_away.begin(),
                                config_.cloud.max_batch_tokens);
    if (capped_step) limits.capped_step_tokens = *capped_step;
    cloud.shares.resize(cloud.plan_group_device.size());
    for (size_t g = 0; g < cloud.shares.size(); ++g) {
      const size_t device = static_cast<size_t>(cloud.plan_group_device[g]);
      cloud.shares[g] = {.capped = capped_step.has_value() &&
                                   cloud.decoding > cloud.decoding_by_device[device]};
    }
    const int64_t tokens =
        cloud.planner.Plan(cloud.plannable, limits, cloud.shares,
                           static_cast<uint64_t>(cloud.stats.steps), cloud.plan);
    std::vector<CloudState::StepResult>& results = cloud.in_flight.emplace_back();
    for (const PlannedWork& work : cloud.plan) {
      const size_t index =
          cloud.plannable_index[static_cast<size_t>(ordered[static_cast<size_t>(work.index)])];
      PendingWork& item = cloud.pending[index];
      item.num_tokens -= work.num_tokens;
      const int64_t id = cloud.pending_request[index];
      requests_[static_cast<size_t>(id)].in_step = true;
      results.push_back({.request = id,
                         .positions = item.decode ? 0 : work.num_tokens,
                         .replay = cloud.pending_replay[index] != 0});
      if (cloud.pending_replay[index] != 0 && item.num_tokens == 0) {
        requests_[static_cast<size_t>(id)].replay_pending = false;
      }
    }
    // Done items leave; the rest keep their order.
    size_t kept = 0;
    for (size_t i = 0; i < cloud.pending.size(); ++i) {
      if (cloud.pending[i].num_tokens > 0) {
        cloud.pending[kept] = cloud.pending[i];
        cloud.pending_request[kept] = cloud.pending_request[i];
        cloud.pending_replay[kept] = cloud.pending_replay[i];
        ++kept;
      }
    }
    cloud.pending.resize(kept);
    cloud.pending_request.resize(kept);
    cloud.pending_replay.resize(kept);
    // g(μ) through all stages, even ones: each stage takes its share, and a step leaves the
    // last stage no sooner than the one before it plus its own share.
    const double seconds = predictor_.Predict(static_cast<double>(tokens));
    const double per_stage = seconds / static_cast<double>(stages);
    cloud.first_stage_free = now_ + per_stage;
    cloud.last_done = std::max(now_ + seconds, cloud.last_done + per_stage);
    ++cloud.stats.steps;
    cloud.stats.busy_seconds += per_stage;
    cloud.stats.batched_tokens += static_cast<double>(tokens);
    cloud.recent_tokens.Add(static_cast<double>(tokens));
    Schedule(cloud.last_done, EventType::kStepDone, c, 0, cloud.epoch);
    UpdateHostCloudShare();
    StartStep(c);  // with more stages, the next may start when the first stage is free
  }

  void OnStepDone(int64_t c) {
    CloudState& cloud = clouds_[static_cast<size_t>(c)];
    const std::vector<CloudState::StepResult> results = std::move(cloud.in_flight.front());
    cloud.in_flight.pop_front();
    for (const CloudState::StepResult& result : results) {
      const int64_t id = result.request;
      const int64_t positions = result.positions;
      Request& r = requests_[static_cast<size_t>(id)];
      r.in_step = false;
      if (positions == 0) r.last_decode_done = now_;
      Device& device = devices_[static_cast<size_t>(r.device)];
      const double bytes = MessageBytes(positions == 0 ? r.round : positions);
      ScheduleForRequest(Transfer(device.downlink_free, bytes, Downlink(r.device)),
                         EventType::kResultAtDevice, id, result.replay ? -positions : positions);
    }
    StartStep(c);
    UpdateHostCloudShare();
  }

  // `positions` < 0: a piece of a failover's replay.
  void OnResult(int64_t id, int64_t positions) {
    Request& r = requests_[static_cast<size_t>(id)];
    if (positions < 0) return OnReplayResult(id, -positions);
    if (positions > 0) r.prompt_received += positions;
    if (positions == 0) r.round_in_flight = false;  // its result is here: no replay needs it
    const double seconds =
        positions == 0 ? static_cast<double>(r.round) * config_.device.output_decode_seconds
                       : static_cast<double>(positions) * config_.device.output_seconds_per_token;
    Compute(r.device, seconds, /*decode=*/positions == 0, EventType::kOutputDone, id, positions);
  }

  void OnOutputDone(int64_t id, int64_t positions) {
    Request& r = requests_[static_cast<size_t>(id)];
    if (positions > 0) {
      r.prompt_returned += positions;
      if (r.prompt_returned < r.prompt) return;
      // The last prompt position's head gives the first token (its time is in the chunk's).
      ttft_.Add(now_ - r.arrival);
      r.first_token = now_;
      r.generated = 1;
    } else {
      // The round's tokens: its accepted drafts (each with probability α, up to the first
      // rejected) and the one the cloud's verification gives; they arrive together, so each
      // counts an equal share of the round's time.
      int64_t tokens = 1;
      while (tokens < r.round && Uniform() < config_.device.acceptance) ++tokens;
      tokens = std::min(tokens, r.output - r.generated);
      for (int64_t i = 0; i < tokens; ++i) tbt_.Add((now_ - r.last_token) / tokens);
      r.generated += tokens;
      result_.generated_tokens += static_cast<double>(tokens - 1);
    }
    r.last_token = now_;
    result_.generated_tokens += 1;
    if (r.generated >= r.output) return Finish(id, /*finished=*/true);
    // The next round: its drafts (no more than the tokens still to come need), the input
    // submodel, then up.
    const int64_t drafts = std::min(config_.device.draft_tokens, r.output - r.generated - 1);
    r.round = 1 + std::max<int64_t>(0, drafts);
    Compute(r.device,
            config_.device.input_decode_seconds +
                static_cast<double>(r.round - 1) * config_.device.draft_step_seconds,
            /*decode=*/true, EventType::kInputDone, id, 0);
  }

  // The last piece of a failover's replay completes it: the prompt positions it carried
  // that had not come back before go through the output submodel (those that had are
  // skipped, as the agent skips replayed positions); a decode round it carried completes.
  void OnReplayResult(int64_t id, int64_t positions) {
    Request& r = requests_[static_cast<size_t>(id)];
    r.replay_received += positions;
    if (r.replay_received < r.replay_total) return;
    if (r.generated == 0) {
      const int64_t fresh = r.replay_total - r.prompt_received;
      r.prompt_received = r.replay_total;
      if (fresh > 0) {
        Compute(r.device, static_cast<double>(fresh) * config_.device.output_seconds_per_token,
                /*decode=*/false, EventType::kOutputDone, id, fresh);
      }
    } else if (r.replay_carries_round) {
      Compute(r.device, static_cast<double>(r.round) * config_.device.output_decode_seconds,
              /*decode=*/true, EventType::kOutputDone, id, 0);
    }
  }

  void OnCloudDown(int64_t c) {
    CloudState& cloud = clouds_[static_cast<size_t>(c)];
    if (!cloud.alive) return;
    cloud.alive = false;
    ++cloud.epoch;  // its steps in flight never finish
    cloud.pending.clear();
    cloud.pending_request.clear();
    cloud.pending_replay.clear();
    cloud.waiting.clear();
    cloud.in_flight.clear();
    cloud.wakeup_scheduled = false;
    cloud.kv_free = config_.cloud.kv_blocks;
    cloud.running = 0;
    cloud.decoding = 0;
    std::fill(cloud.decoding_by_device.begin(), cloud.decoding_by_device.end(), 0);
    cloud.decoding_away.clear();
    cloud.reported.connected = false;  // the agents' streams to it break
    cloud.reported_at = now_;
    UpdateHostCloudShare();
    for (size_t id = 0; id < requests_.size(); ++id) {
      Request& r = requests_[id];
      if (r.finished || !r.started || r.cloud != c) continue;
      ++cloud.stats.failed_over;
      Schedule(now_ + config_.failover_detect_s, EventType::kFailover, static_cast<int64_t>(id),
               0, r.epoch);
    }
  }

  void OnCloudUp(int64_t c) {
    CloudState& cloud = clouds_[static_cast<size_t>(c)];
    if (cloud.alive) return;
    cloud.alive = true;
    cloud.first_stage_free = now_;
    cloud.last_done = now_;
    cloud.reported = {.connected = true, .epoch = ++cloud.report_epoch,
                      .kv_blocks_free = config_.cloud.kv_blocks,
                      .kv_blocks_total = config_.cloud.kv_blocks};
    cloud.reported_at = now_;
    // Requests that found no cloud alive go now.
    std::deque<int64_t> waiting;
    waiting.swap(cloudless_);
    for (const int64_t id : waiting) {
      if (requests_[static_cast<size_t>(id)].started) {
        Failover(id);
      } else {
        Begin(id);
      }
    }
  }

  // The request's cloud is gone: on a live one, the replay of every position the lost one
  // had been sent, then on where it was.
  void Failover(int64_t id) {
    Request& r = requests_[static_cast<size_t>(id)];
    if (r.finished) return;
    ++r.epoch;  // what the lost cloud would still have sent is gone
    r.admitted = false;
    r.decoding_at_cloud = false;  // the lost cloud's counts went with it
    r.prompt_at_cloud = 0;
    r.last_decode_done = -1;
    r.held = r.held_replay = 0;
    r.in_step = false;
    const int64_t c = Place(r.device);
    if (c < 0) {
      cloudless_.push_back(id);
      return;
    }
    r.cloud = c;
    ++result_.failovers;
    ++clouds_[static_cast<size_t>(c)].stats.sessions;
    ScheduleForRequest(now_ + config_.device.one_way_delay_s, EventType::kOpenAtCloud, id, 0);
    // Prompt: the chunks sent so far. Decoding: the prompt and every token but the newest
    // (the next round's input), and the round in flight if there is one.
    r.replay_total = r.generated == 0
                         ? r.prompt_sent
                         : r.prompt + r.generated - 1 + (r.round_in_flight ? r.round : 0);
    r.replay_received = 0;
    r.replay_carries_round = r.generated > 0 && r.round_in_flight;
    r.replay_pending = false;
    if (r.replay_total == 0) return;
    Device& device = devices_[static_cast<size_t>(r.device)];
    const double bytes = MessageBytes(r.replay_total);
    ScheduleForRequest(Transfer(device.uplink_free, bytes, Uplink(r.device)),
                       EventType::kWorkAtCloud, id, -r.replay_total);
  }

  void Finish(int64_t id, bool finished) {
    Request& r = requests_[static_cast<size_t>(id)];
    r.finished = true;
    if (finished) {
      ++result_.requests_finished;
      e2e_.Add(now_ - r.arrival);
      if (r.generated > 1) {
        request_tbt_.push_back((now_ - r.first_token) / static_cast<double>(r.generated - 1));
      }
      Schedule(now_ + config_.device.one_way_delay_s, EventType::kCloseAtCloud, id, r.cloud,
               clouds_[static_cast<size_t>(r.cloud)].epoch);
    }
    Device& device = devices_[static_cast<size_t>(r.device)];
    --device.running;
    if (!device.queue.empty()) {
      const int64_t next = device.queue.front();
      device.queue.pop_front();
      Start(next);
    }
  }

  void OnClose(int64_t id, int64_t c) {
    Request& r = requests_[static_cast<size_t>(id)];
    CloudState& cloud = clouds_[static_cast<size_t>(c)];
    cloud.kv_free += r.kv_blocks;
    --cloud.running;
    SetDecoding(cloud, r, false);
    while (!cloud.waiting.empty()) {
      const int64_t next = cloud.waiting.front();
      if (!CanAdmit(cloud, requests_[static_cast<size_t>(next)])) break;
      cloud.waiting.pop_front();
      Admit(next, cloud);
    }
  }

  const SimConfig& config_;
  PromptLengthSampler prompts_;
  std::mt19937_64 rng_;
  std::mt19937_64 acceptance_rng_;
  // Placement draws too: a run with an outage places differently, and must still see the
  // same arrivals and prompts as one without.
  std::mt19937_64 placement_rng_;
  StepTimePredictor predictor_;
  uint64_t plannings_ = 0;  // steps planned, on every cloud: the stamp of the latest
  std::vector<Device> devices_;
  std::vector<CloudState> clouds_;
  std::vector<std::pair<uint64_t, int64_t>> placed_;  // [device][cloud]: (report epoch, count)
  std::vector<CloudCandidate> candidates_;
  std::vector<Request> requests_;
  std::deque<int64_t> cloudless_;  // requests waiting for a cloud to be alive
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t sequence_ = 0;
  double now_ = 0;
  // The shared host (config.host_cores > 0): jobs in progress by (virtual end, device*2 +
  // lane), the work each has done by host_updated_, the clouds' cores, the plan's epoch.
  std::set<std::pair<double, int64_t>> host_active_;
  double host_work_done_ = 0;
  double host_updated_ = 0;
  double host_cloud_busy_ = 0;
  uint64_t host_epoch_ = 0;
  LogHistogram ttft_, tbt_, e2e_;
  std::vector<double> request_tbt_;
  SimResult result_;
};

}  // namespace

double MessageWireBytes(int64_t positions, double bytes_per_token) {
  constexpr size_t kMessageFields = 32;  // session, sequence, positions, dtype and shape
  return static_cast<double>(OnWireBytes(
      static_cast<size_t>(std::llround(static_cast<double>(positions) * bytes_per_token)) +
      kMessageFields));
}

absl::StatusOr<SimResult> Simulate(const SimConfig& config) {
  auto fail = [](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("simulate: ", field, " ", why));
  };
  if (config.devices < 1) return fail("devices", "must be at least 1");
  if (config.clouds < 1) return fail("clouds", "must be at least 1");
  if (!(config.duration_s > 0)) return fail("duration_s", "must be positive");
  if (config.cloud.step_time.empty()) return fail("cloud.step_time", "needs at least one point");
  for (const StepPoint& p : config.cloud.step_time) {
    if (!(p.tokens >= 1) || !(p.seconds > 0)) {
      return fail("cloud.step_time", absl::StrCat("has a point of ", p.tokens, " tokens in ",
                                                   p.seconds, " s; tokens >= 1, seconds > 0"));
    }
  }
  if (config.cloud.max_batch_tokens < 1 || config.cloud.kv_blocks < 1 ||
      config.cloud.kv_block_size < 1) {
    return fail("cloud", "max_batch_tokens, kv_blocks and kv_block_size must be positive");
  }
  const DeviceProfile& d = config.device;
  if (!(d.uplink_bytes_per_second > 0) || !(d.downlink_bytes_per_second > 0)) {
    return fail("device", "link rates must be positive");
  }
  if (d.input_seconds_per_token < 0 || d.input_decode_seconds < 0 ||
      d.output_seconds_per_token < 0 || d.output_decode_seconds < 0 || d.one_way_delay_s < 0 ||
      d.bandwidth_log_sigma < 0 || d.concurrent_requests < 0) {
    return fail("device", "times, delay and jitter cannot be negative");
  }
  if (config.cloud.stages < 1) return fail("cloud.stages", "must be >= 1");
  if (config.host_cores < 0) return fail("host_cores", "cannot be negative (0: no shared host)");
  for (const CloudOutage& o : config.outages) {
    if (o.cloud < 0 || o.cloud >= config.clouds || !(o.down_at_s >= 0) ||
        !(o.up_at_s > o.down_at_s)) {
      return fail("outages", absl::StrCat("has cloud ", o.cloud, " (of ", config.clouds,
                                          ") down at ", o.down_at_s, " s and up at ",
                                          o.up_at_s, " s; the cloud must exist and come back "
                                          "after it went down"));
    }
  }
  if (config.failover_detect_s < 0) return fail("failover_detect_s", "cannot be negative");
  if (config.host_cores > 0 &&
      !(config.host_cloud_cores >= 0 && config.host_cloud_cores < config.host_cores)) {
    return fail("host_cloud_cores", absl::StrCat("must be in [0, host_cores = ",
                                                 config.host_cores, "): ",
                                                 config.host_cloud_cores));
  }
  if (d.draft_tokens < 0 || d.draft_step_seconds < 0) {
    return fail("device.draft_tokens", "drafts and their time cannot be negative");
  }
  if (!(d.acceptance >= 0 && d.acceptance <= 1)) {
    return fail("device.acceptance", "must be a probability in [0, 1]");
  }
  if (config.workload.output_tokens < 1) return fail("workload.output_tokens", "must be >= 1");
  if (config.workload.max_prompt_tokens < 1) {
    return fail("workload.max_prompt_tokens", "must be >= 1");
  }
  if (!(config.bytes_per_token > 0)) return fail("bytes_per_token", "must be positive");
  for (const ReplayRequest& r : config.replay) {
    if (r.device < 0 || r.device >= config.devices || r.prompt_tokens < 1 ||
        r.output_tokens < 1 || !(r.arrival_s >= 0)) {
      return fail("replay", absl::StrCat("has a request of device ", r.device, " (of ",
                                         config.devices, "), ", r.prompt_tokens, " prompt and ",
                                         r.output_tokens, " output tokens at ", r.arrival_s,
                                         " s"));
    }
  }
  if (!config.device_links.empty()) {
    if (static_cast<int64_t>(config.device_links.size()) != config.devices) {
      return fail("device_links", absl::StrCat("has ", config.device_links.size(),
                                               " entries for ", config.devices, " devices"));
    }
    for (const DeviceLinkRates& l : config.device_links) {
      if (!(l.uplink_bytes_per_second > 0) || !(l.downlink_bytes_per_second > 0)) {
        return fail("device_links", "rates must be positive");
      }
    }
  }
  auto prompts = PromptLengthSampler::FromSpec(config.workload.prompts);
  if (!prompts.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulate: workload.prompts: ", prompts.status().message()));
  }
  Simulation simulation(config, std::move(*prompts));
  return simulation.Run();
}

absl::StatusOr<std::vector<StepPoint>> StepPointsFromEngineReport(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  const nlohmann::json report = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.contains("cases") || !report["cases"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a tophat-bench-engine report (no \"cases\" array)"));
  }
  std::vector<StepPoint> points;
  for (const nlohmann::json& c : report["cases"]) {
    if (!c.contains("tokens") || !c.contains("engine_ms") || !c["tokens"].is_number() ||
        !c["engine_ms"].is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a case without numeric \"tokens\" and \"engine_ms\""));
    }
    points.push_back({c["tokens"].get<double>(), c["engine_ms"].get<double>() / 1e3});
  }
  if (points.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no cases"));
  return points;
}

}  // namespace tophat::sim

namespace tophat::sim {

absl::StatusOr<RecordedAblation> LoadAblationReport(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  const nlohmann::json report = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a tophat bench --ablation report: ", what));
  };
  if (report.is_discarded()) return bad("not JSON");
  if (!report.contains("runs") || !report["runs"].is_array()) return bad("no \"runs\"");
  if (!report.contains("links") || !report["links"].contains("devices")) return bad("no links");
  RecordedAblation out;
  try {
    const nlohmann::json& links = report["links"];
    out.one_way_delay_s = links.at("one_way_delay_s").get<double>();
    out.bytes_per_token = links.at("bytes_per_token").get<double>();
    out.output_tokens = report.at("output_tokens").get<int64_t>();
    for (const nlohmann::json& d : links["devices"]) {
      out.links.push_back({d.at("uplink_bytes_per_second").get<double>(),
                           d.at("downlink_bytes_per_second").get<double>()});
    }
    for (const nlohmann::json& run : report["runs"]) {
      RecordedRun r{.config = run.at("config").get<std::string>(),
                    .dataset = run.at("dataset").get<std::string>(),
                    .rate = run.at("rate").get<double>()};
      if (run.contains("chunk_size_by_device") && !run["chunk_size_by_device"].empty()) {
        r.chunk_size = static_cast<int64_t>(run["chunk_size_by_device"][0].get<double>());
      }
      r.cloud_cores = run.value("cloud_cores", 0.0);
      r.agent_cores = run.value("agent_cores", 0.0);
      r.host_cores = run.value("host_cores", 0.0);
      for (const nlohmann::json& q : run.at("per_request")) {
        if (!q.at("ok").get<bool>()) continue;
        r.requests.push_back({.arrival_s = q.at("arrival_s").get<double>(),
                              .device = q.at("device").get<int64_t>(),
                              .prompt_tokens = q.at("prompt_tokens").get<int64_t>(),
                              .output_tokens = q.at("generated_tokens").get<int64_t>(),
                              .prompt_chunk = q.value("prompt_chunk_size", int64_t{0})});
        r.ttft_s.push_back(q.at("ttft_s").get<double>());
        r.mean_tbt_s.push_back(q.at("mean_tbt_s").get<double>());
      }
      out.runs.push_back(std::move(r));
    }
    if (report.contains("step_time_curve")) {
      for (const auto& [config, points] : report["step_time_curve"].items()) {
        std::vector<StepPoint>& curve = out.step_curves[config];
        for (const nlohmann::json& p : points) {
          curve.push_back({p.at(0).get<double>(), p.at(1).get<double>()});
        }
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
  return out;
}

}  // namespace tophat::sim
