#!/usr/bin/env bash
# `make test-cluster`: starts the local 3-node RabbitMQ cluster (scripts/cluster.sh), runs
# tests/integration/cluster.rs one test at a time against it (and the ordinary Postgres and SeaweedFS), and
# stops the cluster whatever happened. The machine's own broker on 5672 is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh
trap 'scripts/cluster.sh stop || true' EXIT
scripts/cluster.sh start
started=$(date +%s)
status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast --test integration --run-ignored only --test-threads 1 --no-capture -E 'test(/^cluster::/)' || status=$?
else
  cargo test --no-fail-fast --test integration -- --ignored --test-threads 1 --nocapture cluster:: || status=$?
fi
echo "test-cluster: $(( $(date +%s) - started )) s (exit $status)"
exit $status
