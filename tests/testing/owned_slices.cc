#include "tests/testing/owned_slices.h"

#include <algorithm>

#include <glog/logging.h>

namespace moe::testing {

std::vector<SlicePart> SliceParts(const ParameterSet& set, const OwnedSlice& s) {
  const auto& all = set.all();
  const auto first =
      std::find_if(all.begin(), all.end(), [&](const auto& p) { return p.get() == s.parameter; });
  CHECK(first != all.end()) << "a slice of another set";
  CHECK_LE(s.parameters, all.end() - first);
  const auto element_size = static_cast<int64_t>(DTypeSize(s.value.dtype()));
  std::vector<SlicePart> parts;
  int64_t at = 0;
  for (auto p = first; p != first + s.parameters; ++p) {
    const Tensor& value = (*p)->value;
    // Where the parameter starts, counted in elements from the slice's start (< 0: before it).
    const int64_t start =
        (static_cast<const char*>(value.data()) - static_cast<const char*>(s.value.data())) /
        element_size;
    const int64_t end = std::min(start + value.numel(), s.value.numel());
    CHECK_EQ(std::max<int64_t>(start, 0), at) << (*p)->name << " does not follow on in the slice";
    CHECK_LT(at, end) << (*p)->name << " is not in the slice";
    parts.push_back({p->get(), at - start, at, end - at});
    at = end;
  }
  CHECK_EQ(at, s.value.numel()) << "the slice's parameters end before the slice";
  return parts;
}

}  // namespace moe::testing
