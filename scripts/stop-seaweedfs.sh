#!/usr/bin/env bash
# Stops the SeaweedFS started by bootstrap.sh: SIGTERM, then SIGKILL after a timeout (it can
# ignore SIGTERM for a while). Where this checkout started none but another did — a clean clone
# (CI's `.ci/run`, a from-nothing measurement) beside a working checkout whose SeaweedFS serves
# 127.0.0.1:8333 — that one is stopped, and its checkout's root written to .run/seaweedfs.adopted,
# so that scripts/start-seaweedfs.sh starts it again as it was (its data, its pid file). Without
# this the S3 outage fault test of such a clone stopped nothing (2026-12-06: 30 of 30 jobs done
# "while S3 was down").
set -u
cd "$(dirname "$0")/.."
pidfile=.run/seaweedfs.pid
if [ ! -f "$pidfile" ]; then
  pid=$(ss -ltnpH 'sport = :8333' 2>/dev/null | grep -o 'pid=[0-9]*' | head -n1 | cut -d= -f2)
  if [ -z "$pid" ] || [ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")" != weed ]; then
    echo "no $pidfile, and no SeaweedFS listens on 127.0.0.1:8333"
    exit 0
  fi
  # start-seaweedfs.sh starts weed from its checkout's root: the process's working directory.
  owner=$(readlink -f "/proc/$pid/cwd")
  mkdir -p .run && echo "$owner" > .run/seaweedfs.adopted
  pidfile=$owner/.run/seaweedfs.pid
  echo "$pid" > "$pidfile"
fi
pid=$(cat "$pidfile")
kill -TERM "$pid" 2>/dev/null || { rm -f "$pidfile"; exit 0; }
for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
# Gone before this returns, so that a start right after it finds the port closed (a start 0.004 s
# after a SIGKILL found it still open and started nothing).
for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
rm -f "$pidfile"
echo "stopped SeaweedFS ($pid)"
