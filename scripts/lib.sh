# shellcheck shell=bash
# lib.sh -- shell helpers the demo and experiment scripts share; source it.
#
# stop_server   SIGTERM the gddr-ps in $server_pid, SIGKILL after 5 s, reap it
# field K LINE  the value of K=... in a RESULT line

stop_server() {
  if [ -n "${server_pid:-}" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  [ -n "${server_pid:-}" ] && wait "$server_pid" 2>/dev/null || true
  server_pid=
}

field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<< "$2"; }
