// One value per device, made on the first call for that device and kept for the life of the
// process, never destroyed (like the device contexts): cuBLAS handles, kernel workspaces, host
// buffers, what a device is. Each call site (each Init type) keeps its own values.
#pragma once

#include <map>
#include <mutex>

namespace moe::cuda {

// The Value of device `device_index`: on the first call for it, a default-constructed Value that
// init(Value&) then sets up, under a lock (a caller that needs the device current makes it so).
template <typename Value, typename Init>
Value& OncePerDevice(int device_index, Init init) {
  static std::mutex mutex;
  static auto* values = new std::map<int, Value>();  // never freed
  std::lock_guard<std::mutex> lock(mutex);
  const auto [it, first] = values->try_emplace(device_index);
  if (first) init(it->second);
  return it->second;
}

}  // namespace moe::cuda
