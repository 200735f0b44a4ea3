#!/usr/bin/env bash
# Fails (listing the files) when a C++/CUDA source under engine/, modules/, apps/ or tests/ is not
# formatted as .clang-format says. Pinned to clang-format 14 (Debian 12's; installed by
# third_party/install_deps.sh): other versions format some constructs differently.
# To format: clang-format-14 -i <files>.
#   usage: tests/format/format_check.sh [source root]
set -euo pipefail
cd "${1:-$(dirname "$0")/../..}"
format=clang-format-14
command -v "$format" > /dev/null || { echo "format_check: $format not found (third_party/install_deps.sh installs it)"; exit 1; }
mapfile -t files < <(find engine modules apps tests -type f \
  \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \) | sort)
unformatted=()
for f in "${files[@]}"; do
  "$format" --style=file --dry-run --Werror "$f" > /dev/null 2>&1 || unformatted+=("$f")
done
if [ ${#unformatted[@]} -gt 0 ]; then
  echo "format_check: ${#unformatted[@]} of ${#files[@]} files are not formatted ($format -i them):"
  printf '  %s\n' "${unformatted[@]}"
  exit 1
fi
echo "format_check: ${#files[@]} files formatted"
