#include "engine/io/megatron_dataset.h"

#include <cstring>
#include <span>

#include "engine/io/flat_dataset.h"

namespace moe {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;
constexpr const char* kDTypeNames[] = {nullptr, "uint8",   "int8",    "int16", "int32",
                                       "int64", "float64", "float32", "uint16"};

// A little-endian T at byte `offset` (index fields are not aligned).
template <typename T>
T Load(std::span<const std::byte> bytes, int64_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

struct IndexSummary {
  TokenType type;
  int64_t num_sequences;
  int64_t num_documents;
};

// Checks PREFIX.idx field by field and against the length of PREFIX.bin.
StatusOr<IndexSummary> CheckIndex(const MappedFile& idx, const MappedFile& bin) {
  const std::span<const std::byte> bytes = idx.bytes();
  const auto size = static_cast<int64_t>(bytes.size());
  auto error = [&](StatusCode code, const std::string& what) {
    return DataPathError(code, idx.path(), what);
  };
  if (size >= 9 && std::memcmp(bytes.data(), kMagic, 9) != 0) {
    return error(StatusCode::kInvalidArgument,
                 "not a Megatron indexed dataset index (the magic is not MMIDIDX\\0\\0)");
  }
  if (size < kHeaderBytes) {
    return error(StatusCode::kDataLoss, "truncated: " + std::to_string(size) +
                                            " bytes, shorter than the " +
                                            std::to_string(kHeaderBytes) + "-byte header");
  }
  const auto version = Load<uint64_t>(bytes, 9);
  if (version != 1) {
    return error(StatusCode::kInvalidArgument,
                 "unsupported index version " + std::to_string(version) + " (expected 1)");
  }
  const auto code = Load<uint8_t>(bytes, 17);
  if (code < 1 || code > 8) {
    return error(StatusCode::kInvalidArgument,
                 "unknown dtype code " + std::to_string(code) + " (Megatron's codes are 1-8)");
  }
  if (code != 4 && code != 8) {
    return error(StatusCode::kInvalidArgument,
                 std::string("token dtype ") + kDTypeNames[code] + " (code " +
                     std::to_string(code) +
                     ") is not supported; expected uint16 (code 8) or int32 (code 4)");
  }
  const TokenType type = code == 8 ? TokenType::kUint16 : TokenType::kInt32;
  const int64_t token_bytes = TokenBytes(type);

  const auto sequences = Load<uint64_t>(bytes, 18);
  const auto document_entries = Load<uint64_t>(bytes, 26);
  const std::string counts = std::to_string(sequences) + " sequences and " +
                             std::to_string(document_entries) + " document indices";
  if (sequences > static_cast<uint64_t>(size) || document_entries > static_cast<uint64_t>(size)) {
    return error(StatusCode::kDataLoss, std::to_string(size) + " bytes, too short for the " +
                                            counts + " its header declares (truncated or corrupt)");
  }
  const auto s = static_cast<int64_t>(sequences);
  const auto d = static_cast<int64_t>(document_entries);
  const int64_t need = kHeaderBytes + 12 * s + 8 * d;
  if (s > 0 && size == need + s) {
    return error(StatusCode::kInvalidArgument,
                 "has a mode byte per sequence (a multimodal dataset); only token datasets are "
                 "supported");
  }
  if (size != need) {
    return error(StatusCode::kDataLoss, std::to_string(size) + " bytes, but its header's " +
                                            counts + " need " + std::to_string(need) +
                                            " (truncated or corrupt)");
  }

  const int64_t sizes_at = kHeaderBytes;
  const int64_t pointers_at = sizes_at + 4 * s;
  const int64_t documents_at = pointers_at + 8 * s;
  int64_t offset = 0;  // where the next sequence must start in the .bin
  for (int64_t i = 0; i < s; ++i) {
    const auto length = Load<int32_t>(bytes, sizes_at + 4 * i);
    const auto pointer = Load<int64_t>(bytes, pointers_at + 8 * i);
    if (length < 0) {
      return error(StatusCode::kDataLoss, "sequence " + std::to_string(i) + " has negative size " +
                                              std::to_string(length) + " (corrupt)");
    }
    if (pointer != offset) {
      return error(StatusCode::kDataLoss, "sequence " + std::to_string(i) + " starts at byte " +
                                              std::to_string(pointer) +
                                              ", but the sizes before it put it at " +
                                              std::to_string(offset) + " (corrupt)");
    }
    offset += int64_t{length} * token_bytes;
  }
  if (d == 0) return error(StatusCode::kDataLoss, "the document index is empty (corrupt)");
  int64_t previous = 0;
  for (int64_t j = 0; j < d; ++j) {
    const auto entry = Load<int64_t>(bytes, documents_at + 8 * j);
    const bool first_ok = j > 0 || entry == 0;
    const bool last_ok = j < d - 1 || entry == s;
    if (!first_ok || !last_ok || entry < previous || entry > s) {
      return error(StatusCode::kDataLoss,
                   "document index entry " + std::to_string(j) + " is " + std::to_string(entry) +
                       "; expected a non-decreasing list from 0 to the sequence count " +
                       std::to_string(s) + " (corrupt)");
    }
    previous = entry;
  }

  const auto bin_size = static_cast<int64_t>(bin.bytes().size());
  if (bin_size != offset) {
    return DataPathError(StatusCode::kDataLoss, bin.path(),
                         std::to_string(bin_size) + " bytes, but " + idx.path() + " describes " +
                             std::to_string(offset) + " bytes in " + std::to_string(s) +
                             " sequences (truncated, or .bin and .idx of different datasets)");
  }
  return IndexSummary{type, s, d - 1};
}

}  // namespace

MegatronDatasetFiles MegatronFiles(const std::string& prefix) {
  return {prefix + ".idx", prefix + ".bin"};
}

StatusOr<std::unique_ptr<TokenSource>> OpenMegatronDataset(const std::string& prefix,
                                                           int64_t vocab_size,
                                                           double validation_fraction) {
  const MegatronDatasetFiles files = MegatronFiles(prefix);
  StatusOr<std::unique_ptr<MappedFile>> idx = MappedFile::Open(files.idx);
  if (!idx.ok() && idx.status().code() == StatusCode::kNotFound) {
    return NotFound(idx.status().message() +
                    " (for --data_format=megatron, --data_path is the prefix of PREFIX.bin and "
                    "PREFIX.idx)");
  }
  if (!idx.ok()) return idx.status();
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> bin, MappedFile::Open(files.bin));
  MOE_ASSIGN_OR_RETURN(const IndexSummary index, CheckIndex(**idx, *bin));
  const std::string description = "megatron " + prefix + " (" +
                                  std::to_string(index.num_documents) + " documents, " +
                                  std::to_string(index.num_sequences) + " sequences)";
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<FlatTokenSource> source,
                       FlatTokenSource::Create(std::move(bin), index.type, vocab_size,
                                               validation_fraction, description));
  return std::unique_ptr<TokenSource>(std::move(source));
}

}  // namespace moe
