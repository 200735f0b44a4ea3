// Megatron-LM indexed datasets (the "MMIDIDX" .bin/.idx pair written by Megatron's
// tools/preprocess_data.py), opened from the path prefix: PREFIX.idx and PREFIX.bin.
//
// .idx, little-endian, packed:
//   char[9]  magic "MMIDIDX\0\0"
//   uint64   version, 1
//   uint8    dtype code of the tokens: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//            7 float32, 8 uint16 (Megatron writes uint16 below 65500 tokens, else int32; only
//            those two are accepted)
//   uint64   S, the number of sequences
//   uint64   D, the number of document indices (documents + 1)
//   int32    sizes[S]           tokens per sequence
//   int64    pointers[S]        byte offset of each sequence in the .bin
//   int64    document_index[D]  0, then the end sequence of each document (non-decreasing, to S)
// .bin: the sequences' tokens back to back.
//
// Every field is checked before any token is read: magic, version, dtype, the .idx length
// against S and D, each pointer against the sizes before it (sequences are contiguous), the
// document index, and the .bin length against the sizes. Multimodal indexes (a mode byte per
// sequence after the document index) are refused.
//
// The documents are treated as one concatenated token stream, GPT-style (the end-of-document
// tokens preprocess_data.py appends stay in the stream): windows may span documents. The stream
// is then split and windowed like any flat token file (flat_dataset.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/status.h"
#include "engine/io/token_source.h"

namespace moe {

// The dataset's two files: PREFIX.idx and PREFIX.bin.
struct MegatronDatasetFiles {
  std::string idx;
  std::string bin;
};
MegatronDatasetFiles MegatronFiles(const std::string& prefix);

StatusOr<std::unique_ptr<TokenSource>> OpenMegatronDataset(const std::string& prefix,
                                                           int64_t vocab_size,
                                                           double validation_fraction);

}  // namespace moe
