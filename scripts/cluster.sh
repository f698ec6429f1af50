#!/usr/bin/env bash
# A local 3-node RabbitMQ cluster for `make test-cluster` (issue 18): Debian's rabbitmq-server,
# three nodes on this machine with their own ports, data and logs under .run/cluster, joined into
# one cluster; the machine's own broker (5672) is not touched. Every node is stopped by pid.
#
#   scripts/cluster.sh start              # nodes vbc1..3 on AMQP ports 5681..5683
#   scripts/cluster.sh urls               # their amqp:// URLs, comma-separated
#   scripts/cluster.sh leader QUEUE       # the node (1..3) leading a quorum queue
#   scripts/cluster.sh kill N             # SIGKILL node N's Erlang VM (a crash, no goodbye)
#   scripts/cluster.sh stop-node N        # stop node N cleanly
#   scripts/cluster.sh start-node N       # start node N again (it rejoins with its data)
#   scripts/cluster.sh status             # cluster_status from node 1
#   scripts/cluster.sh stop               # stop all three, remove .run/cluster
set -euo pipefail
cd "$(dirname "$0")/.."
D=${CLUSTER_DIR:-$PWD/.run/cluster}
H=$(hostname -s)
BASE_PORT=${CLUSTER_BASE_PORT:-5680}
RMQ=/usr/lib/rabbitmq/bin
log() { printf '[cluster] %s\n' "$*" >&2; }
node() { echo "vbc$1@$H"; }
port() { echo $((BASE_PORT + $1)); }
ctl() { local n=$1; shift; HOME="$D" "$RMQ/rabbitmqctl" -q -n "$(node "$n")" "$@"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_node() {
  local i=$1 n="$D/n$1"
  mkdir -p "$n"
  if port_open "$(port "$i")"; then log "node $i already up"; return 0; fi
  cat > "$n/rabbitmq.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$(port "$i")
loopback_users.guest = true
disk_free_limit.absolute = 100MB
vm_memory_high_watermark.relative = 0.2
log.file.level = warning
CONF
  HOME="$D" RABBITMQ_NODENAME="$(node "$i")" RABBITMQ_NODE_PORT="$(port "$i")" RABBITMQ_DIST_PORT=$(( $(port "$i") + 20000 )) \
    RABBITMQ_MNESIA_BASE="$n/mnesia" RABBITMQ_LOG_BASE="$n/log" RABBITMQ_CONFIG_FILE="$n/rabbitmq" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$D/enabled_plugins" \
    setsid "$RMQ/rabbitmq-server" >> "$n/server.out" 2>&1 < /dev/null &
  echo $! > "$n/server.pid"
  ctl "$i" await_startup --timeout 60 > /dev/null 2>&1 || ctl "$i" wait --timeout 60 "$n/mnesia/$(node "$i").pid" > /dev/null 2>&1 \
    || { log "node $i did not start"; tail -20 "$n/server.out" >&2; return 1; }
  ctl "$i" eval 'os:getpid().' | tr -d '"' > "$n/beam.pid"
  log "node $i up: $(node "$i") on port $(port "$i") (beam pid $(cat "$n/beam.pid"))"
}

stop_node() {
  local i=$1 n="$D/n$1"
  [ -f "$n/server.pid" ] || return 0
  ctl "$i" stop > /dev/null 2>&1 || true
  for pid in $(cat "$n/server.pid" "$n/beam.pid" 2>/dev/null); do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for _ in $(seq 1 40); do port_open "$(port "$i")" || break; sleep 0.25; done
  for pid in $(cat "$n/server.pid" "$n/beam.pid" 2>/dev/null); do kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; done
  rm -f "$n/server.pid" "$n/beam.pid"
}

case "${1:-}" in
  start)
    mkdir -p "$D"
    [ -f "$D/.erlang.cookie" ] || { head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' > "$D/.erlang.cookie"; chmod 400 "$D/.erlang.cookie"; }
    echo '[].' > "$D/enabled_plugins"
    for i in 1 2 3; do start_node "$i"; done
    for i in 2 3; do
      if ! ctl 1 cluster_status --formatter json 2>/dev/null | grep -q "$(node "$i")\"\]\?\(,\|\]\).*running\|\"running_nodes\":\[[^]]*$(node "$i")"; then
        ctl "$i" stop_app > /dev/null && ctl "$i" join_cluster "$(node 1)" > /dev/null && ctl "$i" start_app > /dev/null
      fi
    done
    log "cluster: $(ctl 1 cluster_status --formatter json | tr -d ' ' | grep -o '"running_nodes":\[[^]]*\]')"
    ;;
  urls) echo "amqp://guest:guest@127.0.0.1:$(port 1)/%2f,amqp://guest:guest@127.0.0.1:$(port 2)/%2f,amqp://guest:guest@127.0.0.1:$(port 3)/%2f" ;;
  leader)
    q=${2:?queue}
    for i in 1 2 3; do
      if port_open "$(port "$i")"; then
        leader=$(ctl "$i" list_queues name leader --formatter json 2>/dev/null | tr -d ' \n' | grep -o "\"name\":\"$q\",\"leader\":\"[^\"]*\"\|\"leader\":\"[^\"]*\",\"name\":\"$q\"" | grep -o 'vbc[0-9]' | tr -d vbc)
        [ -n "$leader" ] && { echo "$leader"; exit 0; }
      fi
    done
    log "no leader found for $q"; exit 1
    ;;
  kill)
    i=${2:?node}; n="$D/n$i"
    kill -KILL "$(cat "$n/beam.pid")"
    for _ in $(seq 1 40); do port_open "$(port "$i")" || break; sleep 0.25; done
    kill -KILL -- "-$(cat "$n/server.pid")" 2>/dev/null || true
    rm -f "$n/server.pid" "$n/beam.pid"
    log "node $i killed"
    ;;
  stop-node) stop_node "${2:?node}"; log "node $2 stopped" ;;
  start-node) start_node "${2:?node}" ;;
  status) ctl 1 cluster_status ;;
  stop)
    for i in 3 2 1; do stop_node "$i"; done
    rm -rf "$D"
    log "cluster stopped"
    ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
