#!/usr/bin/env bash
# Regenerates the CLI reference, docs/cli.md, from the binary's own --help: every subcommand and
# flag with its default (tests/e2e/readme.sh fails when it is stale).
# Usage: scripts/update_readme.sh [rlhf binary] [output path]    (--print: write it to stdout)
set -euo pipefail
print_only=0
if [ "${1:-}" = "--print" ]; then print_only=1; shift; fi
RLHF=${1:-build/rlhf}
OUT=${2:-docs/cli.md}
section() {
  echo '# CLI reference: every subcommand and flag'
  echo
  echo 'Generated from the binary'"'"'s `--help` by `scripts/update_readme.sh` (a test fails when it is'
  echo 'stale). Flags can also be given as keys of a `--config` TOML file. OpenRLHF'"'"'s namespaced names'
  echo 'are listed under the flag they set ("also ..."); [migrating.md](migrating.md) has the full table.'
  echo
  echo '```'
  "$RLHF" --help
  echo '```'
  for cmd in sft rm grpo ppo generate eval score export import bench; do
    echo
    echo "## \`rlhf $cmd\`"
    echo
    echo '```'
    "$RLHF" "$cmd" --help
    echo '```'
  done
}
if [ $print_only -eq 1 ]; then section; exit 0; fi
section > "$OUT.new"
mv "$OUT.new" "$OUT"
