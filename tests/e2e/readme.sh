#!/usr/bin/env bash
# The README's flag reference is the binary's own --help (scripts/update_readme.sh): fail when a
# flag or default changed without the README.
# Usage: readme.sh <rlhf binary> <source dir>
set -u
RLHF=$1
SRC=$2
want=$(bash "$SRC/scripts/update_readme.sh" --print "$RLHF")
have=$(awk '/<!-- BEGIN FLAGS -->/ { on = 1; next } /<!-- END FLAGS -->/ { on = 0 } on' "$SRC/README.md")
if [ "$want" != "$have" ]; then
  diff <(echo "$have") <(echo "$want") | head -20
  echo "FAIL: README.md flag reference is stale; run scripts/update_readme.sh build/rlhf"
  exit 1
fi
# The README's TRL table lists every TRL name of app/trl_names.cpp.
for name in $(grep -oE '^    \{"[a-z_0-9]+",' "$SRC/app/trl_names.cpp" | grep -oE '[a-z_0-9]+'); do
  grep -q "^| \`$name\` |" "$SRC/README.md" || {
    echo "FAIL: README.md's TRL table lacks $name (app/trl_names.cpp)"
    exit 1
  }
done
echo PASS
