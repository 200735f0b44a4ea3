// Paths in this source tree, for the tests that read it (MOE_SOURCE_DIR, defined by
// tests/CMakeLists.txt for tests/apps/ and tests/layering/): not derived from __FILE__, which a
// compiler launcher such as ccache may make relative.
#pragma once

#include <string>

namespace moe::testing {

// configs/<name>: a preset flagfile; configs/ itself when `name` is empty.
inline std::string ConfigPath(const std::string& name = "") {
  return std::string(MOE_SOURCE_DIR) + "/configs" + (name.empty() ? "" : "/" + name);
}

}  // namespace moe::testing
