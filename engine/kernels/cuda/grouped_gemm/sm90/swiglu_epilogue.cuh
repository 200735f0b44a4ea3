// The SwiGLU epilogues of the Hopper grouped GEMMs (design: ../grouped_gemm_sm90.cuh): the
// producer warpgroup's idle warps 1-3 take each consumer's staged result and compute SwiGLU from
// fc1's y, or SwiGLU's gradients dh and dscale's partials from fc2's data gradient (summed by
// swiglu_math.cuh's SumDscalePartials); and the register split each epilogue needs.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "engine/kernels/cuda/common/sm90_ptx.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/config.cuh"
#include "engine/kernels/cuda/grouped_gemm/sm90/epilogue.cuh"
#include "engine/kernels/cuda/layers/swiglu_math.cuh"

namespace moe::cuda::sm90::detail {

// What the forward kernel does with each consumer's result (see GroupedMatmulKernel): store it
// (y), or also hand it, staged as bf16, to the producer warpgroup's idle warps 1-3, which compute
// SwiGLU from it (fc1) or the SwiGLU gradient (fc2's data gradient) while the consumers go on
// with the next tile.
enum class Epilogue { kStore, kSwiglu, kSwigluBackward };
constexpr int kActivationWarps = 3;
constexpr int kActivationThreads = kActivationWarps * 32;

// The SwiGLU epilogues' operands (see the launchers): scale (rows) f32 or nullptr for 1; kSwiglu
// writes act (rows, f); kSwigluBackward reads h (rows, 2 f) and writes dh (rows, 2 f) and, unless
// nullptr, dscale_partials (column tiles, rows).
struct SwigluOperands {
  const float* scale;
  bf16* act;
  const bf16* h;
  bf16* dh;
  float* dscale_partials;
};

// The producer warpgroup's registers per epilogue, and the consumers' beside them: at 48,
// kSwiglu's activation warps spilled; kSwigluBackward's need room for kGradientRowsInFlight rows
// (at 104, ptxas still spills 16 bytes; 2 rows fit in 88 without).
__host__ __device__ constexpr int ProducerRegisters(Epilogue epilogue) {
  return epilogue == Epilogue::kStore ? kProducerRegisters
                                      : (epilogue == Epilogue::kSwiglu ? 56 : 104);
}
__host__ __device__ constexpr int ConsumerRegisters(Epilogue epilogue) {
  return epilogue == Epilogue::kStore ? kConsumerRegisters
                                      : (epilogue == Epilogue::kSwiglu ? 224 : 200);
}
constexpr bool RegistersFit(Epilogue epilogue) {
  return ProducerRegisters(epilogue) * kWarpgroupThreads +
             ConsumerRegisters(epilogue) * kWarpgroupThreads * kConsumers <=
         kLaunchRegisters * kThreads;
}
static_assert(RegistersFit(Epilogue::kSwiglu) && RegistersFit(Epilogue::kSwigluBackward));

// The hand-over of consumer c's staged tile: staged[c] (each consumer thread arrives once it has
// staged its part) and read[c] (each activation thread arrives once it has read the staging; the
// consumer restages only after that).
struct ActivationBarriers {
  uint32_t base;  // shared address of staged[0]; read follows

  static constexpr int kBytes = 2 * kConsumers * 8;
  __device__ uint32_t Staged(int consumer) const { return base + 8 * consumer; }
  __device__ uint32_t Read(int consumer) const { return base + 8 * (kConsumers + consumer); }
  __device__ void Init() const {
    for (int c = 0; c < kConsumers; ++c) {
      MbarrierInit(Staged(c), kWarpgroupThreads);
      MbarrierInit(Read(c), kActivationThreads);
    }
  }
};

// act[first_row + r][gate + c] = silu(g) * up * scale[first_row + r] for r < valid_rows and gate
// + c < f, c < kBlockN / 2, from a staged y tile whose tile columns [0, kBlockN / 2) are gate
// columns and [kBlockN / 2, kBlockN) their up columns (bf16, as y holds them: bit-identical to the
// SwiGLU kernel on y); `thread` of kActivationThreads, in 16-byte pieces.
__device__ __forceinline__ void WriteActivation(const uint8_t* staging, int thread,
                                                const float* scale, bf16* act, int f, int first_row,
                                                int valid_rows, int gate) {
  constexpr int kPiecesPerRow = kBlockN / 2 / 8;
  constexpr int kUpOffset = kBlockN / 2 * 64 * static_cast<int>(sizeof(bf16));
  for (int piece = thread; piece < valid_rows * kPiecesPerRow; piece += kActivationThreads) {
    const int r = piece / kPiecesPerRow, c = piece % kPiecesPerRow;
    const int column = gate + 8 * c;
    if (column >= f) continue;  // f is a multiple of 8: a piece lies wholly inside or outside
    const int offset = StagedPieceOffset(r, c);
    const uint4 gate_piece = *reinterpret_cast<const uint4*>(staging + offset);
    const uint4 up_piece = *reinterpret_cast<const uint4*>(staging + kUpOffset + offset);
    const float s = scale != nullptr ? scale[first_row + r] : 1.0f;
    const bf16* g = reinterpret_cast<const bf16*>(&gate_piece);
    const bf16* u = reinterpret_cast<const bf16*>(&up_piece);
    uint4 out_piece;
    bf16* out = reinterpret_cast<bf16*>(&out_piece);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      out[j] = __float2bfloat16(SwigluValue(__bfloat162float(g[j]), __bfloat162float(u[j]), s));
    }
    *reinterpret_cast<uint4*>(act + static_cast<int64_t>(first_row + r) * f + column) = out_piece;
  }
}

// The sum over a warp's lanes (the same order in every lane).
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int lane_mask = 16; lane_mask > 0; lane_mask /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, lane_mask);
  }
  return v;
}

// Rows each activation warp has in flight in WriteSwigluGradients: their loads are issued
// together, so their latencies overlap (with fewer, the fused kernel was slower).
constexpr int kGradientRowsInFlight = 4;

// The SwiGLU gradient from a staged da tile (bf16, as a stored da would hold it: dh bit-identical
// to the SwiGLU backward kernel on it): for r < valid_rows and column + c < f, c < kBlockN, with
// row = first_row + r, gate g = h[row][column + c], up u = h[row][f + column + c] and d the staged
// da, dh[row][column + c] = dgate, dh[row][f + column + c] = dup (SwigluGradients), and
// dscale_partials[column / kBlockN][row] = the row's sum of their products (warp sum of each lane's
// 8 in order). Warp `warp` of kActivationWarps takes every third row, kGradientRowsInFlight at a
// time; lane l the 8 columns from 8 l, in 16-byte pieces.
__device__ __forceinline__ void WriteSwigluGradients(const uint8_t* staging, int warp,
                                                     const SwigluOperands& operands, int rows,
                                                     int f, int first_row, int valid_rows,
                                                     int column) {
  constexpr int kStep = kActivationWarps * kGradientRowsInFlight;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int c = column + 8 * lane;
  const bool inside = c < f;  // f is a multiple of 8: a piece lies wholly inside or outside
  const bf16* __restrict__ h = operands.h;
  bf16* __restrict__ dh = operands.dh;
  for (int first = warp; first < valid_rows; first += kStep) {
    uint4 gate_piece[kGradientRowsInFlight], up_piece[kGradientRowsInFlight];
    float s[kGradientRowsInFlight];
#pragma unroll
    for (int i = 0; i < kGradientRowsInFlight; ++i) {
      const int r = first + kActivationWarps * i;
      if (r >= valid_rows || !inside) continue;
      const int64_t gate_at = (first_row + r) * int64_t{2} * f + c;
      gate_piece[i] = *reinterpret_cast<const uint4*>(h + gate_at);
      up_piece[i] = *reinterpret_cast<const uint4*>(h + gate_at + f);
      s[i] = operands.scale != nullptr ? operands.scale[first_row + r] : 1.0f;
    }
#pragma unroll
    for (int i = 0; i < kGradientRowsInFlight; ++i) {
      const int r = first + kActivationWarps * i;
      if (r >= valid_rows) break;  // warp-uniform
      const int64_t row = first_row + r;
      float product = 0.0f;
      if (inside) {
        const uint4 d_piece = *reinterpret_cast<const uint4*>(staging + StagedPieceOffset(r, lane));
        const bf16* d = reinterpret_cast<const bf16*>(&d_piece);
        const bf16* g = reinterpret_cast<const bf16*>(&gate_piece[i]);
        const bf16* u = reinterpret_cast<const bf16*>(&up_piece[i]);
        uint4 dgate_piece, dup_piece;
        bf16* dgate = reinterpret_cast<bf16*>(&dgate_piece);
        bf16* dup = reinterpret_cast<bf16*>(&dup_piece);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const SwigluGradient gradient = SwigluGradients(
              __bfloat162float(g[j]), __bfloat162float(u[j]), s[i], __bfloat162float(d[j]));
          dgate[j] = __float2bfloat16(gradient.gate);
          dup[j] = __float2bfloat16(gradient.up);
          product += gradient.product;
        }
        const int64_t gate_at = row * 2 * f + c;
        *reinterpret_cast<uint4*>(dh + gate_at) = dgate_piece;
        *reinterpret_cast<uint4*>(dh + gate_at + f) = dup_piece;
      }
      if (operands.dscale_partials != nullptr) {
        product = WarpSum(product);
        if (lane == 0) {
          operands.dscale_partials[static_cast<int64_t>(column / kBlockN) * rows + row] = product;
        }
      }
    }
  }
}

// Brings into L2 the gate and up values WriteSwigluGradients will read for rows [first_row,
// first_row + valid_rows) and columns [column, column + kBlockN) of h (rows, 2 f); `thread` of
// kActivationThreads.
__device__ __forceinline__ void PrefetchGateUp(const bf16* h, int f, int first_row, int valid_rows,
                                               int column, int thread) {
  constexpr int kLine = 128;
  const int bytes = (min(column + kBlockN, f) - column) * static_cast<int>(sizeof(bf16));
  if (bytes <= 0) return;
  for (int span = thread; span < 2 * valid_rows; span += kActivationThreads) {
    const int64_t row = first_row + span / 2;
    const char* first = reinterpret_cast<const char*>(h + row * 2 * f + span % 2 * f + column);
    const uintptr_t begin = reinterpret_cast<uintptr_t>(first) / kLine * kLine;
    for (uintptr_t line = begin; line < reinterpret_cast<uintptr_t>(first) + bytes; line += kLine) {
      PrefetchL2(reinterpret_cast<const void*>(line));
    }
  }
}

}  // namespace moe::cuda::sm90::detail
