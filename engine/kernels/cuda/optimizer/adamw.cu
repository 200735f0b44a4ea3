// CUDA AdamW step over many parameters (contract: engine/kernels/op_declarations.inc), in place on
// f32 master weights and the moments m, v from grad (grad, m and v each f32 or bf16: arithmetic in
// f32, bf16 stored rounded to nearest even); the CPU reference's formula and operation order:
//   g = grad_scale * grad; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   master -= lr * (wd * master + m * m_corr / (sqrt(v * v_corr) + eps)),
//   m_corr = 1 / (1 - b1^step), v_corr = 1 / (1 - b2^step) (computed in double on the host).
// model (f32 or bf16), when defined, receives the new master values.
//
// Multi-tensor: one launch covers up to kMaxEntries parameters, passed by value as the kernel's
// parameter (a table of pointers). Each entry is cut into tiles of kTile elements; the launch's
// tiles are numbered entry by entry, and blocks walk them grid-stride, so a block's tiles only move
// forward through the table. A thread handles kUnroll 4-element vectors of a tile, loading all of
// them before any arithmetic so that each thread keeps 16 loads in flight (the step is
// memory-bound: 30 bytes per parameter with a bf16 model, f32 grad and f32 moments, 22 with bf16
// moments, 20 with bf16 grad and moments).
// Entries' tensors come from the allocator, 16-byte aligned (checked); an entry's last partial
// vector goes element by element.
#include <cmath>

#include "engine/kernels/cuda/common/cuda_common.cuh"
#include "engine/kernels/cuda/cuda_ops.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;
constexpr int kUnroll = 4;
constexpr int64_t kTile = int64_t{kThreads} * kVec * kUnroll;
constexpr int kMaxEntries = 64;  // 57 bytes each: the table stays under the 4 KiB argument limit

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, grad_scale, m_correction, v_correction;
};

struct EntryTable {
  float* master[kMaxEntries];
  const void* grad[kMaxEntries];  // all of the launch's grad type
  void* m[kMaxEntries];           // all of the launch's m type
  void* v[kMaxEntries];           // all of the launch's v type
  void* model[kMaxEntries];       // all nullptr, or all of the launch's model type
  int64_t n[kMaxEntries];
  int64_t tiles_end[kMaxEntries];  // tiles of entries [0, i], cumulative
  bool weight_decay[kMaxEntries];
  int count;
};

struct Element {
  float w, g, m, v;
};

__device__ __forceinline__ void Update(Element& e, const AdamWStep& p, float weight_decay) {
  const float g = p.grad_scale * e.g;
  e.m = p.beta1 * e.m + (1.0f - p.beta1) * g;
  e.v = p.beta2 * e.v + (1.0f - p.beta2) * g * g;
  const float update = e.m * p.m_correction / (sqrtf(e.v * p.v_correction) + p.eps);
  e.w = e.w - p.lr * (weight_decay * e.w + update);
}

// GT: the gradient's type; MT, VT: the moments'; M: the model copy's.
template <typename GT, typename MT, typename VT, typename M>
__global__ void __launch_bounds__(kThreads) MultiTensorAdamWKernel(EntryTable table, AdamWStep p) {
  const int64_t tiles = table.tiles_end[table.count - 1];
  int entry = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    while (tile >= table.tiles_end[entry]) ++entry;
    const int64_t first_tile = entry == 0 ? 0 : table.tiles_end[entry - 1];
    const int64_t n = table.n[entry];
    float* master = table.master[entry];
    const GT* grad = static_cast<const GT*>(table.grad[entry]);
    MT* m = static_cast<MT*>(table.m[entry]);
    VT* v = static_cast<VT*>(table.v[entry]);
    M* model = static_cast<M*>(table.model[entry]);
    const float weight_decay = table.weight_decay[entry] ? p.weight_decay : 0.0f;
    const int64_t base = (tile - first_tile) * kTile + int64_t{threadIdx.x} * kVec;

    Floats<kVec> w[kUnroll], g[kUnroll], mv[kUnroll], vv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + int64_t{u} * kThreads * kVec;
      if (i + kVec <= n) {
        w[u] = LoadFloats<kVec>(master + i);
        g[u] = LoadFloats<kVec>(grad + i);
        mv[u] = LoadFloats<kVec>(m + i);
        vv[u] = LoadFloats<kVec>(v + i);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + int64_t{u} * kThreads * kVec;
      if (i + kVec <= n) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          Element e = {w[u].v[j], g[u].v[j], mv[u].v[j], vv[u].v[j]};
          Update(e, p, weight_decay);
          w[u].v[j] = e.w;
          mv[u].v[j] = e.m;
          vv[u].v[j] = e.v;
        }
        StoreFloats<kVec>(master + i, w[u]);
        StoreFloats<kVec>(m + i, mv[u]);
        StoreFloats<kVec>(v + i, vv[u]);
        if (model != nullptr) StoreFloats<kVec>(model + i, w[u]);
      } else {
        for (int64_t k = i; k < n; ++k) {  // the entry's last, partial vector
          Element e = {master[k], ToFloat(grad[k]), ToFloat(m[k]), ToFloat(v[k])};
          Update(e, p, weight_decay);
          master[k] = e.w;
          m[k] = FromFloat<MT>(e.m);
          v[k] = FromFloat<VT>(e.v);
          if (model != nullptr) model[k] = FromFloat<M>(e.w);
        }
      }
    }
  }
}

template <typename GT, typename MT, typename VT, typename M>
void Launch(const EntryTable& table, const AdamWStep& p, cudaStream_t stream) {
  const int64_t tiles = table.tiles_end[table.count - 1];
  MultiTensorAdamWKernel<GT, MT, VT, M><<<BlocksFor(tiles, 1), kThreads, 0, stream>>>(table, p);
  MOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void AdamWUpdate(std::span<const AdamWTensors> entries, const AdamWConfig& config) {
  const auto step = static_cast<double>(config.step);
  const AdamWStep p = {
      config.lr,
      config.beta1,
      config.beta2,
      config.eps,
      config.weight_decay,
      config.grad_scale,
      static_cast<float>(1.0 / (1.0 - std::pow(config.beta1, step))),
      static_cast<float>(1.0 / (1.0 - std::pow(config.beta2, step))),
  };
  const cudaStream_t stream = StreamOf(entries.front().master);
  const AdamWTensors& first = entries.front();
  // Without a model copy the kernel stores none; its type is then only a placeholder.
  const DType model_dtype = first.model.defined() ? first.model.dtype() : DType::kF32;
  EntryTable table = {};
  const auto flush = [&] {
    if (table.count == 0) return;
    DispatchFloat(first.grad.dtype(), [&]<typename GT>(TypeTag<GT>) {
      DispatchFloat(first.m.dtype(), [&]<typename MT>(TypeTag<MT>) {
        DispatchFloat(first.v.dtype(), [&]<typename VT>(TypeTag<VT>) {
          DispatchFloat(model_dtype,
                        [&]<typename M>(TypeTag<M>) { Launch<GT, MT, VT, M>(table, p, stream); });
        });
      });
    });
    table = {};
  };
  for (const AdamWTensors& e : entries) {
    const int64_t n = e.master.numel();
    if (n == 0) continue;
    for (const Tensor* t : {&e.master, &e.grad, &e.m, &e.v, &e.model}) {
      CHECK(!t->defined() || Aligned16(t->data())) << "adamw tensor not 16-byte aligned";
    }
    const int i = table.count++;
    table.master[i] = Ptr<float>(e.master);
    table.grad[i] = e.grad.data();
    table.m[i] = e.m.data();
    table.v[i] = e.v.data();
    table.model[i] = e.model.defined() ? e.model.data() : nullptr;
    table.n[i] = n;
    table.tiles_end[i] = (i == 0 ? 0 : table.tiles_end[i - 1]) + (n + kTile - 1) / kTile;
    table.weight_decay[i] = e.weight_decay;
    if (table.count == kMaxEntries) flush();
  }
  flush();
}

}  // namespace moe::cuda
