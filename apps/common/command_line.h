// The apps' command line (moe_train's and the benchmarks'), read strictly: every argument and
// every flagfile line is used or refused, in one line naming it. This replaces
// gflags::ParseCommandLineFlags, which ignores positional arguments, unknown flags inside a
// flagfile, and a --flagfile naming a directory or a binary file, and which exits 1 (not the
// apps' 2 for flags) on the errors it does find. Messages name the program as argv[0]'s file
// name.
//
// Accepted, as gflags spells them: --name=value or -name=value; --name value (not for bools);
// --bool, --nobool; --flagfile=FILE[,FILE...] (nested flagfiles too), whose lines are blank,
// `#` comments, or one --name=value / --bool / --nobool each. Later settings override earlier
// ones. Values are set through gflags (its parsers; a value it refuses is an error naming the
// flag and its type), so gflags::GetCommandLineFlagInfoOrDie(name).is_default is false exactly
// for the flags the user set, on the command line or in a flagfile.
// Refused: positional arguments (and anything after a bare --), unknown flags (with the nearest
// known name), a value with spaces around it (--num_layers=" 2", --save="ckpt ") or holding
// another flag (--save="ckpt --load=old"), a --flagfile
// that is missing, a directory, not text or over 1 MiB, an empty entry in a --flagfile list, a
// flagfile line that is not a flag or has a comment after its flag (--save=ckpt # note: the
// comment would be part of the value), and gflags' --fromenv, --tryfromenv and --undefok. A UTF-8
// byte-order mark at a flagfile's start is skipped.
// Help: -h, --help (the project's flags, grouped as in README.md), --helpshort (their names),
// --helpfull (then every flag of every library); gflags' other help flags (--helpxml,
// --helpon=, --helpmatch=, --version) are passed to gflags when they ask for help (set to true,
// or to a name); --version=false or an empty --helpon= is as if not given.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace moe {

enum class HelpRequest { kNone, kHelp, kHelpShort, kHelpFull, kGflags };

// Sets the flags that argv names (argv[0] is the program). Returns which help was asked for;
// kNone: run.
StatusOr<HelpRequest> ParseCommandLine(int argc, char** argv);

}  // namespace moe
