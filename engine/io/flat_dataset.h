// Token files: a flat array of fixed-size token ids, memory-mapped and split by position.
//
// FlatTokenSource reads a whole file of little-endian uint16, uint32 or int32 token ids: the
// --data_format=flat_u16|flat_u32 file, or the .bin of a Megatron indexed dataset once its index
// has been checked (megatron_dataset.h). The last floor(validation_fraction * tokens) tokens are
// the validation split, the rest the train split. A split of T tokens holds (T - 1) / seq_length
// windows of seq_length + 1 tokens: window i starts at token i * seq_length, so consecutive
// windows share one token (the last target of one is the first input of the next), as in
// Megatron's GPT dataset. No window crosses the split boundary: no token is in both splits.
//
// Opening scans every token once and rejects the first id outside [0, vocab_size), with its
// position (for uint32, an id that two uint16 tokens would make says so). A --data_format file's
// token width is checked where the data allows: a flat_u16 file of at least 64 tokens whose every
// second token is 0 (and not every token) is uint32 tokens read as uint16, and refused. Every
// error reads "--data_path FILE: what is wrong" on one line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "engine/core/status.h"
#include "engine/io/token_source.h"

namespace moe {

// "--data_path FILE: what": the form of every data-file error.
Status DataPathError(StatusCode code, const std::string& file, const std::string& what);

// A whole file mapped read-only.
class MappedFile {
 public:
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  MappedFile(std::string path, const std::byte* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const std::byte* data_;  // null for an empty file
  size_t size_;
};

enum class TokenType { kUint16, kUint32, kInt32 };
int64_t TokenBytes(TokenType type);
const char* TokenTypeName(TokenType type);

class FlatTokenSource final : public TokenSource {
 public:
  // `description` starts the Describe() line (e.g. "flat_u16 /data/tokens.bin").
  static StatusOr<std::unique_ptr<FlatTokenSource>> Create(std::unique_ptr<MappedFile> file,
                                                           TokenType type, int64_t vocab_size,
                                                           double validation_fraction,
                                                           std::string description);

  int64_t vocab_size() const override { return vocab_size_; }
  StatusOr<int64_t> NumWindows(Split split, int64_t window_length) const override;
  void ReadWindow(Split split, int64_t index, std::span<int32_t> out) const override;
  std::string Describe() const override;

  int64_t num_tokens() const { return num_tokens_; }
  // The split's tokens are [split_begin, split_end) of the file.
  int64_t split_begin(Split split) const { return split == Split::kTrain ? 0 : num_train_; }
  int64_t split_end(Split split) const { return split == Split::kTrain ? num_train_ : num_tokens_; }

 private:
  FlatTokenSource(std::unique_ptr<MappedFile> file, TokenType type, int64_t vocab_size,
                  int64_t num_train, std::string description);

  std::unique_ptr<MappedFile> file_;
  TokenType type_;
  int64_t vocab_size_;
  int64_t num_tokens_;
  int64_t num_train_;
  std::string description_;
};

// A --data_format=flat_u16|flat_u32 file (`type` kUint16 or kUint32).
StatusOr<std::unique_ptr<TokenSource>> OpenFlatDataset(const std::string& path, TokenType type,
                                                       int64_t vocab_size,
                                                       double validation_fraction);

}  // namespace moe
