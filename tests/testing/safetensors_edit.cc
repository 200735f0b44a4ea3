#include "tests/testing/safetensors_edit.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

namespace moe::testing {

int OverwriteF32Tensors(const std::string& file, const std::string& part, float value) {
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    CHECK(in) << "cannot read " << file;
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_size));
  int changed = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name.find(part) == std::string::npos || !entry.contains("data_offsets")) continue;
    if (entry["dtype"] != "F32") continue;
    for (uint64_t at = entry["data_offsets"][0]; at < entry["data_offsets"][1]; at += 4) {
      std::memcpy(bytes.data() + 8 + header_size + at, &value, 4);
    }
    ++changed;
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  return changed;
}

}  // namespace moe::testing
