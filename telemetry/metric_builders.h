// One-line registration of an unlabelled Prometheus metric, for the daemons' metric structs.
#pragma once

#include <string>
#include <utility>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace tophat {

inline prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                                   const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

inline prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                       const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

inline prometheus::Histogram& AddHistogram(prometheus::Registry& registry,
                                           const std::string& name, const std::string& help,
                                           prometheus::Histogram::BucketBoundaries buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
      {}, std::move(buckets));
}

}  // namespace tophat
