#!/usr/bin/env bash
# The documentation stays true to the binary:
#  - docs/cli.md is the binary's own --help (scripts/update_readme.sh): fail when a flag or default
#    changed without it;
#  - docs/migrating.md's TRL and OpenRLHF tables list every name of app/trl_names.cpp and
#    app/openrlhf_names.cpp;
#  - every --flag named in README.md and docs/*.md exists, and every relative link resolves
#    (scripts/check_docs.py).
# Usage: readme.sh <rlhf binary> <source dir>
set -u
RLHF=$1
SRC=$2
want=$(bash "$SRC/scripts/update_readme.sh" --print "$RLHF")
have=$(cat "$SRC/docs/cli.md")
if [ "$want" != "$have" ]; then
  diff <(echo "$have") <(echo "$want") | head -20
  echo "FAIL: docs/cli.md is stale; run scripts/update_readme.sh build/rlhf"
  exit 1
fi
for name in $(grep -oE '^    \{"[a-z_0-9]+",' "$SRC/app/trl_names.cpp" | grep -oE '[a-z_0-9]+'); do
  grep -q "^| \`$name\` |" "$SRC/docs/migrating.md" || {
    echo "FAIL: docs/migrating.md's TRL table lacks $name (app/trl_names.cpp)"
    exit 1
  }
done
for name in $(grep -oE '^    [A-Z_]+\("[a-z_0-9.]+"' "$SRC/app/openrlhf_names.cpp" | grep -oE '"[a-z_0-9.]+"' | tr -d '"'); do
  grep -qF "| \`--$name\` |" "$SRC/docs/migrating.md" || {
    echo "FAIL: docs/migrating.md's OpenRLHF table lacks --$name (app/openrlhf_names.cpp)"
    exit 1
  }
done
python3 "$SRC/scripts/check_docs.py" "$RLHF" "$SRC" || exit 1
echo PASS
