# Sourced by the targets that drain a queue (e2e, text-e2e): RabbitMQ and PostgreSQL 15 on the
# device machine, which has neither, nor network. They travel as Debian's packages, trimmed
# (.e2e/services.tar.xz, `scripts/device/pack.sh services`), are unpacked into E (the target's work
# directory) and started: Postgres as nobody, Erlang's epmd and RabbitMQ each in a session of its own.
#   start_services  starts both (a warm machine may still run an earlier call's: they are reused,
#                   and stopped with these); each started pid is recorded in E/services.pids
#   stop_services   stops each by its pid — Postgres by its postmaster's (fast shutdown), RabbitMQ's
#                   process group, epmd — waits for them, then kills what is left. Set it as the
#                   target's EXIT trap *before* start_services: a process left running keeps the
#                   device call open to its time limit.
# Env: PGPORT (5432), AMQP_PORT (5672), NODENAME (rabbit@localhost). The services' log stays in E
# (its tail is printed when a service does not start): the device tool returns only 8 files from
# OUT, and the run's own results must be among them.
SERVICES_LOG="${E:-$OUT}/services.log"
PGPORT=${PGPORT:-5432}; AMQP_PORT=${AMQP_PORT:-5672}; NODENAME=${NODENAME:-rabbit@localhost}
SERVICES_PIDS_FILE="$E/services.pids"
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { for _ in $(seq 1 120); do port_open "$1" && return 0; sleep 0.5; done; return 1; }

# record NAME PID: a service this call (or an earlier one) started, to stop by its pid.
record() { grep -qx "$1 $2" "$SERVICES_PIDS_FILE" 2>/dev/null || echo "$1 $2" >> "$SERVICES_PIDS_FILE"; }
# ours NAME PID: PID is still that service, not a pid reused since an earlier call recorded it
# (for RabbitMQ: a process of the group PID leads is RabbitMQ's).
ours() {
  local p
  if [ "$1" = rabbitmq-group ]; then
    for p in $(pgrep -g "$2" 2>/dev/null); do tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline" | grep -q rabbit && return 0; done
    return 1
  fi
  tr '\0' ' ' 2>/dev/null < "/proc/$2/cmdline" | grep -q "$1"
}

start_services() {
  echo "[services] unpacking"
  [ -d "$E/lib" ] || tar -C "$E" -xJf .e2e/services.tar.xz || return 1
  # Erlang and RabbitMQ use absolute paths: copy them to /usr/lib (new directories; -n replaces nothing).
  cp -an "$E/sys/usr/lib/erlang" /usr/lib/ 2>/dev/null; cp -an "$E/sys/usr/lib/rabbitmq" /usr/lib/ 2>/dev/null
  LIBS="$E/lib/usr/lib/x86_64-linux-gnu:$E/lib/lib/x86_64-linux-gnu"
  local pgbin="$E/lib/usr/lib/postgresql/15/bin"
  echo "[services] postgres on $PGPORT"
  PGDATA=$E/pgdata
  if [ ! -f "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA" && chown nobody "$PGDATA" && chmod 700 "$PGDATA"
    runuser -u nobody -- env LD_LIBRARY_PATH="$LIBS" "$pgbin/initdb" -D "$PGDATA" -U postgres -A trust -E UTF8 --no-locale > "$SERVICES_LOG" 2>&1 || { cat "$SERVICES_LOG"; return 1; }
  fi
  if ! port_open "$PGPORT"; then
    runuser -u nobody -- env LD_LIBRARY_PATH="$LIBS" setsid "$pgbin/postgres" -D "$PGDATA" -c listen_addresses=127.0.0.1 \
      -c port="$PGPORT" -c unix_socket_directories=/tmp -c fsync=on >> "$SERVICES_LOG" 2>&1 < /dev/null &
  fi
  wait_port "$PGPORT" || { echo "postgres did not start"; tail -20 "$SERVICES_LOG"; return 1; }
  # The postmaster's pid, as Postgres itself records it (runuser stands between it and this shell).
  [ -f "$PGDATA/postmaster.pid" ] && record postgres "$(head -1 "$PGDATA/postmaster.pid")"
  echo "[services] rabbitmq on $AMQP_PORT"
  R=$E/rabbit; mkdir -p "$R"; echo '[].' > "$R/enabled_plugins"
  local erl_path="/usr/lib/erlang/bin:$PATH"
  # epmd started here, so that its pid is known (Erlang would start it as a daemon of its own).
  if ! port_open 4369; then
    env LD_LIBRARY_PATH="$LIBS" PATH="$erl_path" setsid epmd >> "$SERVICES_LOG" 2>&1 < /dev/null &
    record epmd $!
    wait_port 4369 || { echo "epmd did not start"; tail -10 "$SERVICES_LOG"; return 1; }
  fi
  if ! port_open "$AMQP_PORT"; then
    env HOME="$R" RABBITMQ_MNESIA_BASE="$R/mnesia" RABBITMQ_LOG_BASE="$R/log" RABBITMQ_NODENAME="$NODENAME" \
      RABBITMQ_NODE_PORT="$AMQP_PORT" RABBITMQ_ENABLED_PLUGINS_FILE="$R/enabled_plugins" RABBITMQ_CONFIG_FILE="$R/rabbitmq" \
      RABBITMQ_DIST_PORT=$((AMQP_PORT + 20000)) LD_LIBRARY_PATH="$LIBS" PATH="$erl_path" \
      setsid /usr/lib/rabbitmq/bin/rabbitmq-server >> "$SERVICES_LOG" 2>&1 < /dev/null &
    # setsid made it a process-group leader: its group is the server script and the Erlang VM.
    record rabbitmq-group $!
  fi
  wait_port "$AMQP_PORT" || { echo "rabbitmq did not start"; tail -30 "$SERVICES_LOG"; return 1; }
  sleep 2
}

stop_services() {
  [ -f "$SERVICES_PIDS_FILE" ] || return 0
  echo "[services] stopping"
  local name pid alive
  while read -r name pid; do
    ours "$name" "$pid" || continue
    case $name in
      postgres) kill -INT "$pid" 2>/dev/null ;;  # fast shutdown
      rabbitmq-group) kill -TERM -- "-$pid" 2>/dev/null ;;
      *) kill -TERM "$pid" 2>/dev/null ;;
    esac
  done < "$SERVICES_PIDS_FILE"
  for _ in $(seq 1 30); do
    alive=0
    while read -r name pid; do ours "$name" "$pid" && alive=1; done < "$SERVICES_PIDS_FILE"
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  while read -r name pid; do
    case $name in
      # What is left of the group (the leader may be gone before the Erlang VM it started).
      rabbitmq-group) ours "$name" "$pid" && kill -KILL -- "-$pid" 2>/dev/null ;;
      *) ours "$name" "$pid" && { echo "[services] $name ($pid) still running: killed"; kill -KILL "$pid" 2>/dev/null; } ;;
    esac
  done < "$SERVICES_PIDS_FILE"
  rm -f "$SERVICES_PIDS_FILE"
}
