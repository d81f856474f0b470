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
# Usage: scripts/gpu_bundle.sh <build dir> <out dir>   (writes <out dir>/rlhf-gpu.tar.xz)
set -euo pipefail
BUILD=$1
OUT=$2
OMPI_COMPONENTS=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/rlhf-gpu/bin" "$STAGE/rlhf-gpu/lib" "$STAGE/rlhf-gpu/lib-fallback" \
  "$STAGE/rlhf-gpu/openmpi"
for b in rlhf rlhf_tests rlhf_mpi_tests; do
  [ -x "$BUILD/$b" ] || { echo "gpu_bundle: $BUILD/$b is not built" >&2; exit 1; }
  cp "$BUILD/$b" "$STAGE/rlhf-gpu/bin/"
done
cp "$OMPI_COMPONENTS"/*.so "$STAGE/rlhf-gpu/openmpi/"
# cuDNN attention needs cuDNN and the cudnn-frontend headers at configure time (PyPI access):
# the configure prints "✓ cudnn-frontend"; without it the cuDNN checks of gpu_check.sh skip.
if ! ldd "$BUILD/rlhf" | grep -q libcudnn; then
  echo "gpu_bundle: warning: $BUILD/rlhf is built without cuDNN attention (see its configure" \
    "output for the ✗ line); gpu_check.sh's cuDNN cases will skip" >&2
fi
# glibc's own libraries come from the machine; NVIDIA's are the machine's (they must match its
# driver); libstdc++/libgcc_s go to lib-fallback, used only if the machine's are older.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libcublas|libcublasLt|libnccl|libcudnn.*|libnvidia.*)\.so'
fallback='^(libstdc\+\+|libgcc_s)\.so'
{
  ldd "$BUILD"/rlhf "$BUILD"/rlhf_tests "$BUILD"/rlhf_mpi_tests
  for c in "$OMPI_COMPONENTS"/*.so; do ldd "$c"; done
} | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
  if [[ $name =~ $skip ]]; then continue; fi
  if [[ $name =~ $fallback ]]; then
    cp -L "$path" "$STAGE/rlhf-gpu/lib-fallback/$name"
  else
    cp -L "$path" "$STAGE/rlhf-gpu/lib/$name"
  fi
done
mkdir -p "$OUT"
tar -C "$STAGE" -cf - rlhf-gpu | xz -T0 -6 > "$OUT/rlhf-gpu.tar.xz"
du -h "$OUT/rlhf-gpu.tar.xz"
