#!/usr/bin/env bash
# Runs the test suite against the real services (bootstrap.sh has started them).
# Leftovers of earlier crashed runs (queues and databases named vbt…) are swept first and after.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/env.sh
source scripts/env.sh

sweep() {
  # Test queues and exchanges: vbt-<id>…
  if command -v rabbitmqctl >/dev/null; then
    for q in $(rabbitmqctl -q list_queues name 2>/dev/null | grep '^vbt-' || true); do
      rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1 || true
    done
    for x in $(rabbitmqctl -q list_exchanges name 2>/dev/null | grep '^vbt-' || true); do
      rabbitmqctl -q eval "rabbit_exchange:delete(rabbit_misc:r(<<\"/\">>, exchange, <<\"$x\">>), false, <<\"voxbatch-tests\">>)." >/dev/null 2>&1 || true
    done
  fi
  # Test databases: vbt_<id>
  for d in $(psql -h 127.0.0.1 -U postgres -d postgres -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'vbt\_%'" 2>/dev/null || true); do
    psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE IF EXISTS \"$d\" WITH (FORCE)" >/dev/null 2>&1 || true
  done
}

# One libtorch (OpenMP) thread per test process: nextest runs the tests side by side, and each
# process's default of a thread per core had them spin against each other on the two cores — the
# 293 tests took 373.9 s with it and 301.9 s without (2026-12-06; 36 model tests: 56.4 s → 16.9 s).
# (Four tests at a time on the two cores: 268.1 s and 320.8 s in two runs — no clear gain. The
# profile `suite`, .config/nextest.toml, runs four only where tests that mostly wait are among them.)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

sweep
status=0
# 0. deploy/ validated offline (schemas, lint, cross-references): seconds.
[ "${FAULTS:-run}" = only ] || scripts/validate-deploy.sh || status=$?
# 1. Everything that can run in parallel. 2. The fault-injection tests (they restart RabbitMQ and
# Postgres and stop SeaweedFS), one at a time. FAULTS=only runs just those; FAULTS=skip skips them.
FAULTS=${FAULTS:-run}
if cargo nextest --version >/dev/null 2>&1; then
  [ "$FAULTS" = only ] || cargo nextest run --profile suite --no-fail-fast "$@" || status=$?
  [ "$FAULTS" = skip ] || cargo nextest run --no-fail-fast --test integration --run-ignored only --test-threads 1 -E 'test(/^faults::/)' || status=$?
else
  [ "$FAULTS" = only ] || cargo test --no-fail-fast "$@" || status=$?
  [ "$FAULTS" = skip ] || cargo test --no-fail-fast --test integration -- --ignored --test-threads 1 faults:: || status=$?
fi
sweep
exit $status
