// Token-budget batch planning for one cloud engine step (Sarathi-style chunked prefill):
// decode and verification work first, whole; then prefill chunks, split to fill the budget,
// shared fairly between the devices (groups) whose work is waiting.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

namespace tophat {

class StepTimePredictor;

// One session's pending work at the head of its queue.
struct PendingWork {
  int64_t num_tokens = 0;  // positions waiting to run
  bool decode = false;     // decode/verification: latency-critical, never split
  int32_t group = 0;       // whose work it is (the cloud: the device), an index into groups
};

struct PlannedWork {
  int32_t index = 0;       // into the `pending` span
  int64_t num_tokens = 0;  // <= pending[index].num_tokens
};

struct BatchLimits {
  int64_t max_batch_tokens = 512;
  int64_t max_sequences = 256;
  // How far the prefill of all `capped` groups together may fill the step, in tokens, the
  // decode work planned in it included (the cloud: devices whose prompts would otherwise
  // stretch the steps another device is decoding in). Counting the decode work that is in
  // the step, not every session that decodes, leaves the room of a token that is on its way
  // to prompts: at load most decoding sessions' tokens are away at any step. At least one
  // capped prefill token is planned, so that capped work always moves.
  int64_t capped_step_tokens = std::numeric_limits<int64_t>::max();
};

// A group's claim on a step's prefill budget.
struct GroupShare {
  double weight = 1;    // > 0: its share against the others' while both have work
  bool capped = false;  // its prefill counts against BatchLimits::capped_step_tokens
};

// Plans steps. `pending` is in arrival order; the plan keeps that order within the decode
// group and within each group's prefill, so a group's waiting work is served first-come
// first-served. Decode work comes first; work that does not fit waits for the next step,
// except that a step never comes out empty: a single item larger than the whole budget runs
// alone (decode) or is cut to the budget (prefill).
//
// The budget left after decode work is split between the groups with prefill waiting by
// weighted max-min fairness (water-filling): a group that wants less than its weighted share
// gets all it wants, and what it leaves is shared by the others in proportion to their
// weights. One group alone gets the whole budget. Tokens that do not divide evenly go one
// each to the groups in an order that rotates with `rotation` (the caller counts steps), so
// that over steps no group is favoured: deficit round robin with a quantum of one token.
//
// Reuses its scratch and `plan` (cleared), so steady state does not allocate.
class BatchPlanner {
 public:
  // `groups` is indexed by PendingWork::group; a group beyond it has weight 1, uncapped.
  // Returns the planned token count.
  int64_t Plan(std::span<const PendingWork> pending, const BatchLimits& limits,
               std::span<const GroupShare> groups, uint64_t rotation,
               std::vector<PlannedWork>& plan);

 private:
  // Splits `budget` over demand_ (weights weight_) into grant_: weighted max-min fair.
  void WaterFill(int64_t budget, uint64_t rotation);

  std::vector<int64_t> demand_;  // per group: prefill tokens wanted
  std::vector<double> weight_;
  std::vector<int64_t> grant_;   // per group: prefill tokens granted this step
  std::vector<int32_t> order_;   // groups with demand, by demand over weight
  std::vector<int64_t> capped_;  // scratch: every group's demand while the capped ones share
};

// The cloud's rule for prompts while devices decode (EngineOptions::decode_step_stretch):
// while `decoding` sessions are past their prompts, the prompt work of every device with
// fewer of them than that (some other device is decoding) may stretch a step so far that a
// decoding device's round grows at most `stretch` times. A round is its time away from the
// cloud (`decode_away_seconds`: links and device, the shortest of the decoding sessions';
// 0 when not measured) and its step, g(decoding) alone; with steps of S it is at most the
// time away and 2S (a step in progress when its token arrives, then its own), so
//   S <= ((stretch - 1) * away + stretch * g) / 2,
// and never less than stretch * g (the rule with the round unknown, and what holds where
// the time away is short: on loopback). Over edge links the time away is tens of
// milliseconds and prompts move in steps of several milliseconds; with stretch * g alone, a
// small model's decode step (1.3 ms on a CPU) let prompts through a token a step.
// Returns the tokens such a step may hold, the decode work in it included (BatchLimits::
// capped_step_tokens: those devices' prompts fill what the decode work planned leaves, a
// token at the least), or nothing when no cap applies: stretch 0, nothing decoding, or no
// step times measured yet. The engine and the simulator both plan with it.
std::optional<int64_t> DecodeStretchStepTokens(const StepTimePredictor& step_time,
                                               int64_t decoding, double stretch,
                                               double decode_away_seconds,
                                               int64_t max_batch_tokens);

// The order a step plans pending work in: first come first served within a group (the cloud:
// a device) and round-robin across groups, every group's oldest item before any group's
// second, so that a group with many sessions in flight cannot keep another's work out of the
// steps (BatchPlanner keeps this order within decode work and within prefill work). Within a
// rank (how many of its group's items came before) items keep their arrival order. The
// engine and the simulator both order with it. Reuses its scratch: steady state does not
// allocate.
class RoundRobinOrder {
 public:
  // `groups[i]`: item i's group, in [0, num_groups), items in arrival order. Returns the
  // items' indices in planning order, valid until the next call.
  std::span<const int32_t> Order(std::span<const int32_t> groups, int32_t num_groups);
  // Makes room for calls of up to `items` items and `groups` groups (at load, so that the
  // step allocates nothing).
  void Reserve(size_t items, size_t groups);

 private:
  std::vector<int32_t> seen_;   // per group: its items counted so far
  std::vector<int32_t> rank_;   // per item
  std::vector<int32_t> order_;
};

// One group of weight 1: the plan of BatchPlanner with no fairness to apply (tests, tools).
int64_t PlanBatch(std::span<const PendingWork> pending, const BatchLimits& limits,
                  std::vector<PlannedWork>& plan);

}  // namespace tophat
