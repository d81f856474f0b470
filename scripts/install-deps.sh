#!/usr/bin/env bash
# Installs the Debian packages the build needs, only if some are missing (idempotent, quiet when
# everything is there). Run as root, or with sudo available.
# usage: install-deps.sh [--test]
#   --test: also what `make test` needs beyond the build: clang-14 + libclang-rt-14-dev (the
#   libFuzzer runtime) + libfmt-dev for the fuzz harnesses it runs a few seconds each
#   (tests/e2e/fuzz_smoke.sh): 13 more packages, 48 MB to download, 279 MB installed (Debian 12).
#   `make demo` does not need them.
set -euo pipefail
PKGS=(cmake make g++ pkg-config libopenmpi-dev openmpi-bin libhdf5-dev libspdlog-dev libcli11-dev
      libtomlplusplus-dev doctest-dev libopenblas-openmp-dev nlohmann-json3-dev
      libsentencepiece-dev libpcre2-dev libdnnl-dev zlib1g-dev)
# With a CUDA toolkit, the configure fetches cudnn-frontend's headers with pip (cuDNN attention).
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  PKGS+=(python3-pip)
fi
if [ "${1:-}" = "--test" ]; then
  PKGS+=(clang-14 libclang-rt-14-dev libfmt-dev)
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
