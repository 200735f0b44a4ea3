#include "engine/io/dataset.h"

#include <limits>
#include <sstream>

#include <glog/logging.h>

#include "engine/io/flat_dataset.h"
#include "engine/io/megatron_dataset.h"
#include "engine/io/token_random.h"

namespace moe {

StatusOr<std::unique_ptr<TokenSource>> OpenTokenSource(const DataOptions& options) {
  constexpr int64_t kMaxVocab = std::numeric_limits<int32_t>::max();
  if (options.vocab_size < 2 || options.vocab_size > kMaxVocab) {
    return InvalidArgument("--vocab_size must be in [2, " + std::to_string(kMaxVocab) + "], got " +
                           std::to_string(options.vocab_size));
  }
  if (!(options.validation_fraction > 0 && options.validation_fraction < 1)) {
    std::ostringstream message;
    message << "the validation fraction must be in (0, 1), got " << options.validation_fraction;
    return InvalidArgument(message.str());
  }
  if (options.format == "synthetic") {
    if (!options.path.empty()) {
      return InvalidArgument("--data_path " + options.path +
                             ": --data_format=synthetic reads no file");
    }
    MOE_ASSIGN_OR_RETURN(std::unique_ptr<SyntheticTokenSource> source,
                         SyntheticTokenSource::Create(options.vocab_size, options.synthetic));
    return std::unique_ptr<TokenSource>(std::move(source));
  }
  if (options.format != "megatron" && options.format != "flat_u16" &&
      options.format != "flat_u32") {
    return InvalidArgument("--data_format=" + options.format +
                           " is unknown; expected synthetic, megatron, flat_u16 or flat_u32");
  }
  if (options.path.empty()) {
    return InvalidArgument("--data_format=" + options.format + " needs --data_path");
  }
  if (options.format == "megatron") {
    return OpenMegatronDataset(options.path, options.vocab_size, options.validation_fraction);
  }
  const TokenType type = options.format == "flat_u16" ? TokenType::kUint16 : TokenType::kUint32;
  return OpenFlatDataset(options.path, type, options.vocab_size, options.validation_fraction);
}

std::vector<std::string> DataSourceFiles(const DataOptions& options) {
  if (options.format == "synthetic" || options.path.empty()) return {};
  if (options.format != "megatron") return {options.path};
  const MegatronDatasetFiles files = MegatronFiles(options.path);
  return {files.idx, files.bin};
}

BatchSampler::BatchSampler(const TokenSource* source, int64_t seq_length, int64_t batch_size,
                           uint64_t seed, int64_t train_windows, int64_t validation_windows)
    : source_(source),
      seq_length_(seq_length),
      batch_size_(batch_size),
      seed_(seed),
      num_windows_{train_windows, validation_windows} {}

StatusOr<BatchSampler> BatchSampler::Create(const TokenSource* source, int64_t seq_length,
                                            int64_t batch_size, uint64_t seed) {
  CHECK(source != nullptr);
  if (seq_length < 1) {
    return InvalidArgument("--seq_length must be >= 1, got " + std::to_string(seq_length));
  }
  if (batch_size < 1) {
    return InvalidArgument("the batch size must be >= 1, got " + std::to_string(batch_size));
  }
  MOE_ASSIGN_OR_RETURN(const int64_t train_windows,
                       source->NumWindows(Split::kTrain, seq_length + 1));
  MOE_ASSIGN_OR_RETURN(const int64_t validation_windows,
                       source->NumWindows(Split::kValidation, seq_length + 1));
  return BatchSampler(source, seq_length, batch_size, seed, train_windows, validation_windows);
}

int64_t BatchSampler::WindowOfSample(Split split, int64_t sample) const {
  CHECK_GE(sample, 0);
  const int64_t windows = num_windows(split);
  const int64_t epoch = sample / windows;
  const IndexPermutation permutation(
      windows, StreamKey(seed_, static_cast<uint64_t>(split), static_cast<uint64_t>(epoch)));
  return permutation(sample % windows);
}

void BatchSampler::ReadSamples(Split split, int64_t first_sample, std::span<int32_t> out) const {
  const int64_t length = window_length();
  CHECK_EQ(static_cast<int64_t>(out.size()) % length, 0)
      << out.size() << " tokens is not a whole number of windows of " << length;
  const int64_t rows = static_cast<int64_t>(out.size()) / length;
  for (int64_t row = 0; row < rows; ++row) {
    source_->ReadWindow(split, WindowOfSample(split, first_sample + row),
                        out.subspan(row * length, length));
  }
}

void BatchSampler::NextTrainBatch(std::span<int32_t> out) {
  CHECK_EQ(static_cast<int64_t>(out.size()), batch_size_ * window_length());
  ReadSamples(Split::kTrain, consumed_train_samples_, out);
  consumed_train_samples_ += batch_size_;
}

void BatchSampler::SkipTrainSamples(int64_t samples) {
  CHECK_GE(samples, 0);
  consumed_train_samples_ += samples;
}

void BatchSampler::ValidationBatch(int64_t index, std::span<int32_t> out) const {
  CHECK_GE(index, 0);
  CHECK_EQ(static_cast<int64_t>(out.size()), batch_size_ * window_length());
  ReadSamples(Split::kValidation, index * batch_size_, out);
}

Status BatchSampler::RestoreConsumedTrainSamples(int64_t consumed) {
  if (consumed < 0) {
    return InvalidArgument("consumed_train_samples must be >= 0, got " + std::to_string(consumed));
  }
  consumed_train_samples_ = consumed;
  return Status::Ok();
}

}  // namespace moe
