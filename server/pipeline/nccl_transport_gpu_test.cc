// The NCCL backend on what one GPU allows (label `gpu`): NCCL refuses two ranks of one
// communicator on the same GPU, so a transfer between two stages needs two GPUs
// (docs/operations.md, "Checking the NCCL pipeline on two GPUs"). Here: a one-stage set-up,
// a receive nobody answers failing within its timeout, and a set-up whose second stage never
// comes failing within the rendezvous's timeout.
#include <catch2/catch.hpp>
#include <chrono>

#include "server/pipeline/stage_transport.h"

namespace tophat::pipeline {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST_CASE("NCCL sets up one stage's communicators on cuda:0", "[gpu][pipeline]") {
  REQUIRE(NcclBuilt());
  auto rendezvous = Rendezvous::Join(
      {.address = "127.0.0.1:0", .rank = 0, .size = 1, .timeout = milliseconds(30000)});
  REQUIRE(rendezvous.ok());
  auto transport = ConnectNccl(**rendezvous, 0);
  INFO(transport.status().ToString());
  REQUIRE(transport.ok());
  CHECK((*transport)->device() == at::Device(at::kCUDA, 0));
  CHECK(std::string((*transport)->name()) == "NCCL");
  // A host tensor is refused, naming the device it must be on.
  at::Tensor host[] = {at::zeros({4})};
  absl::Status refused = (*transport)->Receive(host, 0, milliseconds(100));
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.message()), Catch::Contains("cuda:0"));
}

TEST_CASE("An NCCL receive nobody answers fails within its timeout, and the links stay failed",
          "[gpu][pipeline]") {
  auto rendezvous = Rendezvous::Join(
      {.address = "127.0.0.1:0", .rank = 0, .size = 1, .timeout = milliseconds(30000)});
  REQUIRE(rendezvous.ok());
  auto transport = ConnectNccl(**rendezvous, 0);
  REQUIRE(transport.ok());
  at::Tensor buffer[] = {at::zeros({1024}, at::TensorOptions().device(at::kCUDA, 0))};
  const Clock::time_point start = Clock::now();
  absl::Status received = (*transport)->Receive(buffer, 0, milliseconds(500));
  const double waited = SecondsSince(start);
  INFO(received.ToString());
  CHECK(received.code() == absl::StatusCode::kUnavailable);
  CHECK(waited >= 0.5);
  CHECK(waited < 10);  // the abort itself may take a few seconds; a hang would not return
  // Aborted links answer at once from now on.
  const Clock::time_point again = Clock::now();
  CHECK((*transport)->Receive(buffer, 0, milliseconds(60000)).code() ==
        absl::StatusCode::kUnavailable);
  CHECK(SecondsSince(again) < 1);
}

TEST_CASE("An NCCL set-up whose other stage never starts fails within the rendezvous timeout",
          "[gpu][pipeline]") {
  auto rendezvous = Rendezvous::Join(
      {.address = "127.0.0.1:0", .rank = 0, .size = 2, .timeout = milliseconds(2000)});
  REQUIRE(rendezvous.ok());
  const Clock::time_point start = Clock::now();
  auto transport = ConnectNccl(**rendezvous, 0);
  const double waited = SecondsSince(start);
  INFO(transport.status().ToString());
  REQUIRE_FALSE(transport.ok());
  CHECK(transport.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(transport.status().message()), Catch::Contains("are all 2 stages"));
  CHECK(waited < 20);
}

}  // namespace
}  // namespace tophat::pipeline
