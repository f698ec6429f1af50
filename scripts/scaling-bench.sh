#!/usr/bin/env bash
# docs/SCALING.md's measurements on this machine (issue 18): the shared services' ceilings that a
# fleet of GPU workers meets, each with voxbatch's shapes.
#   1. RabbitMQ: tools/bench_broker.py (quorum queue, persistent messages, confirms; consumers with
#      prefetch and per-message acks), and `voxbatch enqueue` of 20,000 jobs (its confirm window).
#   2. Postgres: pgbench running one transaction per committed batch — a batches row and the
#      64 job rows it finishes (as db/batches.rs `complete_batch` does) — at 1, 4 and 8 clients.
# Writes bench/results/<date>-scaling.json. Uses its own queue, database and tables; removes them.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
dev_binary
OUT=bench/results/$(date -u +%F)-scaling.json
tmp=$(mktemp -d)
DB=vbt_scaling_$$
ID=scaling_$$
cleanup() {
  rm -rf "$tmp"
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $DB" > /dev/null 2>&1 || true
  rabbitmqctl -q delete_queue "vbt-$ID.jobs" > /dev/null 2>&1 || true
  rabbitmqctl -q delete_queue "vbt-$ID.jobs.dead" > /dev/null 2>&1 || true
  for x in "vbt-$ID" "vbt-$ID.dlx" "vbt-$ID.events"; do
    rabbitmqctl -q eval "rabbit_exchange:delete(rabbit_misc:r(<<\"/\">>, exchange, <<\"$x\">>), false, <<\"voxbatch\">>)." > /dev/null 2>&1 || true
  done
}
trap cleanup EXIT

.venv/bin/python -c "import pika" 2> /dev/null || .venv/bin/pip install -q --disable-pip-version-check pika==1.3.2
echo "[scaling] broker: publish with confirms, deliver + ack"
broker=$(.venv/bin/python tools/bench_broker.py --messages 20000 --consumers 2)
echo "$broker"

echo "[scaling] voxbatch enqueue: 20,000 jobs"
python3 -c "
for i in range(20000): print(f'line {i}: the quick brown fox jumps over the lazy dog')" > "$tmp/jobs.txt"
export VOXBATCH_AMQP__EXCHANGE="vbt-$ID" VOXBATCH_AMQP__QUEUE="vbt-$ID.jobs" VOXBATCH_AMQP__DEAD_LETTER_EXCHANGE="vbt-$ID.dlx" \
  VOXBATCH_AMQP__DEAD_LETTER_QUEUE="vbt-$ID.jobs.dead" VOXBATCH_AMQP__EVENTS_EXCHANGE="vbt-$ID.events" \
  DATABASE_URL="postgres://postgres@127.0.0.1:5432/$DB" VOXBATCH_STORAGE__KEY_PREFIX="vbt-$ID/" RUST_LOG=warn
target/debug/voxbatch migrate > /dev/null
t0=$(date +%s.%N)
target/debug/voxbatch enqueue "$tmp/jobs.txt" --campaign scaling > /dev/null
t1=$(date +%s.%N)
enqueue_per_s=$(python3 -c "print(round(20000 / ($t1 - $t0)))")
echo "enqueue: $enqueue_per_s jobs/s"

echo "[scaling] postgres: one transaction per 64-job batch"
psql -h 127.0.0.1 -U postgres -d "$DB" -q <<'SQL'
CREATE TABLE scale_jobs (id bigint PRIMARY KEY, job_id uuid NOT NULL DEFAULT gen_random_uuid(), status text NOT NULL,
  s3_key text, audio_seconds float8, audio_sha256 text, segments int, finished_at timestamptz, text text NOT NULL);
INSERT INTO scale_jobs (id, status, text) SELECT g, 'running', repeat('x', 120) FROM generate_series(1, 1000000) g;
CREATE TABLE scale_batches (batch_id uuid PRIMARY KEY, worker_id text, model text, device text, precision text,
  batch_size int, tokens int, padded_tokens int, audio_seconds float8, started_at timestamptz, finished_at timestamptz,
  infer_ms float8, encode_ms float8, upload_ms float8, db_ms float8, energy_j float8, cost_usd float8, kernels text);
VACUUM ANALYZE;
SQL
cat > "$tmp/batch.sql" <<'SQL'
\set lo random(1, 999936)
BEGIN;
INSERT INTO scale_batches VALUES (gen_random_uuid(), 'host-1-w', 'cosyvoice2', 'cuda:0', 'bf16', 64, 16000, 17000, 640.0,
  now(), now(), 1200, 40, 90, 5, 300, 0.002, 'compiled');
UPDATE scale_jobs SET status = 'done', s3_key = 'c/' || job_id || '.opus', audio_seconds = 10, audio_sha256 = md5(id::text),
  segments = 1, finished_at = now() WHERE id BETWEEN :lo AND :lo + 63;
COMMIT;
SQL
pg='{}'
for c in 1 4 8; do
  tps=$(pgbench -h 127.0.0.1 -U postgres -n -c "$c" -j 2 -T 15 -f "$tmp/batch.sql" "$DB" 2>/dev/null | awk '/^tps/{print int($3)}')
  echo "postgres: $c clients: $tps batch commits/s ($((tps * 64)) job rows/s)"
  pg=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['$c']=$tps; print(json.dumps(d))" "$pg")
done
python3 - "$OUT" "$broker" "$enqueue_per_s" "$pg" <<'PY'
import json, platform, subprocess, sys, datetime
out, broker, enq, pg = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
rmq = subprocess.run(["rabbitmqctl", "-q", "version"], capture_output=True, text=True).stdout.strip()
pgv = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-Atc", "SHOW server_version"], capture_output=True, text=True).stdout.strip()
json.dump({"date": datetime.datetime.utcnow().isoformat() + "Z", "machine": f"{platform.node()}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores",
           "rabbitmq": rmq, "postgres": pgv, "broker": broker, "voxbatch_enqueue_jobs_per_s": enq,
           "postgres_batch_commits_per_s_by_clients": pg, "jobs_per_batch": 64}, open(out, "w"), indent=2)
print(f"wrote {out}")
PY
