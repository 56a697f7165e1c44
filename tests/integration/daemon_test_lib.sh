# Sourced by the shell tests that run one paramd at a time: a work folder removed at exit with the
# daemon, `fail` (says why, shows the daemon's log, exits 1) and `start_paramd ARGS...` (starts
# paramd with ARGS, its log in $work/log, and sets $daemon and $address once it serves).
# Needs $build (the build folder).
work=$(mktemp -d)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  [ -e "$work/log" ] && cat "$work/log"
  exit 1
}
start_paramd() {
  rm -f "$work/addr"
  "$build/server/paramd" --address_file="$work/addr" "$@" 2>"$work/log" &
  daemon=$!
  address=$("$build/tools/paramctl" wait "$work/addr" "$daemon") || fail "paramd $* did not serve"
}
stop_paramd() {
  kill -TERM "$daemon"
  wait "$daemon" || true
  daemon=""
}
