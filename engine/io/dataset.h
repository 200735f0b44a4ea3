// Training data: open a token source by --data_format, and cut it into batches.
//
// OpenTokenSource picks the source (token_source.h): synthetic (a seeded Markov chain with an
// exact loss floor, synthetic_dataset.h; needs no file), megatron (a Megatron-LM .bin/.idx
// indexed dataset, megatron_dataset.h), flat_u16 / flat_u32 (a flat token file,
// flat_dataset.h). Anything a user can get wrong comes back as a one-line Status.
//
// BatchSampler draws batches of windows of seq_length + 1 tokens, as int32 host buffers
// (batch, seq_length + 1), row-major: inputs are columns [0, seq_length), targets columns
// [1, seq_length + 1). Which window a sample reads is a pure function of the seed and the
// sample's index, so there is no hidden generator state:
// - Train: with W train windows, sample s reads window perm_e(s mod W) of epoch e = s / W, where
//   perm_e is a pseudorandom permutation keyed by (seed, e): every window once per epoch, a new
//   order each epoch. NextTrainBatch reads samples [consumed, consumed + batch) and advances.
//   The sampler's whole state is consumed_train_samples, a plain integer: a checkpoint stores
//   it, and restoring it into a sampler over the same source, seq_length and seed reproduces the
//   following batches exactly (the batch size may even change across the resume).
// - Validation: batch k holds samples [k * batch, (k + 1) * batch) of the validation split
//   (same rule, its own key). It has no state: every evaluation that reads batches 0, 1, ...
//   sees the same tokens.
// The source must outlive the sampler. The sampler only reads it, so several samplers (e.g. one
// per thread) may share one source.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/io/synthetic_dataset.h"
#include "engine/io/token_source.h"

namespace moe {

struct DataOptions {
  std::string format = "synthetic";  // synthetic | megatron | flat_u16 | flat_u32
  std::string path;                  // flat: the file; megatron: the prefix of .bin and .idx
  int64_t vocab_size = 0;            // every token id must be below it
  double validation_fraction = 0.1;  // files: the tail of the token stream held out
  SyntheticOptions synthetic;
};

StatusOr<std::unique_ptr<TokenSource>> OpenTokenSource(const DataOptions& options);

// The files OpenTokenSource reads for `options`: none for synthetic data, the token file for the
// flat formats, PREFIX.idx and PREFIX.bin for megatron (whether they exist or not).
std::vector<std::string> DataSourceFiles(const DataOptions& options);

class BatchSampler {
 public:
  // Errors when seq_length or batch_size is not positive, or a split cannot hold one window.
  static StatusOr<BatchSampler> Create(const TokenSource* source, int64_t seq_length,
                                       int64_t batch_size, uint64_t seed);

  int64_t seq_length() const { return seq_length_; }
  int64_t batch_size() const { return batch_size_; }
  int64_t window_length() const { return seq_length_ + 1; }
  int64_t num_windows(Split split) const { return num_windows_[static_cast<int>(split)]; }

  // out: (batch_size, seq_length + 1). The next training batch; advances the position.
  void NextTrainBatch(std::span<int32_t> out);
  // out: (batch_size, seq_length + 1). Validation batch `index` >= 0, the same on every call.
  void ValidationBatch(int64_t index, std::span<int32_t> out) const;
  // out: (rows, seq_length + 1). Samples [first_sample, first_sample + rows) of `split`: what
  // the two calls above read, for callers that slice batches themselves (e.g. one data-parallel
  // rank's rows of a global batch).
  void ReadSamples(Split split, int64_t first_sample, std::span<int32_t> out) const;
  // Advances the training position past `samples` (>= 0) that the caller read with ReadSamples.
  void SkipTrainSamples(int64_t samples);

  // The position, for checkpoints: training samples drawn so far.
  int64_t consumed_train_samples() const { return consumed_train_samples_; }
  Status RestoreConsumedTrainSamples(int64_t consumed);

 private:
  BatchSampler(const TokenSource* source, int64_t seq_length, int64_t batch_size, uint64_t seed,
               int64_t train_windows, int64_t validation_windows);
  int64_t WindowOfSample(Split split, int64_t sample) const;

  const TokenSource* source_;
  int64_t seq_length_;
  int64_t batch_size_;
  uint64_t seed_;
  int64_t num_windows_[2];  // by Split
  int64_t consumed_train_samples_ = 0;
};

}  // namespace moe
