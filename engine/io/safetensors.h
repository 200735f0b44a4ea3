// The safetensors file format (Hugging Face), readable by Python's safetensors.torch.load_file:
//
//   u64 little-endian N | N bytes of JSON header, space-padded so N % 8 == 0 | data buffer
//   header: {"__metadata__": {string: string},
//            "<name>": {"dtype": "F32"|"BF16"|"I32"|"I64"|"U8", "shape": [...],
//                       "data_offsets": [begin, end]}, ...}
//
// Offsets are bytes relative to the start of the data buffer. The writer packs tensors without
// gaps, larger element sizes first (otherwise in the given order), so with the 8-byte-aligned
// data start every tensor is aligned to its element size, as the reference writer does. Tensor
// bytes are raw little-endian host bytes; tensors on any device are copied through the host.
//
// The reader validates strictly, like the reference implementation: the header must lie within
// the file and be a JSON object; every entry needs a known dtype and offsets spanning exactly
// shape x element size; sorted by offset, the tensors must tile the data buffer exactly (no
// overlap, no gap, nothing past the end, nothing after the last). Each failure is a one-line
// Status naming the file and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/io/named_tensor.h"

namespace moe {

using SafetensorsMetadata = std::map<std::string, std::string>;

// Writes `tensors` (unique, non-empty names other than "__metadata__") to `path`, replacing it,
// and fsyncs the file. Not atomic: callers that need that write elsewhere and rename.
Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const SafetensorsMetadata& metadata);

// The reader's checks of the header and the layout, without reading any tensor's data: for checks
// made before any tensor is allocated (a truncated or corrupt file found at start).
Status CheckSafetensorsLayout(const std::string& path);

// What a load does with a NaN or infinity among the file's f32 and bf16 values: keeps it (a
// file is bytes), or refuses it (weights and optimizer state never hold one: the load fails at the
// first such value, naming its tensor and element, with the tensors before it already written).
enum class NonFiniteValues { kKeep, kRefuse };

// Loads the file into existing tensors (any device), by name. The file must hold exactly these
// names, each with the destination's shape and either its dtype or, for f32 <-> bf16, the other
// float type (converted on the host, bf16 rounded to nearest even). Names, shapes and dtypes are
// checked before any destination is written, so a mismatch leaves the destinations untouched.
Status LoadSafetensors(const std::string& path, const std::vector<NamedTensor>& destinations,
                       NonFiniteValues non_finite = NonFiniteValues::kKeep);

// LoadSafetensors' rules, except that the file may hold further tensors, which are not read (e.g.
// one pipeline stage's parameters out of a full-model checkpoint). Every destination must still
// be in the file.
Status LoadSafetensorsSubset(const std::string& path, const std::vector<NamedTensor>& destinations,
                             NonFiniteValues non_finite = NonFiniteValues::kKeep);

// A tensor read into host memory: raw little-endian bytes.
struct HostTensor {
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<uint8_t> bytes;
};

struct SafetensorsContents {
  SafetensorsMetadata metadata;
  std::map<std::string, HostTensor> tensors;
};

// Reads the whole file into host memory (for tools and tests).
StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path);

}  // namespace moe
