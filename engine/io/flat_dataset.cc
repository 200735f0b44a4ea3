#include "engine/io/flat_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <sstream>

#include <glog/logging.h>

namespace moe {
namespace {

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

// Shorter flat_u16 files are not checked for being uint32 files (OpenFlatDataset).
constexpr int64_t kMinTokensForWidthCheck = 64;

// Calls f(const T* tokens) with the file's tokens as their C++ type.
template <typename F>
auto VisitTokens(TokenType type, const std::byte* data, F&& f) {
  switch (type) {
    case TokenType::kUint16:
      return f(reinterpret_cast<const uint16_t*>(data));
    case TokenType::kUint32:
      return f(reinterpret_cast<const uint32_t*>(data));
    case TokenType::kInt32:
      return f(reinterpret_cast<const int32_t*>(data));
  }
  LOG(FATAL) << "unknown token type";
}

}  // namespace

Status DataPathError(StatusCode code, const std::string& file, const std::string& what) {
  return Status(code, "--data_path " + file + ": " + what);
}

StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return DataPathError(StatusCode::kNotFound, path, "no such file");
    return DataPathError(StatusCode::kInvalidArgument, path,
                         std::string("cannot open: ") + std::strerror(error));
  }
  struct stat info;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return DataPathError(StatusCode::kInvalidArgument, path, "not a regular file");
  }
  const size_t size = static_cast<size_t>(info.st_size);
  void* data = nullptr;
  if (size > 0) {
    data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return DataPathError(StatusCode::kInvalidArgument, path,
                           std::string("cannot map: ") + std::strerror(error));
    }
  }
  ::close(fd);  // the mapping keeps the file
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const std::byte*>(data), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

int64_t TokenBytes(TokenType type) { return type == TokenType::kUint16 ? 2 : 4; }

const char* TokenTypeName(TokenType type) {
  switch (type) {
    case TokenType::kUint16:
      return "uint16";
    case TokenType::kUint32:
      return "uint32";
    case TokenType::kInt32:
      return "int32";
  }
  LOG(FATAL) << "unknown token type";
}

FlatTokenSource::FlatTokenSource(std::unique_ptr<MappedFile> file, TokenType type,
                                 int64_t vocab_size, int64_t num_train, std::string description)
    : file_(std::move(file)),
      type_(type),
      vocab_size_(vocab_size),
      num_tokens_(static_cast<int64_t>(file_->bytes().size()) / TokenBytes(type)),
      num_train_(num_train),
      description_(std::move(description)) {}

StatusOr<std::unique_ptr<FlatTokenSource>> FlatTokenSource::Create(std::unique_ptr<MappedFile> file,
                                                                   TokenType type,
                                                                   int64_t vocab_size,
                                                                   double validation_fraction,
                                                                   std::string description) {
  CHECK(validation_fraction > 0 && validation_fraction < 1) << validation_fraction;
  const int64_t bytes = static_cast<int64_t>(file->bytes().size());
  const int64_t token_bytes = TokenBytes(type);
  if (bytes % token_bytes != 0) {
    return DataPathError(StatusCode::kDataLoss, file->path(),
                         std::to_string(bytes) + " bytes is not a whole number of " +
                             std::to_string(token_bytes) + "-byte " + TokenTypeName(type) +
                             " tokens (truncated?)");
  }
  const int64_t num_tokens = bytes / token_bytes;
  const int64_t bad = VisitTokens(type, file->bytes().data(), [&](const auto* tokens) {
    for (int64_t i = 0; i < num_tokens; ++i) {
      const int64_t id = tokens[i];
      if (id < 0 || id >= vocab_size) return i;
    }
    return int64_t{-1};
  });
  if (bad >= 0) {
    const int64_t id = VisitTokens(type, file->bytes().data(),
                                   [&](const auto* tokens) { return int64_t{tokens[bad]}; });
    // Two uint16 tokens read as one uint32 are >= 65536 unless the second is 0.
    const std::string hint = type == TokenType::kUint32 && id >= 65536 && vocab_size <= 65536
                                 ? " (a file of uint16 tokens? that is --data_format=flat_u16)"
                                 : "";
    return DataPathError(StatusCode::kInvalidArgument, file->path(),
                         "token id " + std::to_string(id) + " at position " + std::to_string(bad) +
                             " is outside [0, --vocab_size " + std::to_string(vocab_size) + ")" +
                             hint);
  }
  const auto num_validation =
      static_cast<int64_t>(static_cast<double>(num_tokens) * validation_fraction);
  return std::unique_ptr<FlatTokenSource>(new FlatTokenSource(
      std::move(file), type, vocab_size, num_tokens - num_validation, std::move(description)));
}

StatusOr<int64_t> FlatTokenSource::NumWindows(Split split, int64_t window_length) const {
  CHECK_GE(window_length, 2);
  const int64_t tokens = split_end(split) - split_begin(split);
  if (tokens < window_length) {
    return DataPathError(StatusCode::kInvalidArgument, file_->path(),
                         std::string("the ") + SplitName(split) + " split holds " +
                             std::to_string(tokens) + " of the file's " +
                             std::to_string(num_tokens_) +
                             " tokens, fewer than one window of --seq_length + 1 = " +
                             std::to_string(window_length) + " tokens");
  }
  return (tokens - 1) / (window_length - 1);
}

void FlatTokenSource::ReadWindow(Split split, int64_t index, std::span<int32_t> out) const {
  const auto length = static_cast<int64_t>(out.size());
  CHECK_GE(length, 2);
  const int64_t begin = split_begin(split) + index * (length - 1);
  CHECK(index >= 0 && begin + length <= split_end(split))
      << SplitName(split) << " window " << index << " of length " << length;
  VisitTokens(type_, file_->bytes().data(), [&](const auto* tokens) {
    for (int64_t t = 0; t < length; ++t) out[t] = static_cast<int32_t>(tokens[begin + t]);
  });
}

std::string FlatTokenSource::Describe() const {
  std::ostringstream out;
  out << description_ << ": " << num_tokens_ << " " << TokenTypeName(type_) << " tokens ("
      << num_train_ << " train, " << num_tokens_ - num_train_ << " validation), vocab "
      << vocab_size_;
  return out.str();
}

StatusOr<std::unique_ptr<TokenSource>> OpenFlatDataset(const std::string& path, TokenType type,
                                                       int64_t vocab_size,
                                                       double validation_fraction) {
  CHECK(type == TokenType::kUint16 || type == TokenType::kUint32);
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  const std::string description =
      std::string(type == TokenType::kUint16 ? "flat_u16 " : "flat_u32 ") + path;
  // uint32 tokens below 65536 read as uint16: every second token (the high halves) is 0, which a
  // real uint16 stream of this length never is. Checked where the flag chose the type.
  if (type == TokenType::kUint16) {
    const auto* tokens = reinterpret_cast<const uint16_t*>(file->bytes().data());
    const int64_t count = static_cast<int64_t>(file->bytes().size()) / 2;
    bool high_halves_zero = count >= kMinTokensForWidthCheck && count % 2 == 0;
    bool low_halves_zero = true;
    for (int64_t i = 0; high_halves_zero && i < count; i += 2) {
      high_halves_zero = tokens[i + 1] == 0;
      low_halves_zero = low_halves_zero && tokens[i] == 0;
    }
    if (high_halves_zero && !low_halves_zero) {
      return DataPathError(StatusCode::kInvalidArgument, path,
                           "every second uint16 token is 0, as in a file of uint32 tokens: that "
                           "is --data_format=flat_u32");
    }
  }
  MOE_ASSIGN_OR_RETURN(
      std::unique_ptr<FlatTokenSource> source,
      FlatTokenSource::Create(std::move(file), type, vocab_size, validation_fraction, description));
  return std::unique_ptr<TokenSource>(std::move(source));
}

}  // namespace moe
