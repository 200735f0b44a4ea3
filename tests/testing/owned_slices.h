// Test helper: which elements of which parameters an OwnedSlice covers (a stack's slice covers
// several members, and under a sharded state only part of them).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/autograd/parameters.h"

namespace moe::testing {

// Elements [first, first + count) of `parameter` (flattened) sit at elements [at, at + count) of
// the slice.
struct SlicePart {
  const Parameter* parameter = nullptr;
  int64_t first = 0;
  int64_t at = 0;
  int64_t count = 0;
};

// The parts of the slice's parameters (s.parameter and the s.parameters - 1 created after it in
// `set`) it covers, in order, found from where their values lie against the slice's value. Each
// covered parameter's part is non-empty and the parts tile the slice (CHECKed).
std::vector<SlicePart> SliceParts(const ParameterSet& set, const OwnedSlice& s);

}  // namespace moe::testing
