#!/usr/bin/env bash
# Stops the SeaweedFS started by bootstrap.sh: SIGTERM, then SIGKILL after a timeout (it can
# ignore SIGTERM for a while).
set -u
cd "$(dirname "$0")/.."
pidfile=.run/seaweedfs.pid
[ -f "$pidfile" ] || { echo "no $pidfile"; exit 0; }
pid=$(cat "$pidfile")
kill -TERM "$pid" 2>/dev/null || { rm -f "$pidfile"; exit 0; }
for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
rm -f "$pidfile"
echo "stopped SeaweedFS ($pid)"
