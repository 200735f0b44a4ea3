// Tensor-core building blocks shared by the bf16 kernels (attention, grouped GEMMs): cp.async
// global -> shared copies, ldmatrix, mma.sync m16n8k16 (bf16 in, fp32 accumulate), bf16 packing.
//
// Fragment layout (PTX ISA, mma.m16n8k16): lane = 4 g + t. A (16, 16) is a[0] rows g, columns
// 2t, 2t + 1; a[1] rows g + 8; a[2], a[3] the same at columns + 8. B (16, 8) is b0 rows 2t,
// 2t + 1 of column g and b1 rows + 8. An fp32 accumulator (16, 8) holds c[0..1] at row g,
// columns 2t, 2t + 1 and c[2..3] at row g + 8.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace moe::cuda {

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; reads nothing and writes zeros when !valid.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddress(smem)),
               "l"(gmem), "r"(valid ? 16 : 0));
}

// 4-byte global -> shared copy; writes zero when !valid.
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddress(smem)), "l"(gmem),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void CpAsyncWaitAll() { CpAsyncWait<0>(); }

// Four 8x8 b16 matrices; lanes 8 i .. 8 i + 7 give the row addresses of matrix i.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const __nv_bfloat16* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(smem)));
}

// The same, each matrix transposed on the way (lane 4 g + t gets column g, rows 2t, 2t + 1).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const __nv_bfloat16* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(smem)));
}

// c (16, 8) += a (16, 16) . b (16, 8).
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

}  // namespace moe::cuda
