#!/usr/bin/env bash
# Run here (not on the GPU machine, which has no network): downloads the gflags and glog Debian
# packages that the GPU machine lacks into .device-deps/, an ignored folder the device tool carries.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .device-deps
cd .device-deps
apt-get download libgflags2.2 libgflags-dev libgoogle-glog0v6 libgoogle-glog-dev libunwind8 \
  libunwind-dev nlohmann-json3-dev
