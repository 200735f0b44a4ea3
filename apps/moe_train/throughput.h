// Throughput figures of a training run, per device.
#pragma once

namespace moe {

// Model FLOPs utilisation of each device: the run's training FLOP/s (tokens_per_second of the
// whole run, every pipeline stage and data-parallel replica together, x flops_per_token) shared
// over its `devices`, against the peak FLOP/s of one device.
double MfuPerDevice(double tokens_per_second, double flops_per_token, int devices,
                    double peak_flops_per_device);

}  // namespace moe
