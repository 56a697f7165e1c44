#!/usr/bin/env bash
# A daemon on a Unix socket (--listen=unix:PATH): the socket is mode 0600, a training job and
# paramctl reach it by its address, user nobody cannot connect (and can once the mode is opened,
# so the mode is what stops it), a second daemon on the same path is refused, and the socket is
# gone after the daemon stops. With --listen_group the socket is that group's, mode 0660, and a
# member connects. The nobody part needs root (runuser) and says so where it is not.
# Usage: unix_socket_test.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
chmod 755 "$work"  # the directory lets anyone through: the socket's own mode must keep them out
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -e "$work/log" ] && cat "$work/log"; exit 1; }

socket=$work/paramd.sock
"$build/server/paramd" --listen="unix:$socket" --metrics_listen= --address_file="$work/addr" \
  2>"$work/log" &
daemon=$!
address=$("$build/tools/paramctl" wait "$work/addr" "$daemon") || fail "paramd did not serve"
[ "$address" = "unix:$socket" ] || fail "the daemon's address is $address, not unix:$socket"
[ "$(stat -c %a "$socket")" = 600 ] || fail "the socket's mode is $(stat -c %a "$socket"), not 600"

"$build/examples/mlp/paramd_train_mlp" --address="$address" --world_size=1 --steps=5 --check \
  >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "a training job over the socket"; }
grep -q "check passed" "$work/train.log" || fail "the job's check did not pass"
"$build/tools/paramctl" --address="$address" status | grep -q "job mlp: 1/1 ranks registered" ||
  fail "paramctl status over the socket"

if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null; then
  if runuser -u nobody -- "$build/tools/paramctl" --address="$address" --timeout_ms=2000 status \
      >/dev/null 2>&1; then
    fail "user nobody reached a daemon whose socket is 0600"
  fi
  chmod 666 "$socket"
  runuser -u nobody -- "$build/tools/paramctl" --address="$address" --timeout_ms=2000 status \
    >/dev/null 2>&1 || fail "user nobody could not connect even to an open socket (the test proves nothing)"
  chmod 600 "$socket"
  echo "unix_socket_test: user nobody is kept out by the socket's mode"
else
  echo "unix_socket_test: not root: the check that another user cannot connect is skipped"
fi

out=$("$build/server/paramd" --listen="unix:$socket" --metrics_listen= 2>&1) &&
  fail "a second daemon started on a path a daemon listens on"
grep -q "a process listens there already" <<<"$out" || fail "the second daemon says: $out"

kill -TERM "$daemon"
wait "$daemon" || fail "paramd exited non-zero after SIGTERM"
daemon=""
[ ! -e "$socket" ] || fail "the socket is left behind after the daemon stopped"

# A socket left by a daemon that was killed is taken over at the next start.
"$build/server/paramd" --listen="unix:$socket" --metrics_listen= --address_file="$work/addr2" \
  2>"$work/log" &
daemon=$!
"$build/tools/paramctl" wait "$work/addr2" "$daemon" >/dev/null || fail "paramd did not serve again"
kill -KILL "$daemon"
wait "$daemon" 2>/dev/null || true
[ -S "$socket" ] || fail "a killed daemon left no socket (the next part would prove nothing)"
"$build/server/paramd" --listen="unix:$socket" --metrics_listen= --address_file="$work/addr3" \
  2>"$work/log" &
daemon=$!
"$build/tools/paramctl" wait "$work/addr3" "$daemon" >/dev/null ||
  fail "a daemon did not start on the path a killed daemon left"
kill -TERM "$daemon"
wait "$daemon" || fail "paramd exited non-zero after SIGTERM"
daemon=""

# --listen_group: the socket is that group's, mode 0660, and its members connect. As root the group
# is user nobody's own, and nobody connects; else the test user's own group.
if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null; then
  group=$(id -gn nobody)
else
  group=$(id -gn)
fi
"$build/server/paramd" --listen="unix:$socket" --listen_group="$group" --metrics_listen= \
  --address_file="$work/addr4" 2>"$work/log" &
daemon=$!
"$build/tools/paramctl" wait "$work/addr4" "$daemon" >/dev/null ||
  fail "paramd did not serve with --listen_group=$group"
[ "$(stat -c %a "$socket")" = 660 ] || fail "the socket's mode is $(stat -c %a "$socket"), not 660"
[ "$(stat -c %G "$socket")" = "$group" ] || fail "the socket's group is $(stat -c %G "$socket"), not $group"
if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null; then
  runuser -u nobody -- "$build/tools/paramctl" --address="unix:$socket" --timeout_ms=2000 status \
    >/dev/null 2>&1 || fail "user nobody, of group $group, could not connect"
  echo "unix_socket_test: a member of the socket's group connects"
fi
out=$("$build/server/paramd" --listen=127.0.0.1:0 --listen_group="$group" --metrics_listen= 2>&1) &&
  fail "a daemon took --listen_group with a host:port address"
grep -q "is for a Unix socket" <<<"$out" || fail "the daemon says: $out"
echo "unix_socket_test: passed"
