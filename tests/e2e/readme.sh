#!/usr/bin/env bash
# The documentation stays true to the binary:
#  - docs/cli.md is the binary's own --help (scripts/update_readme.sh): fail when a flag or default
#    changed without it;
#  - docs/migrating.md's TRL table lists every name of app/trl_names.cpp, and its OpenRLHF table
#    is scripts/make_openrlhf_table.py's rendering of app/openrlhf_names.cpp;
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
want=$(python3 "$SRC/scripts/make_openrlhf_table.py" "$SRC")
have=$(sed -n '/^| OpenRLHF | rlhf |/,/^$/p' "$SRC/docs/migrating.md" | sed '1,2d;/^$/d')
if [ "$want" != "$have" ]; then
  diff <(echo "$have") <(echo "$want") | head -10
  echo "FAIL: docs/migrating.md's OpenRLHF table is stale (app/openrlhf_names.cpp); regenerate its rows with scripts/make_openrlhf_table.py"
  exit 1
fi
python3 "$SRC/scripts/check_docs.py" "$RLHF" "$SRC" || exit 1
echo PASS
