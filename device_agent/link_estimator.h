// What the agent learns about its link to the cloud from real transfers (HAT's β_i,up and
// β_i,down, DESIGN.md "State monitor"). Every chunk's round trip, minus the queue and compute
// time the cloud reports with its result, is network time: a fixed latency plus the bytes
// over the bandwidth. Hidden states are the same size both ways, so a weighted least-squares
// line through (payload bytes, network seconds), with older samples fading, gives the
// round-trip cost per byte (1/β_up + 1/β_down per direction-byte) and the latency. The two
// directions cannot be told apart this way; the estimate is the symmetric bandwidth that
// explains the measured cost, which is what equation 6 needs (its two transfer terms add
// up to this cost). Pure arithmetic; not thread-safe.
#pragma once

#include <cstdint>

namespace tophat {

class LinkEstimator {
 public:
  // `forgetting` in (0, 1]: each new sample multiplies the weight of the old ones by it.
  explicit LinkEstimator(double forgetting = 0.98);

  // One round trip: `bytes_each_way` of hidden states went up and came back down, and the
  // network (not the cloud) took `network_seconds`. Non-positive or non-finite samples are
  // ignored.
  void Observe(double bytes_each_way, double network_seconds);

  // Bytes per second each way, assuming equal rates; 0 until the samples differ enough in
  // size to separate bandwidth from latency (or if they show no cost per byte).
  double symmetric_bytes_per_second() const;
  // The one-way latency; 0 while unknown.
  double one_way_latency_seconds() const;
  int64_t samples() const { return samples_; }

 private:
  // Slope and intercept of network seconds against round-trip bytes; false if unknown.
  bool Fit(double* slope, double* intercept) const;

  double forgetting_;
  double weight_ = 0, sum_x_ = 0, sum_y_ = 0, sum_xx_ = 0, sum_xy_ = 0;
  int64_t samples_ = 0;
};

}  // namespace tophat
