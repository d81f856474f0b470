# Helpers the e2e scripts source (this folder is not a test: ctest runs tests/e2e/*.sh only).

# same_metrics A B: metrics.jsonl files A and B hold the same records, key by key, except the
# timings and the machine-dependent figures (*_s, *per_s*, *GBps*, mfu, *peak_rss_bytes, the
# sleeping engines' sleep_*); prints the first difference and fails.
same_metrics() {
  python3 - "$1" "$2" <<'PYEOF'
import json, sys
def load(p):
    out = []
    for l in open(p):
        r = json.loads(l)
        out.append({k: v for k, v in r.items()
                    if not (k.endswith("_s") or "per_s" in k or "GBps" in k or k == "mfu"
                            or k.endswith("peak_rss_bytes") or k.startswith("sleep_"))})
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
if len(a) != len(b):
    print(f"{len(a)} vs {len(b)} records")
    sys.exit(1)
for x, y in zip(a, b):
    if x != y:
        diff = {k: (x.get(k), y.get(k)) for k in set(x) | set(y) if x.get(k) != y.get(k)}
        print(f"step {x.get('step')}: {diff}")
        sys.exit(1)
PYEOF
}

# fp LOG: the last "weights fingerprint" a run printed in LOG.
fp() { grep -o "weights fingerprint [0-9a-f]*" "$1" | tail -1 | awk '{ print $3 }'; }

# copy_ckpt FROM K TO: copies checkpoint step K from folder FROM into folder TO (made if missing):
# step_K.h5 and, for a sharded checkpoint (--ckpt_format sharded, or auto with several training
# ranks), its shard folder step_K_shards/.
copy_ckpt() {
  mkdir -p "$3" || return 1
  cp "$1/step_$2.h5" "$3/" || return 1
  if [ -d "$1/step_$2_shards" ]; then cp -r "$1/step_$2_shards" "$3/" || return 1; fi
}
