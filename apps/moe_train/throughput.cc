#include "apps/moe_train/throughput.h"

#include <glog/logging.h>

namespace moe {

double MfuPerDevice(double tokens_per_second, double flops_per_token, int devices,
                    double peak_flops_per_device) {
  CHECK_GT(devices, 0);
  CHECK_GT(peak_flops_per_device, 0);
  return tokens_per_second * flops_per_token / (devices * peak_flops_per_device);
}

}  // namespace moe
