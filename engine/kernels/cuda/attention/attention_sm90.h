// The Hopper attention kernels (attention_sm90.cu) behind the bf16 CUDA AttentionForward: they
// run where sm90_device.h says sm_90a kernels run, unless a test or benchmark turns them off to
// check or time the mma.sync kernels they replace there.
#pragma once

namespace moe::cuda::attention {

// Process-wide; default true. false: every later call runs the mma.sync kernels.
void AllowSm90Attention(bool allowed);

}  // namespace moe::cuda::attention
