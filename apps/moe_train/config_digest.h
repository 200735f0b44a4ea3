// Every rank on one configuration. Under mpirun each rank reads its own command line and
// flagfiles, so ranks can be started with different flags; before any work, main compares each
// rank's digest of its effective configuration with rank 0's (CompareWithRankZero, collective),
// so that a mismatch is one line and exit code 2 on every rank instead of an abort, a hang or
// replicas that silently train apart.
//
// The digest (ConfigDigest) is a list of entries, in FlagTable order (flag_table.h):
// - every flag of the table, as the value gflags holds once the command line and the flagfiles
//   are read (FlagValueText), except the flags that change only what rank 0 prints or each rank
//   writes beside the run and never a value, a collective or a checkpoint of any rank:
//   kFlagsOutsideDigest, --metrics_file, --log_interval and --peak_flops (rank 0's log) and
//   --trace_file and --trace_steps (each rank's own trace);
// - the data it reads: each file of the data source (DataSourceFiles) with its size in bytes, so
//   that one path naming different files on different hosts is found too.
// Libraries' flags (glog's, gflags' --flagfile itself) are not in it: the values they lead to
// are.
//
// A mismatch names the first entry that differs and both values: "rank 1 runs another
// configuration than rank 0: --lr is 0.001 on rank 1, 0.003 on rank 0".
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/distributed/world.h"

namespace moe {

inline constexpr const char* kFlagsOutsideDigest[] = {"metrics_file", "log_interval", "peak_flops",
                                                      "trace_file", "trace_steps"};

struct DigestEntry {
  std::string name;   // "--lr", or "the size of tokens.bin (--data_path)"
  std::string value;  // "0.003", "4096 bytes"
};

std::vector<DigestEntry> ConfigDigest();

// Collective: OK if this rank's `digest` equals rank 0's, else the first difference (above).
Status CompareWithRankZero(World& world, const std::vector<DigestEntry>& digest);

}  // namespace moe
