# Sourced by scripts/device/e2e.sh and text-e2e.sh: unpacks RabbitMQ and PostgreSQL 15 (carried in
# .e2e/services.tar.xz, made by pack-services.sh: the GPU machine has neither, nor network), starts
# them (Postgres as nobody), and defines stop_services, which stops both by pid — call it before the
# script exits, or the device call hangs to its time limit. A warm machine may still run an earlier
# call's services: they are reused (and stopped too).
# Needs: OUT, E (work dir). Env: PGPORT (5432), AMQP_PORT (5672), NODENAME (rabbit@localhost).
# The services' log stays in E (its tail is printed when a service does not start): the device
# tool returns only 8 files from OUT, and the run's own results must be among them.
SERVICES_LOG="${E:-$OUT}/services.log"
PGPORT=${PGPORT:-5432}; AMQP_PORT=${AMQP_PORT:-5672}; NODENAME=${NODENAME:-rabbit@localhost}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { for _ in $(seq 1 120); do port_open "$1" && return 0; sleep 0.5; done; return 1; }
SERVICE_PIDS=()

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
    SERVICE_PIDS+=($!)
  fi
  wait_port "$PGPORT" || { echo "postgres did not start"; tail -20 "$SERVICES_LOG"; return 1; }
  echo "[services] rabbitmq on $AMQP_PORT"
  R=$E/rabbit; mkdir -p "$R"; echo '[].' > "$R/enabled_plugins"
  if ! port_open "$AMQP_PORT"; then
    env HOME="$R" RABBITMQ_MNESIA_BASE="$R/mnesia" RABBITMQ_LOG_BASE="$R/log" RABBITMQ_NODENAME="$NODENAME" \
      RABBITMQ_NODE_PORT="$AMQP_PORT" RABBITMQ_ENABLED_PLUGINS_FILE="$R/enabled_plugins" RABBITMQ_CONFIG_FILE="$R/rabbitmq" \
      RABBITMQ_DIST_PORT=$((AMQP_PORT + 20000)) LD_LIBRARY_PATH="$LIBS" PATH="/usr/lib/erlang/bin:$PATH" \
      setsid /usr/lib/rabbitmq/bin/rabbitmq-server >> "$SERVICES_LOG" 2>&1 < /dev/null &
    SERVICE_PIDS+=($!)
  fi
  wait_port "$AMQP_PORT" || { echo "rabbitmq did not start"; tail -30 "$SERVICES_LOG"; return 1; }
  sleep 2
}

stop_services() {
  echo "[services] stopping"
  # setsid made each a process-group leader: stop the whole group (Erlang's epmd and beam too).
  for pid in "${SERVICE_PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null; done
  pkill -TERM -f "postgres -D $E/pgdata" 2>/dev/null; pkill -TERM -f beam.smp 2>/dev/null; pkill -TERM epmd 2>/dev/null
  sleep 3
  pkill -KILL -f beam.smp 2>/dev/null; pkill -KILL epmd 2>/dev/null
}
