// Hopper (sm_90a) building blocks shared by the wgmma kernels (grouped_gemm_sm90.cuh,
// attention_sm90.cu): PTX wrappers for mbarriers (also a cluster peer's), TMA
// (cp.async.bulk.tensor, also multicast to a cluster, with L2 eviction policies) and plain bulk
// copies (cp.async.bulk), cluster ids and barrier, wgmma issue and waits, setmaxnreg and named
// barriers, 16-byte shared-memory accesses; shared-memory matrix descriptors for 128-byte-swizzled
// operands; the stage/phase walk of an mbarrier ring; and the host's tensor-map encoding.
// Self-contained (CUDA headers only), so the kernels' probes build with one nvcc command.
//
// Facts these rely on are written where they are used: grouped_gemm/grouped_gemm_sm90.cuh's file
// comment has the swizzle, descriptor and mbarrier-phase rules.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

// wgmma and setmaxnreg exist only on sm_90a. nvcc -arch=sm_90a also embeds generic compute_90
// PTX; in that pass (and for any other GPU) the kernels are built as a trap.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_SM90A_KERNELS 1
#else
#define MOE_SM90A_KERNELS 0
#endif

namespace moe::cuda::sm90 {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarrierInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes the initialised barriers visible to the async proxy (TMA) and to the other threads
// (with the __syncthreads that follows).
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void MbarrierArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// One arrival on the mbarrier at shared offset `bar` of the cluster's CTA `rank` (this CTA's
// own included).
__device__ __forceinline__ void MbarrierArriveInCta(uint32_t bar, int rank) {
  asm volatile(
      "{ .reg .b32 remote; mapa.shared::cluster.u32 remote, %0, %1;"
      " mbarrier.arrive.shared::cluster.b64 _, [remote]; }" ::"r"(bar),
      "r"(rank)
      : "memory");
}

// This CTA's rank in its cluster, the cluster's index in the grid and the number of clusters
// (1-D grids).
__device__ __forceinline__ int ClusterRank() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(v));
  return static_cast<int>(v);
}
__device__ __forceinline__ int ClusterIndex() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(v));
  return static_cast<int>(v);
}
__device__ __forceinline__ int ClusterCount() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(v));
  return static_cast<int>(v);
}

// Every thread of every CTA of the cluster (release what it wrote, acquire the others').
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

// One arrival that also expects `bytes` of asynchronous (TMA) writes before the phase completes.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Returns once the phase of parity `parity` has completed (acquire: what the arrivals released,
// including the TMA bytes, is visible afterwards).
__device__ __forceinline__ void MbarrierWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

__device__ __forceinline__ uint64_t MapAddress(const CUtensorMap& map) {
  return reinterpret_cast<uint64_t>(&map);
}

__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap& map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(MapAddress(map)) : "memory");
}

// L2 eviction priorities for the lines a TMA access touches (createpolicy, fraction 1), passed as
// its .L2::cache_hint operand: evict_first for data read or written once (a GEMM's output), so
// that it does not push out operands that other tiles read again (evict_last).
__device__ __forceinline__ uint64_t L2EvictFirst() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t L2EvictNormal() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t L2EvictLast() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// TMA: the box at coordinates (c0 innermost, c1[, c2]) of `map` into shared `dst` with L2 policy
// `policy`; its bytes complete_tx on `bar`.
__device__ __forceinline__ void TmaLoad2d(const CUtensorMap& map, uint32_t dst, uint32_t bar,
                                          int c0, int c1, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(dst),
      "l"(MapAddress(map)), "r"(bar), "r"(c0), "r"(c1), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void TmaLoad3d(const CUtensorMap& map, uint32_t dst, uint32_t bar,
                                          int c0, int c1, int c2, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(dst),
      "l"(MapAddress(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "l"(policy)
      : "memory");
}

// Without a policy (attention's 4-D boxes).
__device__ __forceinline__ void TmaLoad4d(const CUtensorMap& map, uint32_t dst, uint32_t bar,
                                          int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(dst),
      "l"(MapAddress(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// TMA multicast (thread-block clusters): the box lands at shared offset `dst` in every CTA of
// the cluster whose bit is set in `cta_mask`, and its bytes complete_tx on the mbarrier at offset
// `bar` in each of them; L2 policy `policy`.
__device__ __forceinline__ void TmaLoad2dMulticast(const CUtensorMap& map, uint32_t dst,
                                                   uint32_t bar, uint16_t cta_mask, int c0, int c1,
                                                   uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster.L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5, %6;" ::"r"(dst),
      "l"(MapAddress(map)), "r"(bar), "r"(c0), "r"(c1), "h"(cta_mask), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void TmaLoad3dMulticast(const CUtensorMap& map, uint32_t dst,
                                                   uint32_t bar, uint16_t cta_mask, int c0, int c1,
                                                   int c2, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".multicast::cluster.L2::cache_hint [%0], [%1, {%3, %4, %5}], [%2], %6, %7;" ::"r"(dst),
      "l"(MapAddress(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask), "l"(policy)
      : "memory");
}

// Bulk copy (no tensor map): `bytes` (a multiple of 16) from global `src` to shared `dst`, both
// 16-byte aligned; the bytes complete_tx on `bar`.
__device__ __forceinline__ void BulkLoad(uint32_t dst, const void* src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// TMA: global box (c0, c1, c2, c3) of `map` = shared `src` (elements outside the tensor are not
// written); joins the thread's current bulk group.
__device__ __forceinline__ void TmaStore4d(const CUtensorMap& map, uint32_t src, int c0, int c1,
                                           int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::
          "l"(MapAddress(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// TMA: global box (c0, c1, c2) of `map` = shared `src`, or += (element-wise, in L2) when
// `reduce_add`, with L2 policy `policy`; joins the thread's current bulk group.
__device__ __forceinline__ void TmaWrite3d(bool reduce_add, const CUtensorMap& map, uint32_t src,
                                           int c0, int c1, int c2, uint64_t policy) {
#define MOE_TMA_WRITE_3D(instruction)                                                              \
  asm volatile(instruction ".L2::cache_hint [%0, {%2, %3, %4}], [%1], %5;" ::"l"(MapAddress(map)), \
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "l"(policy)                                    \
               : "memory")
  if (reduce_add) {
    MOE_TMA_WRITE_3D("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group");
  } else {
    MOE_TMA_WRITE_3D("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group");
  }
#undef MOE_TMA_WRITE_3D
}

__device__ __forceinline__ void BulkCommitGroup() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most kPending of this thread's bulk groups still read their shared source.
template <int kPending>
__device__ __forceinline__ void BulkWaitGroupRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

// Waits until all of this thread's bulk groups have completed.
__device__ __forceinline__ void BulkWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy accesses
// (wgmma operand reads, TMA stores) that are synchronised after it.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The 16 bytes at shared address `address` (16-byte aligned), read or written. Through 32-bit
// shared addresses, which take half the registers of generic pointers.
__device__ __forceinline__ uint4 LoadShared16(uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
  return v;
}
__device__ __forceinline__ void StoreShared16(uint32_t address, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// Asks for the 128-byte line holding `p` (global memory) to be brought into L2; no wait.
__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// flag = value, after (release) every memory access this thread made before, at GPU scope.
__device__ __forceinline__ void StoreRelease(int* flag, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

// Waits until *flag != 0, its later memory accesses ordered after (acquire) at GPU scope, then sets
// it back to 0 for the next kernel that raises it (nothing after this wait reads it again).
__device__ __forceinline__ void TakeFlagAcquire(int* flag) {
  int value = 0;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
    if (value != 0) break;
    __nanosleep(128);
  }
  asm volatile("st.relaxed.gpu.global.b32 [%0], 0;" ::"l"(flag) : "memory");
}

__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <int kRegisters>
__device__ __forceinline__ void IncreaseMaxRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void DecreaseMaxRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

__device__ __forceinline__ void WgmmaCommitGroup() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most kPending of the warpgroup's committed wgmma groups are in flight.
template <int kPending>
__device__ __forceinline__ void WgmmaWaitGroup() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// v as lane 0 has it. Values that steer wgmma issue must be provably warp-uniform: ptxas
// serialises wgmmas that sit behind branches it cannot prove uniform (warning C7518).
__device__ __forceinline__ int WarpUniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

// Pins every C++ access to wgmma accumulator registers between wgmma.wait_group and the next
// wgmma.fence: the compiler does not know that wgmma writes them asynchronously.
template <int N>
__device__ __forceinline__ void FenceAccumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---------------------------------------------------------------- wgmma

// m64nNk16, f32 accumulators, bf16 operands: d (64 x N) = a (64 x 16) . b (16 x N), + d when
// `accumulate`; N is implied by the accumulator array (N / 2 floats a thread). Register
// 4 i + 2 h + j of warp w, lane 4 g + t, holds row 16 w + g + 8 h, column 8 i + 2 t + j (CUTLASS
// CLayout_64xN). b (and a, in WgmmaSS) are shared-memory descriptors; kTransposeA/B: 0 K-major,
// 1 MN-major. WgmmaRS takes a from registers: per warp the m16n8k16 A fragment of its 16 rows
// (a[0]: row g, columns 2 t and 2 t + 1; a[1]: row g + 8; a[2], a[3]: the same 8 columns on),
// which is what two adjacent 8-column blocks of accumulators become packed to bf16.
#define MOE_WGMMA_ACC8(i)                                                                     \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define MOE_WGMMA_ACC32(i) \
  MOE_WGMMA_ACC8(i), MOE_WGMMA_ACC8(i + 8), MOE_WGMMA_ACC8(i + 16), MOE_WGMMA_ACC8(i + 24)
#define MOE_WGMMA_ACC64(i) MOE_WGMMA_ACC32(i), MOE_WGMMA_ACC32(i + 32)
#define MOE_WGMMA_ACC128(i) MOE_WGMMA_ACC64(i), MOE_WGMMA_ACC64(i + 64)

template <int kTransposeA, int kTransposeB>
__device__ __forceinline__ void WgmmaSS(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, %35, %36;\n}\n"
      : MOE_WGMMA_ACC32(0)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransposeA), "n"(kTransposeB));
}

template <int kTransposeA, int kTransposeB>
__device__ __forceinline__ void WgmmaSS(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, "
      "%64, %65, p, 1, 1, %67, %68;\n}\n"
      : MOE_WGMMA_ACC64(0)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransposeA), "n"(kTransposeB));
}

template <int kTransposeA, int kTransposeB>
__device__ __forceinline__ void WgmmaSS(float (&d)[128], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "
      "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, "
      "%99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, "
      "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, %131, %132;\n}\n"
      : MOE_WGMMA_ACC128(0)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransposeA), "n"(kTransposeB));
}

template <int kTransposeB>
__device__ __forceinline__ void WgmmaRS(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                        bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : MOE_WGMMA_ACC32(0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),
        "n"(kTransposeB));
}

template <int kTransposeB>
__device__ __forceinline__ void WgmmaRS(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                        bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : MOE_WGMMA_ACC64(0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)),
        "n"(kTransposeB));
}

// m64n128k32, f32 accumulators, e4m3 operands (both K-major: FP8 wgmma has no transpose): d (64 x
// 128) = a (64 x 32) . b (32 x 128), + d when `accumulate`; the same accumulator layout as the
// bf16 forms above. a and b are shared-memory descriptors.
__device__ __forceinline__ void WgmmaE4m3(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, "
      "%64, %65, p, 1, 1;\n}\n"
      : MOE_WGMMA_ACC64(0)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// m64n192k32: as above with d 64 x 192 (b 32 x 192), 96 accumulators a thread.
__device__ __forceinline__ void WgmmaE4m3(float (&d)[96], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19,"
      "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37,"
      "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55,"
      "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73,"
      "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91,"
      "%92, %93, %94, %95}, "
      "%96, %97, p, 1, 1;\n}\n"
      : MOE_WGMMA_ACC64(0), MOE_WGMMA_ACC32(64)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

#undef MOE_WGMMA_ACC128
#undef MOE_WGMMA_ACC64
#undef MOE_WGMMA_ACC32
#undef MOE_WGMMA_ACC8

// ---------------------------------------------------------------- shared-memory operands

// Descriptor of a 128B-swizzled operand at shared address `start` (1024-byte aligned up to the
// K-slice offsets added to it, which only touch address bits below 7 or at 11 and above).
__device__ __forceinline__ uint64_t SmemDescriptor(uint32_t start, uint32_t leading_bytes,
                                                   uint32_t stride_bytes) {
  return static_cast<uint64_t>((start & 0x3FFFF) >> 4) |
         static_cast<uint64_t>(leading_bytes >> 4) << 16 |
         static_cast<uint64_t>(stride_bytes >> 4) << 32 | uint64_t{1} << 62;
}

// `descriptor`'s operand `bytes` (a multiple of 16) further on: its start address field is the
// lowest 14 bits (address / 16), which every shared address fits, so the sum stays in the low word.
// One add per wgmma where building each descriptor anew took about nine instructions.
__device__ __forceinline__ uint64_t DescriptorAdvance(uint64_t descriptor, uint32_t bytes) {
  const uint32_t low = static_cast<uint32_t>(descriptor) + (bytes >> 4);
  return (descriptor & 0xFFFFFFFF00000000ull) | low;
}

// Stage and phase of a consumer or producer walking a ring of kStages mbarrier-guarded stages.
template <int kStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;

  __device__ void Advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// ---------------------------------------------------------------- host

inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return PFN_cuTensorMapEncodeTiled_v12000{nullptr};
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encoder;
}

// A 128B-swizzled tiled map of a row-major tensor: dims innermost first (elements), strides of
// dims 1.. in bytes, box in elements (inner box = 128 bytes); zeros outside the tensor.
template <int kRank>
cudaError_t EncodeTensorMap(CUtensorMap* map, CUtensorMapDataType type, const void* base,
                            const uint64_t (&dims)[kRank], const uint64_t (&strides)[kRank - 1],
                            const uint32_t (&box)[kRank]) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  uint32_t element_strides[kRank];
  std::fill_n(element_strides, kRank, 1u);
  const CUresult result =
      encode(map, type, kRank, const_cast<void*>(base), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace moe::cuda::sm90
