#!/usr/bin/env bash
# Load test (issue 6): N short jobs (default 10,000) through `voxbatch enqueue` and two workers with
# the tiny model, against the real services. Checks: no loss (N done rows, N objects), the queue
# drains; reports enqueue rate, processing rate, and each worker's RSS at start and end.
# Writes bench/results/load-<timestamp>.json. Uses its own queues, database and key prefix, and
# removes them afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
N=${N:-10000}
ID=load_$(date +%s)
BIN=target/debug/voxbatch
dev_binary
export VOXBATCH_AMQP__EXCHANGE="vbt-$ID" VOXBATCH_AMQP__QUEUE="vbt-$ID.jobs" \
  VOXBATCH_AMQP__DEAD_LETTER_EXCHANGE="vbt-$ID.dlx" VOXBATCH_AMQP__DEAD_LETTER_QUEUE="vbt-$ID.jobs.dead" \
  DATABASE_URL="postgres://postgres@127.0.0.1:5432/vbt_$ID" VOXBATCH_STORAGE__KEY_PREFIX="vbt-$ID/" \
  VOXBATCH_BATCHING__MAX_BATCH=32 VOXBATCH_MODEL__CPU_THREADS=1 RUST_LOG=warn
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$N" > "$tmp/jobs.txt" <<'PY'
import random, sys
random.seed(5)
words = "the quick brown fox jumps over a lazy dog while seven bright lamps glow".split()
for i in range(int(sys.argv[1])):
    print(" ".join(random.choice(words) for _ in range(random.randint(2, 5))))
PY
$BIN migrate >/dev/null
t0=$(date +%s.%N)
$BIN enqueue "$tmp/jobs.txt" --campaign load
t1=$(date +%s.%N)
rss() { awk '/VmRSS/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
$BIN work --drain --worker-id "$ID-a" > "$tmp/a.log" 2>&1 & A=$!
$BIN work --drain --worker-id "$ID-b" > "$tmp/b.log" 2>&1 & B=$!
sleep 5
a0=$(rss $A); b0=$(rss $B)
aN=$a0; bN=$b0
while kill -0 $A 2>/dev/null || kill -0 $B 2>/dev/null; do
  a=$(rss $A); b=$(rss $B); [ "${a:-0}" -gt 0 ] && aN=$a; [ "${b:-0}" -gt 0 ] && bN=$b
  sleep 1
done
wait $A; ra=$?; wait $B; rb=$?
t2=$(date +%s.%N)
done_rows=$(psql -h 127.0.0.1 -U postgres -d "vbt_$ID" -Atc "SELECT count(*) FROM jobs WHERE status = 'done'")
audio=$(psql -h 127.0.0.1 -U postgres -d "vbt_$ID" -Atc "SELECT round(sum(audio_seconds)::numeric, 1) FROM jobs")
span=$(psql -h 127.0.0.1 -U postgres -d "vbt_$ID" -Atc "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM batches")
status=$($BIN status)
keys=$($BIN audit --campaign load --format json | python3 -c 'import json,sys; a=json.load(sys.stdin); print(a["objects"] if not a["missing_objects"] else -1)')
mkdir -p bench/results
out=bench/results/load-$(date -u +%Y%m%dT%H%M%SZ).json
python3 - "$N" "$t0" "$t1" "$t2" "$done_rows" "$keys" "$audio" "$span" "$a0" "$aN" "$b0" "$bN" "$ra" "$rb" > "$out" <<'PY'
import json, sys
n, t0, t1, t2, done, keys, audio, span, a0, aN, b0, bN, ra, rb = sys.argv[1:]
n = int(n); t0, t1, t2 = float(t0), float(t1), float(t2)
print(json.dumps({
  "jobs": n, "done_rows": int(done), "objects_audited": int(keys), "audio_seconds": float(audio),
  "enqueue_seconds": round(t1 - t0, 3), "enqueue_jobs_per_s": round(n / (t1 - t0), 1),
  "processing_seconds": round(t2 - t1, 3), "processing_jobs_per_s": round(n / (t2 - t1), 1),
  "batches_span_seconds": float(span),
  "worker_a_rss_kib": {"start": int(a0), "end": int(aN)}, "worker_b_rss_kib": {"start": int(b0), "end": int(bN)},
  "worker_exit_codes": [int(ra), int(rb)]}, indent=1))
PY
cat "$out"
echo "$status" | head -3
# Clean up the test's database, queues and objects (through the SeaweedFS filer that bootstrap starts).
psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS \"vbt_$ID\" WITH (FORCE)"
rabbitmqctl -q delete_queue "vbt-$ID.jobs" >/dev/null 2>&1 || true
rabbitmqctl -q delete_queue "vbt-$ID.jobs.dead" >/dev/null 2>&1 || true
curl -s -X DELETE "http://127.0.0.1:18888/buckets/voxbatch/vbt-$ID/?recursive=true" >/dev/null || true
[ "$done_rows" = "$N" ] && [ "$keys" = "$N" ] || { echo "LOSS: $done_rows done, $keys objects of $N"; exit 1; }
echo "load test: $N jobs, none lost"
