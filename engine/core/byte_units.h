// Binary byte units, for memory figures in logs, plans and messages (one home: MiB and GiB mean
// 2^20 and 2^30 bytes everywhere).
#pragma once

namespace moe {

inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGiB = 1024.0 * kMiB;

}  // namespace moe
