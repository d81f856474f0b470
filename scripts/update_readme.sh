#!/usr/bin/env bash
# Regenerates the README section between "<!-- BEGIN FLAGS -->" and "<!-- END FLAGS -->" from the
# binary's own --help, so the README lists every subcommand and flag with its default.
# Usage: scripts/update_readme.sh [rlhf binary] [README path]    (--print: write the section to stdout)
set -euo pipefail
print_only=0
if [ "${1:-}" = "--print" ]; then print_only=1; shift; fi
RLHF=${1:-build/rlhf}
README=${2:-README.md}
section() {
  echo '```'
  "$RLHF" --help
  echo '```'
  for cmd in sft rm grpo ppo generate eval score export import bench; do
    echo
    echo "#### \`rlhf $cmd\`"
    echo
    echo '```'
    "$RLHF" "$cmd" --help
    echo '```'
  done
}
if [ $print_only -eq 1 ]; then section; exit 0; fi
tmp=$(mktemp)
section > "$tmp"
awk -v f="$tmp" '
  /<!-- BEGIN FLAGS -->/ { print; while ((getline line < f) > 0) print line; skip = 1; next }
  /<!-- END FLAGS -->/ { skip = 0 }
  !skip { print }' "$README" > "$README.new"
mv "$README.new" "$README"
rm -f "$tmp"
