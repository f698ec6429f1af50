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

# The fault tests stop and restart the services and mostly wait (5 tests, ≈ 110 s of wall at a
# fraction of a core): beside them run the tests that need no service and compute (the Inductor
# listings and compiles, the converter, the parity tests against the reference's fixtures, the
# model-only synthesis and benches, the house rules), and the unit tests: 67 tests, which took
# 31 s off the first run (209 → 179 s) and added 20 s to this one's (110 → 130 s; 2026-12-07).
# VOXBATCH_TEST_SERVICES=none makes a test of this set that reaches for a service through
# `test_config` fail (tests/integration/common).
BESIDE_FAULTS='test(/^(compiled|cosyvoice3_compiled|converter|cosyvoice2_parity|cosyvoice3_parity|cosyvoice2_llm_parity|cosyvoice3_llm_parity|cosyvoice2_tts|cosyvoice3_tts|voice|house_rules|bench)::/)'

sweep
status=0
# 0. deploy/ validated offline (schemas, lint, cross-references): seconds.
[ "${FAULTS:-run}" = only ] || scripts/validate-deploy.sh || status=$?
# 1. The integration tests, in parallel (nextest: a process each). 2. The fault-injection tests
# (they restart RabbitMQ and Postgres and stop SeaweedFS), one at a time, and beside them the
# tests above and the unit tests — the library's and the binary's, in one process each (libtest's
# threads): 162 tests in 2 s, where a process each costs libtorch's start, ≈ 0.5 CPU-s, 162 times.
# FAULTS=only runs just the fault tests; FAULTS=skip skips them. Arguments (a filter of one's own)
# select from the whole suite, as one nextest run, instead of 1 and the unit tests.
FAULTS=${FAULTS:-run}
if cargo nextest --version >/dev/null 2>&1; then
  if [ "$FAULTS" != only ]; then
    if [ $# -gt 0 ]; then
      cargo nextest run --profile suite --no-fail-fast "$@" || status=$?
    else
      cargo nextest run --profile suite --no-fail-fast --test integration -E "not ($BESIDE_FAULTS)" || status=$?
    fi
  fi
  fault_pid=
  if [ "$FAULTS" != skip ]; then
    cargo nextest run --no-fail-fast --test integration --run-ignored only --test-threads 1 -E 'test(/^faults::/)' &
    fault_pid=$!
  fi
  if [ "$FAULTS" != only ] && [ $# -eq 0 ]; then
    cargo test --quiet --no-fail-fast --lib --bins -- --test-threads 2 || status=$?
    VOXBATCH_TEST_SERVICES=none cargo nextest run --profile suite --no-fail-fast --test integration -E "$BESIDE_FAULTS" || status=$?
  fi
  if [ -n "$fault_pid" ]; then wait "$fault_pid" || status=$?; fi
else
  [ "$FAULTS" = only ] || cargo test --no-fail-fast "$@" || status=$?
  [ "$FAULTS" = skip ] || cargo test --no-fail-fast --test integration -- --ignored --test-threads 1 faults:: || status=$?
fi
sweep
exit $status
