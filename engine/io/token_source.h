// TokenSource: training data as a stream of token ids in [0, vocab_size), split into a train and
// a validation part that share no tokens, and read as fixed windows: window i of a split, for a
// given window length, is always the same tokens. How a source lays its windows out is its own
// business (files: consecutive windows overlapping by one token; synthetic: independent seeded
// sequences). BatchSampler (dataset.h) decides which windows a batch reads.
//
// Implementations: SyntheticTokenSource (synthetic_dataset.h), FlatTokenSource (flat_dataset.h,
// also behind Megatron indexed datasets, megatron_dataset.h). Read-only after creation: safe to
// read from several threads.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "engine/core/status.h"

namespace moe {

enum class Split { kTrain, kValidation };

inline const char* SplitName(Split split) {
  return split == Split::kTrain ? "train" : "validation";
}

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  virtual int64_t vocab_size() const = 0;
  // How many windows of `window_length` (>= 2) tokens `split` holds; an error naming the data
  // when it cannot hold one.
  virtual StatusOr<int64_t> NumWindows(Split split, int64_t window_length) const = 0;
  // Writes window `index` (< NumWindows) of `split`; its length is out.size().
  virtual void ReadWindow(Split split, int64_t index, std::span<int32_t> out) const = 0;
  // The exact lowest expected cross-entropy (nats per target) any model can reach on windows of
  // seq_length + 1 tokens (inputs the first seq_length, targets shifted by one), where the
  // source knows it: synthetic data does, files do not.
  virtual std::optional<double> CrossEntropyFloor(int64_t /*seq_length*/) const {
    return std::nullopt;
  }
  // One line for the log: what the data is and how big.
  virtual std::string Describe() const = 0;
};

}  // namespace moe
