#include "telemetry/config_reload.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/status/status.h"

namespace tophat {
namespace {

std::string Exposition(prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

TEST_CASE("A reload counts as applied or failed, and gauges the keys awaiting a restart",
          "[reload]") {
  prometheus::Registry registry;
  absl::StatusOr<ConfigReloader::Applied> next =
      ConfigReloader::Applied{.summary = "2 tokens", .awaiting_restart = {"a", "b"}};
  int applies = 0;
  ConfigReloader reloader(registry, {.daemon = "test", .config_path = "test.yaml", .apply = [&] {
                                       ++applies;
                                       return next;
                                     }});
  reloader.Reload();
  CHECK(applies == 1);
  CHECK_THAT(Exposition(registry),
             Catch::Contains("tophat_config_reloads_total{result=\"applied\"} 1"));
  CHECK_THAT(Exposition(registry), Catch::Contains("tophat_config_keys_awaiting_restart 2"));

  // A config that does not load changes nothing, the gauge included.
  next = absl::InvalidArgumentError("test.yaml:3: log_level: expected one of trace");
  reloader.Reload();
  CHECK_THAT(Exposition(registry),
             Catch::Contains("tophat_config_reloads_total{result=\"failed\"} 1"));
  CHECK_THAT(Exposition(registry), Catch::Contains("tophat_config_keys_awaiting_restart 2"));

  // Started without a config file: nothing to read.
  ConfigReloader without(registry, {.daemon = "test", .apply = [&] { return next; }});
  without.Reload();
  CHECK(applies == 2);
}

}  // namespace
}  // namespace tophat
