#!/usr/bin/env bash
# scripts/check_rooms.sh passes on the tree and refuses each kind of include against the rooms'
# one-way rules, planted in a copy of the product's sources.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$root" && git ls-files -co --exclude-standard -- kernels common transport server client tools \
   python | grep -E '\.(h|cc|cu|cuh)$' | tar -cf - -T -) | tar -xf - -C "$work"

"$root/scripts/check_rooms.sh" "$work" >/dev/null || { echo "FAIL: the tree itself is refused"; exit 1; }

# Each case: a file, the include planted in it, and what the refusal must say.
fails=0
check() {
  local file=$1 include=$2 expect=$3
  cp "$work/$file" "$work/$file.orig"
  printf '#include "%s"\n' "$include" >> "$work/$file"
  local out status=0
  out=$("$root/scripts/check_rooms.sh" "$work" 2>&1) || status=$?
  mv "$work/$file.orig" "$work/$file"
  if [ "$status" -ne 1 ] || ! grep -qF "$file includes \"$include\": $expect" <<<"$out"; then
    echo "FAIL: $file including $include: exit $status, output:"
    echo "$out"
    fails=$((fails + 1))
  else
    echo "ok: $file including $include is refused"
  fi
}
check server/job/job.cc server/rpc/server.h "server/job/ includes the backend"
check server/state/state_transfer.h server/job/job.h "server/state/ includes the backend"
check server/state/checkpoint.cc server/daemon.h "server/state/ includes the backend"
check server/backend/backend.cc server/job/job.h "server/backend/ includes only itself"
check server/backend/backends.cc server/backend/cuda/lent_memory.h "server/backend/ includes only itself"
check server/shard/peer_exchange.cc server/job/job.h "server/shard/ includes only itself"
check server/daemon.cc server/rpc/control_service.h "only main.cc includes server/rpc/"
check server/registration.cc server/job/job.h "the daemon's base includes"
check server/main.cc server/job/job.h "main.cc starts the server"
check client/client.cc server/daemon.h "the client never includes server/"
check transport/placed.cc server/daemon.h "transport/ sits below"
check kernels/fused_step.h absl/status/status.h "the ground floor includes no other room"
[ "$fails" -eq 0 ] || exit 1
echo "rooms_test: every planted include refused"
