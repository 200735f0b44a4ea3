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
// SafetensorsWriter and SafetensorsReader do the same tensor by tensor, in parts, for converters
// of checkpoints larger than they want to hold in memory; the reader also takes F16 (Hugging Face
// checkpoints may hold it), which no engine dtype stores: it reads every float type as f32.
//
// The reader validates strictly, like the reference implementation: the header must lie within
// the file and be a JSON object; every entry needs a known dtype and offsets spanning exactly
// shape x element size; sorted by offset, the tensors must tile the data buffer exactly (no
// overlap, no gap, nothing past the end, nothing after the last). Each failure is a one-line
// Status naming the file and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
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

// A file written in parts: Create writes the header (WriteSafetensors' layout of `tensors`) and
// sizes the file; Write puts elements of one tensor at their place, in any order; Finish fsyncs
// and closes it. Elements never written read as zero bytes: the caller writes every one. Not
// atomic (as WriteSafetensors).
class SafetensorsWriter {
 public:
  struct TensorSpec {
    std::string name;  // unique, non-empty, not "__metadata__"
    DType dtype;
    Shape shape;
  };
  static StatusOr<std::unique_ptr<SafetensorsWriter>> Create(const std::string& path,
                                                             const std::vector<TensorSpec>& tensors,
                                                             const SafetensorsMetadata& metadata);
  ~SafetensorsWriter();
  // Elements [begin, begin + count) of tensor `name` (row-major): `count` values of its dtype.
  Status Write(const std::string& name, int64_t begin, int64_t count, const void* data);
  Status Finish();
  DType dtype(const std::string& name) const;

 private:
  struct File;
  explicit SafetensorsWriter(std::unique_ptr<File> file);
  std::unique_ptr<File> file_;
};

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

// A file opened to be read in parts, after the reader's checks above (F16 allowed besides the
// engine's dtypes): its tensors' names, dtypes and shapes, and any range of a float tensor's
// elements as f32 (F32 as stored; BF16 and F16 widened, which is exact).
class SafetensorsReader {
 public:
  struct TensorInfo {
    std::string name;
    std::string dtype;  // the file's code: "F32", "BF16", "F16", "I32", ...
    Shape shape;
  };
  static StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  ~SafetensorsReader();
  const std::string& path() const;
  // In the order of their data in the file.
  const std::vector<TensorInfo>& tensors() const;
  // nullptr if the file has no tensor `name`.
  const TensorInfo* Find(const std::string& name) const;
  // Elements [begin, begin + count) of tensor `name` (row-major) into out[0, count); an error for
  // a tensor that is not F32, BF16 or F16.
  Status ReadF32(const std::string& name, int64_t begin, int64_t count, float* out) const;

 private:
  struct File;
  explicit SafetensorsReader(std::unique_ptr<File> file);
  std::unique_ptr<File> file_;
};

// Elements [from_begin, from_begin + count) of `from`'s float tensor `from_name` into elements
// [to_begin, to_begin + count) of `to`'s tensor `to_name` (f32, or bf16 rounded to nearest even),
// a few MiB at a time. With kRefuse a NaN or infinity fails the copy, naming its tensor, file and
// element.
Status CopySafetensorsElements(const SafetensorsReader& from, const std::string& from_name,
                               int64_t from_begin, SafetensorsWriter& to,
                               const std::string& to_name, int64_t to_begin, int64_t count,
                               NonFiniteValues non_finite);

}  // namespace moe
