#include "engine/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "engine/core/bfloat16.h"
#include "engine/io/durable_files.h"
#include "engine/io/quoted.h"
#include "engine/kernels/ops.h"

namespace moe {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; tensors are written as they lie in memory");

constexpr const char* kMetadataKey = "__metadata__";

// The storage types a file may hold: the engine's dtypes, and F16, which only
// SafetensorsReader reads (widened to f32).
struct StorageCode {
  const char* code;
  uint64_t element_size;
  std::optional<DType> dtype;
};
constexpr StorageCode kStorageCodes[] = {{"F32", 4, DType::kF32}, {"BF16", 2, DType::kBF16},
                                         {"I32", 4, DType::kI32}, {"I64", 8, DType::kI64},
                                         {"U8", 1, DType::kU8},   {"F16", 2, std::nullopt}};

const char* DTypeCodeOf(DType dtype) {
  for (const StorageCode& c : kStorageCodes) {
    if (c.dtype == dtype) return c.code;
  }
  LOG(FATAL) << "no safetensors code for dtype " << DTypeName(dtype);
}

// Which storage types a reader accepts: the engine's dtypes, or those and F16.
enum class Codes { kDTypes, kWithF16 };

// Strings from the file go into one-line messages: control characters become '?'.
std::string OneLine(std::string text) {
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return text;
}

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now and reports the error (a delayed write failure can surface here).
  int Close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Internal("cannot write " + Quoted(path) + ": " + ErrnoText());
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status ReadAt(int fd, uint64_t offset, void* data, size_t bytes, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return DataLoss("cannot read " + Quoted(path) + ": " + ErrnoText());
    if (n == 0) {
      return DataLoss(Quoted(path) + " ended at byte " + std::to_string(offset) +
                      " while reading (file truncated?)");
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// One tensor as the header describes it; [begin, end) are offsets into the data buffer.
struct Entry {
  std::string name;
  const StorageCode* storage = nullptr;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;

  // Files opened with Codes::kDTypes hold only these.
  DType dtype() const { return storage->dtype.value(); }
};

std::string RangeString(uint64_t begin, uint64_t end) {
  return std::string("[") + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

std::string EntryString(const Entry& e) {
  return std::string(e.storage->dtype ? DTypeName(*e.storage->dtype) : e.storage->code) +
         ShapeString(e.shape);
}

// An open, validated file: entries sorted by offset, tiling [0, data_size) exactly.
struct ParsedFile {
  std::string path;
  ScopedFd fd;
  uint64_t data_start = 0;
  std::vector<Entry> entries;
  SafetensorsMetadata metadata;

  Status Read(const Entry& e, void* dst) const {
    return ReadAt(fd.get(), data_start + e.begin, dst, e.end - e.begin, path);
  }
};

bool IsNonNegativeInteger(const nlohmann::json& j) {
  return j.is_number_unsigned() || (j.is_number_integer() && j.get<int64_t>() >= 0);
}

// Fills `entry` from a header value; false if it does not have the required form.
bool ParseEntryFields(const nlohmann::json& value, Entry* entry, std::string* dtype_code) {
  if (!value.is_object()) return false;
  const auto dtype = value.find("dtype");
  const auto shape = value.find("shape");
  const auto offsets = value.find("data_offsets");
  if (dtype == value.end() || shape == value.end() || offsets == value.end()) return false;
  if (!dtype->is_string() || !shape->is_array() || !offsets->is_array() || offsets->size() != 2) {
    return false;
  }
  for (const nlohmann::json& d : *shape) {
    if (!IsNonNegativeInteger(d) || d.get<uint64_t>() > INT64_MAX) return false;
    entry->shape.push_back(d.get<int64_t>());
  }
  if (!IsNonNegativeInteger((*offsets)[0]) || !IsNonNegativeInteger((*offsets)[1])) return false;
  entry->begin = (*offsets)[0].get<uint64_t>();
  entry->end = (*offsets)[1].get<uint64_t>();
  *dtype_code = dtype->get<std::string>();
  return true;
}

Status ParseEntry(const std::string& path, const std::string& name, const nlohmann::json& value,
                  Codes codes, Entry* entry) {
  entry->name = name;
  std::string code;
  if (!ParseEntryFields(value, entry, &code)) {
    return DataLoss(Quoted(path) + ": header entry '" + name +
                    "' is malformed (needs \"dtype\": string, \"shape\": [non-negative integers], "
                    "\"data_offsets\": [begin, end])");
  }
  for (const StorageCode& c : kStorageCodes) {
    if (code == c.code && (c.dtype || codes == Codes::kWithF16)) entry->storage = &c;
  }
  if (entry->storage == nullptr) {
    return DataLoss(Quoted(path) + ": tensor '" + name + "' has unsupported dtype '" +
                    OneLine(code) + "' (supported: F32, BF16, " +
                    (codes == Codes::kWithF16 ? "F16, " : "") + "I32, I64, U8)");
  }
  uint64_t nbytes = entry->storage->element_size;
  for (int64_t d : entry->shape) {
    if (__builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes)) {
      return DataLoss(Quoted(path) + ": tensor '" + name + "' has an impossibly large shape " +
                      ShapeString(entry->shape));
    }
  }
  if (entry->end < entry->begin || entry->end - entry->begin != nbytes) {
    return DataLoss(Quoted(path) + ": tensor '" + name + "' has data_offsets " +
                    RangeString(entry->begin, entry->end) + ", but " + EntryString(*entry) +
                    " needs " + std::to_string(nbytes) + " bytes");
  }
  return Status::Ok();
}

// Sorted by offset, the entries must tile [0, data_size) exactly.
Status CheckLayout(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t position = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    const std::string range = RangeString(e.begin, e.end);
    if (e.end > data_size) {
      return DataLoss(Quoted(path) + ": tensor '" + e.name + "' data_offsets " + range +
                      " run past the end of the data buffer (" + std::to_string(data_size) +
                      " bytes; file truncated?)");
    }
    if (e.begin < position) {
      return DataLoss(Quoted(path) + ": tensors '" + previous->name + "' " +
                      RangeString(previous->begin, previous->end) + " and '" + e.name + "' " +
                      range + " overlap");
    }
    if (e.begin > position) {
      return DataLoss(Quoted(path) + ": " + std::to_string(e.begin - position) +
                      " unused bytes before tensor '" + e.name +
                      "' (data_offsets must pack the tensors without gaps)");
    }
    position = e.end;
    previous = &e;
  }
  if (position != data_size) {
    return DataLoss(Quoted(path) + ": " + std::to_string(data_size - position) +
                    " bytes after the last tensor (data_offsets must cover the data exactly)");
  }
  return Status::Ok();
}

StatusOr<ParsedFile> OpenSafetensors(const std::string& path, Codes codes = Codes::kDTypes) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const std::string message = "cannot open " + Quoted(path) + ": " + ErrnoText();
    return errno == ENOENT ? NotFound(message) : FailedPrecondition(message);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return Internal("cannot stat " + Quoted(path) + ": " + ErrnoText());
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    return DataLoss(Quoted(path) + " is not a safetensors file: " + std::to_string(file_size) +
                    " bytes, too short for the 8-byte header length");
  }
  uint8_t length_bytes[8];
  MOE_RETURN_IF_ERROR(ReadAt(fd.get(), 0, length_bytes, 8, path));
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];
  if (header_length > file_size - 8) {
    return DataLoss(Quoted(path) + ": header length " + std::to_string(header_length) +
                    " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
  }
  std::string text(header_length, '\0');
  MOE_RETURN_IF_ERROR(ReadAt(fd.get(), 8, text.data(), text.size(), path));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(Quoted(path) + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return DataLoss(Quoted(path) + ": header is not a JSON object");

  ParsedFile file{.path = path,
                  .fd = std::move(fd),
                  .data_start = 8 + header_length,
                  .entries = {},
                  .metadata = {}};
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      const bool strings =
          value.is_object() &&
          std::all_of(value.begin(), value.end(), [](const auto& v) { return v.is_string(); });
      if (!strings) return DataLoss(Quoted(path) + ": __metadata__ must map strings to strings");
      for (const auto& [k, v] : value.items()) file.metadata[k] = v.template get<std::string>();
      continue;
    }
    Entry entry;
    MOE_RETURN_IF_ERROR(ParseEntry(path, key, value, codes, &entry));
    file.entries.push_back(std::move(entry));
  }
  MOE_RETURN_IF_ERROR(CheckLayout(path, file.entries, file_size - file.data_start));
  return file;
}

// The index of the first f32 or bf16 value of `e` that is NaN or infinite, or -1 (also for the
// integer dtypes).
int64_t FirstNonFinite(const Entry& e, const std::vector<uint8_t>& bytes) {
  if (!IsFloating(e.dtype())) return -1;
  const size_t n = bytes.size() / DTypeSize(e.dtype());
  for (size_t i = 0; i < n; ++i) {
    float v;
    if (e.dtype() == DType::kF32) {
      std::memcpy(&v, bytes.data() + 4 * i, 4);
    } else {
      BFloat16 b;
      std::memcpy(&b.bits, bytes.data() + 2 * i, 2);
      v = BFloat16ToFloat(b);
    }
    if (!std::isfinite(v)) return static_cast<int64_t>(i);
  }
  return -1;
}

// The destination's bytes for `e`: read directly, or converted f32 <-> bf16 on the host.
Status LoadEntry(const ParsedFile& file, const Entry& e, const Tensor& dst,
                 NonFiniteValues non_finite) {
  std::vector<uint8_t> bytes(e.end - e.begin);
  MOE_RETURN_IF_ERROR(file.Read(e, bytes.data()));
  if (const int64_t at = non_finite == NonFiniteValues::kRefuse ? FirstNonFinite(e, bytes) : -1;
      at >= 0) {
    return DataLoss("tensor '" + e.name + "' in " + Quoted(file.path) +
                    " holds a non-finite value (NaN or infinity) at element " + std::to_string(at));
  }
  if (e.dtype() == dst.dtype()) {
    ops::CopyFromHost(bytes.data(), dst);
    return Status::Ok();
  }
  const size_t n = static_cast<size_t>(dst.numel());
  if (e.dtype() == DType::kF32) {  // to bf16
    std::vector<BFloat16> narrow(n);
    for (size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      narrow[i] = FloatToBFloat16(v);
    }
    ops::CopyFromHost(narrow.data(), dst);
  } else {  // bf16 to f32
    std::vector<float> wide(n);
    for (size_t i = 0; i < n; ++i) {
      BFloat16 v;
      std::memcpy(&v.bits, bytes.data() + 2 * i, 2);
      wide[i] = BFloat16ToFloat(v);
    }
    ops::CopyFromHost(wide.data(), dst);
  }
  return Status::Ok();
}

bool Convertible(DType from, DType to) {
  return from == to || (IsFloating(from) && IsFloating(to));
}

}  // namespace

// The writer's state: the open file, where its data starts, and each tensor's place there.
struct SafetensorsWriter::File {
  std::string path;
  ScopedFd fd{-1};
  uint64_t data_start = 0;
  struct Place {
    uint64_t begin;
    int64_t numel;
    DType dtype;
  };
  std::unordered_map<std::string, Place> places;
};

StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, const std::vector<TensorSpec>& tensors,
    const SafetensorsMetadata& metadata) {
  std::vector<const TensorSpec*> order;
  for (const TensorSpec& t : tensors) {
    CHECK(!t.name.empty() && t.name != kMetadataKey) << "bad tensor name '" << t.name << "'";
    order.push_back(&t);
  }
  std::stable_sort(order.begin(), order.end(), [](const TensorSpec* a, const TensorSpec* b) {
    return DTypeSize(a->dtype) > DTypeSize(b->dtype);
  });

  auto file = std::make_unique<File>();
  file->path = path;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec* t : order) {
    const int64_t numel = NumElements(t->shape);
    const uint64_t end = offset + static_cast<uint64_t>(numel) * DTypeSize(t->dtype);
    CHECK(file->places.emplace(t->name, File::Place{offset, numel, t->dtype}).second)
        << "tensor name '" << t->name << "' appears twice";
    header[t->name] = {
        {"dtype", DTypeCodeOf(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  uint8_t length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  file->data_start = 8 + text.size();

  file->fd = ScopedFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (file->fd.get() < 0) {
    return FailedPrecondition("cannot create " + Quoted(path) + ": " + ErrnoText());
  }
  MOE_RETURN_IF_ERROR(WriteAll(file->fd.get(), length_bytes, 8, path));
  MOE_RETURN_IF_ERROR(WriteAll(file->fd.get(), text.data(), text.size(), path));
  if (::ftruncate(file->fd.get(), static_cast<off_t>(file->data_start + offset)) != 0) {
    return Internal("cannot size " + Quoted(path) + ": " + ErrnoText());
  }
  return std::unique_ptr<SafetensorsWriter>(new SafetensorsWriter(std::move(file)));
}

SafetensorsWriter::SafetensorsWriter(std::unique_ptr<File> file) : file_(std::move(file)) {}
SafetensorsWriter::~SafetensorsWriter() = default;

Status SafetensorsWriter::Write(const std::string& name, int64_t begin, int64_t count,
                                const void* data) {
  CHECK(file_->fd.get() >= 0) << "write to " << file_->path << " after Finish";
  const auto it = file_->places.find(name);
  CHECK(it != file_->places.end()) << "no tensor '" << name << "' in " << file_->path;
  const File::Place& place = it->second;
  CHECK(begin >= 0 && count >= 0 && begin + count <= place.numel)
      << "elements [" << begin << ", " << begin + count << ") of '" << name << "' (" << place.numel
      << ")";
  const char* p = static_cast<const char*>(data);
  const uint64_t element_size = DTypeSize(place.dtype);
  uint64_t offset = file_->data_start + place.begin + static_cast<uint64_t>(begin) * element_size;
  size_t bytes = static_cast<size_t>(count) * element_size;
  while (bytes > 0) {
    const ssize_t n = ::pwrite(file_->fd.get(), p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Internal("cannot write " + Quoted(file_->path) + ": " + ErrnoText());
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

DType SafetensorsWriter::dtype(const std::string& name) const {
  const auto it = file_->places.find(name);
  CHECK(it != file_->places.end()) << "no tensor '" << name << "' in " << file_->path;
  return it->second.dtype;
}

Status SafetensorsWriter::Finish() {
  if (::fsync(file_->fd.get()) != 0 || file_->fd.Close() != 0) {
    return Internal("cannot write " + Quoted(file_->path) + ": " + ErrnoText());
  }
  return Status::Ok();
}

Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                        const SafetensorsMetadata& metadata) {
  std::vector<SafetensorsWriter::TensorSpec> specs;
  for (const NamedTensor& t : tensors) {
    CHECK(t.tensor.defined()) << "tensor '" << t.name << "' is undefined";
    specs.push_back({t.name, t.tensor.dtype(), t.tensor.shape()});
  }
  MOE_ASSIGN_OR_RETURN(const std::unique_ptr<SafetensorsWriter> writer,
                       SafetensorsWriter::Create(path, specs, metadata));
  std::vector<uint8_t> buffer;
  for (const NamedTensor& t : tensors) {
    buffer.resize(t.tensor.nbytes());
    ops::CopyToHost(t.tensor, buffer.data());
    MOE_RETURN_IF_ERROR(writer->Write(t.name, 0, t.tensor.numel(), buffer.data()));
  }
  return writer->Finish();
}

namespace {

// LoadSafetensors (exact: the file holds no other names) and LoadSafetensorsSubset.
Status LoadNamed(const std::string& path, const std::vector<NamedTensor>& destinations, bool exact,
                 NonFiniteValues non_finite) {
  MOE_ASSIGN_OR_RETURN(const ParsedFile file, OpenSafetensors(path));
  std::unordered_map<std::string, const Entry*> by_name;
  for (const Entry& e : file.entries) by_name[e.name] = &e;

  std::vector<const Entry*> sources;
  std::set<std::string> expected;
  for (const NamedTensor& d : destinations) {
    CHECK(d.tensor.defined()) << "destination '" << d.name << "' is undefined";
    CHECK(expected.insert(d.name).second) << "destination name '" << d.name << "' appears twice";
    const std::string want =
        std::string(DTypeName(d.tensor.dtype())) + ShapeString(d.tensor.shape());
    const auto it = by_name.find(d.name);
    if (it == by_name.end()) {
      return NotFound(Quoted(path) + " has no tensor '" + d.name + "' (expected " + want + ")");
    }
    const Entry& e = *it->second;
    if (e.shape != d.tensor.shape()) {
      return InvalidArgument("tensor '" + d.name + "' in " + Quoted(path) + " has shape " +
                             ShapeString(e.shape) + ", expected " + ShapeString(d.tensor.shape()));
    }
    if (!Convertible(e.dtype(), d.tensor.dtype())) {
      return InvalidArgument("tensor '" + d.name + "' in " + Quoted(path) + " has dtype " +
                             DTypeName(e.dtype()) + ", expected " + DTypeName(d.tensor.dtype()) +
                             " (only f32 and bf16 convert into each other)");
    }
    sources.push_back(&e);
  }
  for (const Entry& e : file.entries) {
    if (exact && !expected.count(e.name)) {
      return InvalidArgument(Quoted(path) + " holds unexpected tensor '" + e.name + "' (" +
                             EntryString(e) + "; " + std::to_string(file.entries.size()) +
                             " tensors in the file, " + std::to_string(destinations.size()) +
                             " expected)");
    }
  }
  for (size_t i = 0; i < destinations.size(); ++i) {
    MOE_RETURN_IF_ERROR(LoadEntry(file, *sources[i], destinations[i].tensor, non_finite));
  }
  return Status::Ok();
}

}  // namespace

Status CheckSafetensorsLayout(const std::string& path) { return OpenSafetensors(path).status(); }

Status LoadSafetensors(const std::string& path, const std::vector<NamedTensor>& destinations,
                       NonFiniteValues non_finite) {
  return LoadNamed(path, destinations, /*exact=*/true, non_finite);
}

Status LoadSafetensorsSubset(const std::string& path, const std::vector<NamedTensor>& destinations,
                             NonFiniteValues non_finite) {
  return LoadNamed(path, destinations, /*exact=*/false, non_finite);
}

StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path) {
  MOE_ASSIGN_OR_RETURN(const ParsedFile file, OpenSafetensors(path));
  SafetensorsContents contents;
  contents.metadata = file.metadata;
  for (const Entry& e : file.entries) {
    HostTensor& t = contents.tensors[e.name];
    t.dtype = e.dtype();
    t.shape = e.shape;
    t.bytes.resize(e.end - e.begin);
    MOE_RETURN_IF_ERROR(file.Read(e, t.bytes.data()));
  }
  return contents;
}

// --- SafetensorsReader ---------------------------------------------------------------------------

struct SafetensorsReader::File {
  ParsedFile parsed;
  std::vector<TensorInfo> tensors;                  // parsed.entries' order
  std::unordered_map<std::string, size_t> by_name;  // index into both
};

namespace {

// IEEE half-precision bits to float, exactly (subnormals, infinities and NaNs included).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {  // infinity or NaN
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

constexpr int64_t kReadChunkElements = int64_t{1} << 22;  // 8 MiB of a 2-byte type per read
constexpr int64_t kCopyChunkElements = int64_t{1} << 22;  // 16 MiB of f32 per part

}  // namespace

StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path) {
  MOE_ASSIGN_OR_RETURN(ParsedFile parsed, OpenSafetensors(path, Codes::kWithF16));
  auto file = std::make_unique<File>(File{std::move(parsed), {}, {}});
  for (const Entry& e : file->parsed.entries) {
    file->by_name[e.name] = file->tensors.size();
    file->tensors.push_back({e.name, e.storage->code, e.shape});
  }
  return std::unique_ptr<SafetensorsReader>(new SafetensorsReader(std::move(file)));
}

SafetensorsReader::SafetensorsReader(std::unique_ptr<File> file) : file_(std::move(file)) {}
SafetensorsReader::~SafetensorsReader() = default;

const std::string& SafetensorsReader::path() const { return file_->parsed.path; }

const std::vector<SafetensorsReader::TensorInfo>& SafetensorsReader::tensors() const {
  return file_->tensors;
}

const SafetensorsReader::TensorInfo* SafetensorsReader::Find(const std::string& name) const {
  const auto it = file_->by_name.find(name);
  return it == file_->by_name.end() ? nullptr : &file_->tensors[it->second];
}

Status SafetensorsReader::ReadF32(const std::string& name, int64_t begin, int64_t count,
                                  float* out) const {
  const auto it = file_->by_name.find(name);
  CHECK(it != file_->by_name.end()) << "no tensor '" << name << "' in " << path();
  const Entry& e = file_->parsed.entries[it->second];
  const int64_t numel = NumElements(e.shape);
  CHECK(begin >= 0 && count >= 0 && begin + count <= numel)
      << "elements [" << begin << ", " << begin + count << ") of '" << name << "' (" << numel
      << ")";
  const std::string code = e.storage->code;
  if (code != "F32" && code != "BF16" && code != "F16") {
    return InvalidArgument("tensor '" + name + "' in " + Quoted(path()) + " is " + code +
                           ", not a float (F32, BF16 or F16)");
  }
  const uint64_t size = e.storage->element_size;
  const uint64_t start = file_->parsed.data_start + e.begin + static_cast<uint64_t>(begin) * size;
  if (code == "F32") {
    return ReadAt(file_->parsed.fd.get(), start, out, static_cast<size_t>(count) * 4, path());
  }
  const bool half = code == "F16";
  std::vector<uint16_t> narrow(static_cast<size_t>(std::min(count, kReadChunkElements)));
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min<int64_t>(count - done, kReadChunkElements);
    MOE_RETURN_IF_ERROR(ReadAt(file_->parsed.fd.get(), start + static_cast<uint64_t>(done) * 2,
                               narrow.data(), static_cast<size_t>(n) * 2, path()));
    for (int64_t i = 0; i < n; ++i) {
      out[done + i] = half ? HalfToFloat(narrow[i]) : BFloat16ToFloat(BFloat16{narrow[i]});
    }
    done += n;
  }
  return Status::Ok();
}

Status CopySafetensorsElements(const SafetensorsReader& from, const std::string& from_name,
                               int64_t from_begin, SafetensorsWriter& to,
                               const std::string& to_name, int64_t to_begin, int64_t count,
                               NonFiniteValues non_finite) {
  const DType dtype = to.dtype(to_name);
  CHECK(dtype == DType::kF32 || dtype == DType::kBF16)
      << "copy into '" << to_name << "' of dtype " << DTypeName(dtype);
  std::vector<float> values(static_cast<size_t>(std::min(count, kCopyChunkElements)));
  std::vector<BFloat16> narrow(dtype == DType::kBF16 ? values.size() : 0);
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(count - done, kCopyChunkElements);
    MOE_RETURN_IF_ERROR(from.ReadF32(from_name, from_begin + done, n, values.data()));
    if (non_finite == NonFiniteValues::kRefuse) {
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(values[i])) {
          return DataLoss("tensor '" + from_name + "' in " + Quoted(from.path()) +
                          " holds a non-finite value (NaN or infinity) at element " +
                          std::to_string(from_begin + done + i));
        }
      }
    }
    const void* data = values.data();
    if (dtype == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) narrow[i] = FloatToBFloat16(values[i]);
      data = narrow.data();
    }
    MOE_RETURN_IF_ERROR(to.Write(to_name, to_begin + done, n, data));
    done += n;
  }
  return Status::Ok();
}

}  // namespace moe
