# shellcheck shell=bash
# lib.sh -- shell helpers the demo and experiment scripts share; source it.
#
# stop_server   SIGTERM the gddr-ps in $server_pid, SIGKILL after 5 s, reap it
# field K LINE  the value of K=... in a RESULT line
# server_eval EP WORKLOAD [gddr-train args...]
#               the RESULT line of the model the server holds now: an observer
#               pulls it and evaluates it on the test set (changes nothing;
#               run it after the workers are done, before stopping the server)

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

server_eval() {
  local ep=$1 wl=$2 out
  shift 2
  if out=$("${BIN:-build/bin}/gddr-train" --server "$ep" --workload "$wl" --evaluate --quiet "$@" 2>&1); then
    grep '^RESULT' <<< "$out" | tail -n 1
  else
    echo "server_eval: $out" >&2
    echo "RESULT server_model=1 test_accuracy=? test_loss=? version=?"
  fi
}
