# shellcheck shell=bash
# The local stack for `make run` and `make test`: installs what is missing and
# starts it on free loopback ports, unless the environment already points at a
# server. Source it, then call the functions; `stack_stop` runs on exit.
#
#   HOURGLASS__MONGODB__URI (or MONGODB_URI) set -> that server is used as is.
#   otherwise -> SecantusDB (a MongoDB-compatible server, from PyPI) in .venv.
#   HOURGLASS__MQTT__URL set -> that broker; otherwise Mosquitto (from apt) with
#   config/mosquitto.conf.

STACK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK_DIR="$STACK_ROOT/.stack"
VENV="$STACK_ROOT/.venv"
# What is built or downloaded once per machine, not once per clone: the
# Python environment (.venv links to it) and the cargo-installed tools.
HOURGLASS_CACHE="${HOURGLASS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hourglass}"
SECANTUS_VERSION="0.7.0b3"
STACK_PIDS=()

log() { printf '[stack] %s\n' "$*" >&2; }

# apt_install what package...: Debian packages, with sudo when not root.
apt_install() {
  log "Installing $1 from apt (first run only)."
  shift
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# venv_install what requirement...: Python packages into .venv once per
# version set (a stamp file names them); exports HOURGLASS_TEST_PYTHON.
venv_install() {
  local what=$1
  shift
  ensure_secantus
  local name="$*"
  local stamp="$VENV/.installed-${name//[ =\/]/_}"
  if [[ ! -f "$stamp" ]]; then
    (
      flock 9
      [[ -f "$stamp" ]] && exit 0
      log "Installing $what into $VENV (first run on this machine only)."
      "$VENV/bin/pip" install --quiet --disable-pip-version-check "$@"
      touch "$stamp"
    ) 9>"$HOURGLASS_CACHE/venv.lock"
  fi
  export HOURGLASS_TEST_PYTHON="$VENV/bin/python"
}

# cargo_tool name version [cargo install options...]: installs a cargo tool
# into $HOURGLASS_CACHE/tools/name-version once per machine and prints the
# path of its binary.
cargo_tool() {
  local name=$1 version=$2
  shift 2
  local root="$HOURGLASS_CACHE/tools/$name-$version"
  if [[ ! -x "$root/bin/$name" ]]; then
    mkdir -p "$HOURGLASS_CACHE/tools"
    (
      flock 9
      [[ -x "$root/bin/$name" ]] && exit 0
      log "Installing $name $version into $root (first run on this machine only)."
      cargo install --quiet --locked --root "$root" "$name" --version "$version" "$@" >&2
    ) 9>"$HOURGLASS_CACHE/tools/$name.lock"
  fi
  echo "$root/bin/$name"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_for_port() { # port seconds name
  local port=$1 deadline=$((SECONDS + $2))
  until python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$port),0.5).close()" 2>/dev/null; do
    if ((SECONDS > deadline)); then log "$3 did not open port $port in $2 s"; return 1; fi
    sleep 0.2
  done
}

ensure_secantus() {
  # A stamp, not `pip show | grep -q`: under pipefail, grep's early exit
  # fails that pipeline and would reinstall every time.
  local stamp="$VENV/.secantusdb-$SECANTUS_VERSION"
  if [[ -x "$VENV/bin/secantusd-py" && -f "$stamp" ]]; then
    return 0
  fi
  mkdir -p "$HOURGLASS_CACHE"
  if [[ ! -e "$VENV" ]]; then
    # One environment per machine and Python version; the clone links to it.
    local shared
    shared="$HOURGLASS_CACHE/venv-$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    ln -sfn "$shared" "$VENV"
  fi
  (
    flock 9
    [[ -x "$VENV/bin/secantusd-py" && -f "$stamp" ]] && exit 0
    log "Installing SecantusDB $SECANTUS_VERSION into $VENV (first run on this machine only)."
    [[ -x "$VENV/bin/pip" ]] || python3 -m venv "$(readlink -f "$VENV")"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "secantusdb==$SECANTUS_VERSION"
    touch "$stamp"
  ) 9>"$HOURGLASS_CACHE/venv.lock"
}

# start_mongo [persistent]: sets HOURGLASS__MONGODB__URI and MONGODB_URI.
# Exports SECANTUSD either way: fault tests run private servers they can stop.
# HOURGLASS_STANDINS=N (in-memory only) starts N servers and lists them all in
# MONGODB_URIS: one stand-in is a single Python thread, and the test suite
# spreads its tests over several (tests/api/support/helpers.rs, `mongo_uri`).
start_mongo() {
  ensure_secantus
  export SECANTUSD="$VENV/bin/secantusd-py"
  local uri="${HOURGLASS__MONGODB__URI:-${MONGODB_URI:-}}"
  if [[ -n "$uri" ]]; then
    export HOURGLASS__MONGODB__URI="$uri" MONGODB_URI="$uri"
    log "Using the configured MongoDB server."
    return 0
  fi
  mkdir -p "$STACK_DIR"
  local count="${HOURGLASS_STANDINS:-1}" storage=":memory:" uris=() port i
  if [[ "${1:-}" == persistent ]]; then
    storage="$STACK_DIR/secantus-data"
    count=1
  fi
  for ((i = 0; i < count; i++)); do
    port=$(free_port)
    # setsid: a Ctrl-C for the service must not stop the database under it.
    setsid "$VENV/bin/secantusd-py" --host 127.0.0.1 --port "$port" --storage-path "$storage" \
      --log-level WARNING >"$STACK_DIR/secantus-$port.log" 2>&1 &
    STACK_PIDS+=($!)
    ((i == 0)) && echo "$!" >"$STACK_DIR/secantus.pid"
    wait_for_port "$port" 60 SecantusDB || { tail -20 "$STACK_DIR/secantus-$port.log" >&2; return 1; }
    uris+=("mongodb://127.0.0.1:$port/?directConnection=true")
    log "SecantusDB listens on 127.0.0.1:$port (log: .stack/secantus-$port.log)."
  done
  export HOURGLASS__MONGODB__URI="${uris[0]}"
  export MONGODB_URI="$HOURGLASS__MONGODB__URI"
  export MONGODB_URIS="${uris[*]}"
}

mosquitto_bin() {
  command -v mosquitto 2>/dev/null || { [[ -x /usr/sbin/mosquitto ]] && echo /usr/sbin/mosquitto; }
}

ensure_mosquitto() {
  if [[ -n "$(mosquitto_bin)" ]] && command -v mosquitto_pub >/dev/null; then return 0; fi
  apt_install Mosquitto mosquitto mosquitto-clients
}

# start_mosquitto: sets HOURGLASS__MQTT__URL and MQTT_URL; exports MOSQUITTO.
start_mosquitto() {
  ensure_mosquitto
  export MOSQUITTO
  MOSQUITTO="$(mosquitto_bin)"
  if [[ -n "${HOURGLASS__MQTT__URL:-}" ]]; then
    export MQTT_URL="$HOURGLASS__MQTT__URL"
    log "Using the configured MQTT broker."
    return 0
  fi
  local port dir
  port=$(free_port)
  dir="$STACK_DIR/mosquitto-$port"
  mkdir -p "$dir"
  {
    cat "$STACK_ROOT/config/mosquitto.conf"
    echo "listener $port 127.0.0.1"
    echo "persistence_location $dir/"
    echo "user $(id -un)"
  } >"$dir/mosquitto.conf"
  setsid "$MOSQUITTO" -c "$dir/mosquitto.conf" >"$dir/mosquitto.log" 2>&1 &
  STACK_PIDS+=($!)
  wait_for_port "$port" 30 Mosquitto || { tail -20 "$dir/mosquitto.log" >&2; return 1; }
  export HOURGLASS__MQTT__URL="mqtt://127.0.0.1:$port" MQTT_URL="mqtt://127.0.0.1:$port"
  log "Mosquitto listens on 127.0.0.1:$port (config: .stack/mosquitto-$port/mosquitto.conf)."
}

# The benchmark peers (loadtest `peers`) and the tests' oracles from apt:
# VictoriaMetrics (with vmalert), InfluxDB 1.x, Prometheus and promtool, and
# curl for the README's session.
ensure_peers() {
  if [[ -x /usr/bin/victoria-metrics && -x /usr/bin/vmalert && -x /usr/bin/influxd && -x /usr/bin/prometheus && -x /usr/bin/promtool && -x /usr/bin/curl ]]; then return 0; fi
  # Any system service they start listens on its own port; the loadtest
  # starts private instances on free ports.
  apt_install "VictoriaMetrics, InfluxDB, Prometheus and curl" victoria-metrics influxdb prometheus curl
}

# The official InfluxDB client libraries (v2 `influxdb-client`, v1 `influxdb`)
# in .venv, for the line-protocol tests; exports HOURGLASS_TEST_PYTHON.
INFLUX_CLIENTS="influxdb-client==1.50.0 influxdb==5.3.2"
ensure_influx_clients() {
  # shellcheck disable=SC2086
  venv_install "the InfluxDB client libraries" $INFLUX_CLIENTS
}

# Debian's Chromium and ChromeDriver, and Selenium in .venv, for the web
# console's browser tests; exports HOURGLASS_TEST_PYTHON.
SELENIUM="selenium==4.50.0"
ensure_browser() {
  if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
    apt_install "Chromium and ChromeDriver" chromium chromium-driver
  fi
  venv_install Selenium "$SELENIUM"
}

# pysparkplug (Sparkplug B edge nodes written by others) in .venv, for the
# Sparkplug host tests; exports HOURGLASS_TEST_PYTHON.
SPARKPLUG_CLIENTS="pysparkplug==0.6.1"
ensure_sparkplug_clients() {
  # shellcheck disable=SC2086
  venv_install pysparkplug $SPARKPLUG_CLIENTS
}

# A broker that speaks MQTT 3.1.1 only (amqtt), in a virtualenv of its own
# (its dependencies stay out of the stand-in's): the MQTT 5 fallback test
# connects to it. Exports HOURGLASS_TEST_AMQTT.
AMQTT="amqtt==0.12.1"
ensure_mqtt311_broker() {
  local venv="$HOURGLASS_CACHE/amqtt-venv"
  local stamp="$venv/.installed-${AMQTT//[=]/_}"
  if [[ ! -f "$stamp" ]]; then
    mkdir -p "$HOURGLASS_CACHE"
    (
      flock 9
      [[ -f "$stamp" ]] && exit 0
      log "Installing $AMQTT into $venv (first run on this machine only)."
      [[ -x "$venv/bin/pip" ]] || python3 -m venv "$venv"
      "$venv/bin/pip" install --quiet --disable-pip-version-check "$AMQTT"
      touch "$stamp"
    ) 9>"$HOURGLASS_CACHE/amqtt.lock"
  fi
  export HOURGLASS_TEST_AMQTT="$venv/bin/amqtt"
}

# The `mqtt` npm package (MQTT.js) in .stack/node, for the book's JavaScript
# MQTT example (docs/examples/javascript, run by tests/api/clients.rs);
# exports HOURGLASS_TEST_NODE_MODULES. An ES module finds its packages in a
# node_modules beside it (NODE_PATH is for require only): the test runs a
# copy of the example from a directory that links this one.
MQTT_JS="mqtt@5.16.0"
ensure_js_clients() {
  local dir="$STACK_DIR/node"
  local stamp="$dir/.installed-${MQTT_JS//[@\/]/_}"
  if [[ ! -f "$stamp" ]]; then
    command -v npm >/dev/null || apt_install "Node.js and npm" nodejs npm
    mkdir -p "$dir"
    (
      flock 9
      [[ -f "$stamp" ]] && exit 0
      log "Installing $MQTT_JS into $dir (first run of this checkout only)."
      npm install --no-audit --no-fund --save-exact --loglevel=error --prefix "$dir" "$MQTT_JS" >&2
      touch "$stamp"
    ) 9>"$STACK_DIR/node.lock"
  fi
  export HOURGLASS_TEST_NODE_MODULES="$dir/node_modules"
}

stack_stop() {
  local pid
  # SIGTERM to each main thread, not the process: SecantusDB (Python) runs
  # its handler only on its main thread and misses a process-directed one
  # the kernel hands another thread (tests/api/support/database.rs).
  for pid in "${STACK_PIDS[@]}"; do
    python3 -c 'import ctypes, sys; p = int(sys.argv[1]); ctypes.CDLL(None).tgkill(p, p, 15)' "$pid" 2>/dev/null \
      || kill "$pid" 2>/dev/null || true
  done
  for pid in "${STACK_PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  STACK_PIDS=()
}
trap stack_stop EXIT
