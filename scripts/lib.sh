# shellcheck shell=bash
# lib.sh -- shell helpers the demo and experiment scripts share; source it.
#
# stop_server   SIGTERM the gddr-ps in $server_pid, SIGKILL after 5 s, reap it
# stop_pid PID  the same for any process this shell started
# stop_pidfile FILE
#               SIGTERM the process whose pid FILE holds (gddr-ps --detach --pid-file)
# wait_file FILE SECONDS
#               wait (bounded) until FILE exists and is not empty; 1 if it never did
# eval_args [gddr-train args...]
#               of a trainer's arguments, those that shape or find the model
#               (--workload, --hidden, --data, --synthetic, --config), one a
#               line, for server_eval
# build_documented ME DIR FILE WHAT
#               compile FILE with the `cc NAME.c ...` command its comment gives
# field K LINE  the value of K=... in a RESULT line
# stand_in_cuda_driver DIR
#               build DIR/libcuda.so.1, an empty library named like NVIDIA's
#               driver: with DIR on LD_LIBRARY_PATH, libgddr-client looks for
#               its CUDA plugin on a host without a GPU (the plugin then loads
#               and reports that no device is usable)
# server_eval EP WORKLOAD [gddr-train args...]
#               the RESULT line of the model the server holds now: an observer
#               pulls it and evaluates it on the test set (changes nothing;
#               run it after the workers are done, before stopping the server)

stop_pid() {
  local pid=$1
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

# stop_pidfile FILE: SIGTERM the process whose pid FILE holds (a gddr-ps
# started with --detach --pid-file FILE), if FILE is still there.
stop_pidfile() {
  local pid
  pid=$(cat "$1" 2>/dev/null || true)
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
}

stop_server() {
  stop_pid "${server_pid:-}"
  server_pid=
}

wait_file() {
  local f=$1 i
  for ((i = 0; i < $2 * 10; i++)); do [ -s "$f" ] && return 0; sleep 0.1; done
  [ -s "$f" ]
}

eval_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --workload|--hidden|--data|--synthetic|--config)
        if [ $# -ge 2 ]; then printf '%s\n%s\n' "$1" "$2"; shift; fi ;;
      --workload=*|--hidden=*|--data=*|--synthetic=*|--config=*) printf '%s\n' "$1" ;;
    esac
    shift
  done
}

# wait_workers NAME DIR SECONDS PID...: while the workers run, prints every
# SECONDS the newest "[rank" line of each worker (DIR/workerR.log) that has a
# new one since the last round (a finished or quiet worker's line is not
# printed again); then waits for each and shows the log tail of any that
# failed. Status 1 if one did.
wait_workers() {
  local name=$1 dir=$2 every=$3 p r line running fail=0
  shift 3
  local wp=("$@") last=()
  while :; do
    running=0
    for p in "${wp[@]}"; do kill -0 "$p" 2>/dev/null && running=1; done
    [ "$running" = 1 ] || break
    sleep "$every"
    for ((r = 0; r < ${#wp[@]}; r++)); do
      line=$(grep -E '^\[rank' "$dir/worker$r.log" | tail -n 1 || true)
      [ -n "$line" ] && [ "$line" != "${last[$r]:-}" ] && echo "  $line"
      last[$r]=$line
    done
  done
  for ((r = 0; r < ${#wp[@]}; r++)); do
    wait "${wp[$r]}" || { echo "$name: worker $r failed:" >&2; tail -n 20 "$dir/worker$r.log" >&2; fail=1; }
  done
  return "$fail"
}

# build_documented ME DIR FILE WHAT: copies FILE into DIR under the name its
# documented command compiles ("cc NAME.c ..." in its first comment that has
# one) and runs exactly that command there; exits with a FAIL naming WHAT
# when there is no command or it fails.
build_documented() {
  local me=$1 dir=$2 src=$3 what=$4 cmd name
  cmd=$(grep -m1 -oE '\bcc [A-Za-z0-9_]+\.c .*' "$src" | sed 's| *\*/ *$||')
  [ -n "$cmd" ] || { echo "$me: FAIL: $what gives no 'cc FILE.c ...' command" >&2; exit 1; }
  name=$(awk '{ print $2 }' <<< "$cmd")
  mkdir -p "$dir" && cp "$src" "$dir/$name"
  (cd "$dir" && bash -c "$cmd") ||
    { echo "$me: FAIL: $what does not build with its own command: $cmd" >&2; exit 1; }
  echo "$me: $what builds with: $cmd"
}

field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<< "$2"; }

stand_in_cuda_driver() {
  mkdir -p "$1"
  echo 'int gddr_stand_in_driver;' > "$1/driver.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$1/libcuda.so.1" "$1/driver.c"
}

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
