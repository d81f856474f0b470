#!/usr/bin/env bash
# Packs a CUDA build for a bare GPU machine that has the NVIDIA driver, cuBLAS, cuDNN and NCCL but
# none of this project's other libraries (MPI, HDF5, OpenBLAS, spdlog, ...): the binaries, every
# shared library they and Open MPI's components load that is not glibc, libstdc++ or an NVIDIA
# library, and Open MPI's components, into one .tar.xz that scripts/gpu_check.sh unpacks.
#
# Build first, for the GPU machine's chip and a portable CPU level, e.g. for H100/H200:
#   cmake -S . -B build-gpu -G Ninja -DRLHF_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
#     -DCMAKE_C_FLAGS=-march=x86-64-v3 -DRLHF_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
#     -DRLHF_CUDA_EMU=OFF && ninja -C build-gpu rlhf rlhf_tests rlhf_mpi_tests
# The same script packs a CPU-only build (RLHF_CUDA=OFF) for gpu_check.sh's amx step, which
# measures the GPU machine's own CPU; build it for that CPU, e.g. a Xeon with AMX:
#   cmake -S . -B build-amx -DRLHF_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=sapphirerapids \
#     -DCMAKE_C_FLAGS=-march=sapphirerapids -DRLHF_CUDA=OFF -DRLHF_CUDA_EMU=OFF \
#     -DCMAKE_BUILD_TYPE=Release && cmake --build build-amx -j --target rlhf
#   scripts/gpu_bundle.sh build-amx .gpu rlhf-cpu rlhf-gpu   (beside rlhf-gpu.tar.xz)
# Usage: scripts/gpu_bundle.sh <build dir> <out dir> [name [libs from]]
#   (writes <out dir>/<name>.tar.xz, default name rlhf-gpu; the test binaries are optional).
#   With [libs from] (the name of another bundle unpacked beside this one, as gpu_check.sh does in
#   /tmp) only the stripped binaries travel and the libraries are that bundle's: ~2 MB instead of
#   ~27 MB, so both bundles fit in one 64 MiB upload. The libraries must cover this build's.
set -euo pipefail
BUILD=$1
OUT=$2
NAME=${3:-rlhf-gpu}
OMPI_COMPONENTS=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
D=$STAGE/$NAME
mkdir -p "$D/bin"
[ -x "$BUILD/rlhf" ] || { echo "gpu_bundle: $BUILD/rlhf is not built" >&2; exit 1; }
BINS=()
for b in rlhf rlhf_tests rlhf_mpi_tests; do
  [ -x "$BUILD/$b" ] || continue
  cp "$BUILD/$b" "$D/bin/"
  BINS+=("$BUILD/$b")
done
# pack_libraries: Open MPI's components and every library the binaries load that a bare GPU
# machine lacks, into the bundle.
pack_libraries() {
  mkdir -p "$D/lib" "$D/lib-fallback" "$D/openmpi"
  cp "$OMPI_COMPONENTS"/*.so "$D/openmpi/"
  # cuDNN attention needs cuDNN and the cudnn-frontend headers at configure time (PyPI access):
  # the configure prints "✓ cudnn-frontend"; without it the cuDNN checks of gpu_check.sh skip.
  if ldd "$BUILD/rlhf" | grep -q libcublas && ! ldd "$BUILD/rlhf" | grep -q libcudnn; then
    echo "gpu_bundle: warning: $BUILD/rlhf is built without cuDNN attention (see its configure" \
      "output for the ✗ line); gpu_check.sh's cuDNN cases will skip" >&2
  fi
  # glibc's own libraries come from the machine; NVIDIA's are the machine's (they must match its
  # driver); libstdc++/libgcc_s go to lib-fallback, used only if the machine's are older.
  skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libcublas|libcublasLt|libnccl|libcudnn.*|libnvidia.*)\.so'
  fallback='^(libstdc\+\+|libgcc_s)\.so'
  {
    ldd "${BINS[@]}"
    for c in "$OMPI_COMPONENTS"/*.so; do ldd "$c"; done
  } | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
    if [[ $name =~ $skip ]]; then continue; fi
    if [[ $name =~ $fallback ]]; then
      cp -L "$path" "$D/lib-fallback/$name"
    else
      cp -L "$path" "$D/lib/$name"
    fi
  done
}
if [ -n "${4:-}" ]; then  # binaries alone; the other bundle's libraries, by relative links
  for d in lib lib-fallback openmpi; do ln -s "../$4/$d" "$D/$d"; done
  strip "$D"/bin/*
else
  pack_libraries
fi
mkdir -p "$OUT"
tar -C "$STAGE" -cf - "$NAME" | xz -T0 -6 > "$OUT/$NAME.tar.xz"
du -h "$OUT/$NAME.tar.xz"
