// Durable writes for outputs that must survive a crash whole (checkpoints, staged directories):
// a file written and fsynced, a directory's entries fsynced, and the errno text their messages
// carry. Each failure is a Status naming the path.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace moe {

// strerror(errno), for messages made right after a failed system call.
std::string ErrnoText();
// Writes `content` to `path` (replacing it) and fsyncs it.
Status WriteFileDurably(const std::string& path, const std::string& content);
// Makes the directory's entries (creations, renames) durable.
Status SyncDirectory(const std::string& dir);

}  // namespace moe
