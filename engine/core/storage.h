// Storage: one block of memory shared by every Tensor view of it. Whoever allocated it supplies
// `release` (return the block to its allocator) and, for stream-ordered allocators,
// `record_stream` (the block is also used on that stream: do not reuse it before that stream's
// work so far has finished).
#pragma once

#include <cstddef>
#include <functional>

#include "engine/core/device.h"

namespace moe {

class Stream;

class Storage {
 public:
  Storage(void* data, size_t bytes, Device device, MemorySpace space, std::function<void()> release,
          std::function<void(Stream&)> record_stream = nullptr)
      : data_(data),
        bytes_(bytes),
        device_(device),
        space_(space),
        release_(std::move(release)),
        record_stream_(std::move(record_stream)) {}
  ~Storage() {
    if (release_) release_();
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  MemorySpace space() const { return space_; }
  void RecordStream(Stream& stream) const {
    if (record_stream_) record_stream_(stream);
  }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  MemorySpace space_;
  std::function<void()> release_;
  std::function<void(Stream&)> record_stream_;
};

}  // namespace moe
