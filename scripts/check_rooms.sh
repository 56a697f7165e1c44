#!/usr/bin/env bash
# Fails when a product file includes across a room's wall the wrong way (DESIGN.md §4): the
# top-level folders' one-way order, and the daemon's rooms inside server/. Reads #include lines
# only; tests, benchmarks and examples may include what they exercise. Usage: check_rooms.sh [ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

# The daemon's base: files on server/'s top floor that every room may include (a budget, metrics,
# a counter, the checks of a job's spec). The rest of the top floor (daemon, registry,
# checkpoints, leases, step executor, main.cc) sits above the rooms it uses.
base='server/(memory_budget|metrics|counted_limit|registration)\.h'

# What a file may not include: an extended regular expression over the included path, and why.
# What a file may not include: a Perl regular expression over the included path, " @@ ", and why.
forbidden() {
  case "$1" in
    kernels/*)
      echo '^(common|transport|server|client|python|tools|proto|paramd|absl|grpc|grpcpp|google)/ @@ the ground floor includes no other room, Abseil, gRPC or protobuf' ;;
    common/*) echo '^(transport|server|client|python|tools)/ @@ common/ sits below transport/, server/ and client/' ;;
    transport/*) echo '^(server|client|python|tools)/ @@ transport/ sits below server/ and client/' ;;
    client/*) echo '^(server|python|tools)/ @@ the client never includes server/' ;;
    tools/* | python/*) echo '^server/ @@ tools and bindings reach the daemon through the client' ;;
    server/backend/cuda/*) echo '^server/(?!backend/) @@ server/backend/cuda/ includes only server/backend/' ;;
    server/backend/*)
      echo '^server/(?!backend/)|^server/backend/cuda/ @@ server/backend/ includes only itself (the cuda backend is reached through backends.h)' ;;
    server/shard/*) echo '^server/(?!shard/) @@ server/shard/ includes only itself' ;;
    server/state/*)
      echo "^server/(?!state/|backend/(?!cuda/)|${base#server/}) @@ server/state/ includes the backend and the daemon's base only: it reaches a job through state/exported_job.h, which job/ implements" ;;
    server/job/*)
      echo "^server/(?!job/|state/|shard/|backend/(?!cuda/)|${base#server/}) @@ server/job/ includes the backend, state, shard and the daemon's base only" ;;
    server/rpc/*) echo '^server/backend/cuda/ @@ the RPC room reaches the backend through the daemon' ;;
    server/main.cc) echo '^server/(?!rpc/server\.h$) @@ main.cc starts the server (server/rpc/server.h) and nothing else' ;;
    server/*)
      if [[ "$1" =~ ^${base%\\.h}\.(h|cc)$ ]]; then
        echo "^server/(?!backend/(?!cuda/)|${base#server/}) @@ the daemon's base includes the backend and itself only"
      else
        echo '^server/rpc/|^server/backend/cuda/ @@ only main.cc includes server/rpc/; the cuda backend is reached through backends.h'
      fi ;;
    *) echo '' ;;
  esac
}

# The product's sources: those git knows (tracked or not ignored), or every one in a plain copy.
product_files() {
  local rooms=(kernels common transport server client tools python)
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -co --exclude-standard -- "${rooms[@]/%//*}"
  else
    find "${rooms[@]}" -type f 2>/dev/null
  fi | grep -E '\.(h|cc|cu|cuh)$'
}

failures=0
checked=0
while IFS= read -r file; do
  rule=$(forbidden "$file")
  [ -n "$rule" ] || continue
  checked=$((checked + 1))
  pattern=${rule%% @@ *}
  why=${rule#* @@ }
  status=0
  bad=$(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]+)[">].*/\1/p' "$file" |
    grep -P -- "$pattern") || status=$?
  if [ "$status" -gt 1 ]; then
    echo "check_rooms: the rule for $file is not a valid expression: $pattern" >&2
    exit 2
  fi
  while IFS= read -r included; do
    [ -n "$included" ] || continue
    echo "check_rooms: $file includes \"$included\": $why"
    failures=$((failures + 1))
  done <<<"$bad"
done < <(product_files)
if [ "$failures" -gt 0 ]; then
  echo "check_rooms: $failures include(s) against the rooms' one-way rules (DESIGN.md §4)"
  exit 1
fi
echo "check_rooms: $checked files include one way"
