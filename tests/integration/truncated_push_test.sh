#!/usr/bin/env bash
# Push streams cut off below gRPC's own checks, sent as raw HTTP/2 by curl: half a message, a
# length prefix of 2^32-1 with nothing after it, and no message at all, each followed by the end
# of the stream. None ever says where the push ends (PushChunk.last), so each is DATA_LOSS (15),
# never OK, and the daemon goes on answering. Needs curl with HTTP/2 (skipped, exit 77, without).
# Usage: truncated_push_test.sh BUILD_DIR
set -euo pipefail
build=$1
curl -V 2>/dev/null | grep -q HTTP2 || { echo "SKIP: curl without HTTP/2"; exit 77; }
source "$(dirname "$0")/daemon_test_lib.sh"
start_paramd --listen=127.0.0.1:0 --metrics_listen=

# gRPC's framing: a compressed-flag byte, a 4-byte big-endian length, the message.
printf '\x00\x00\x00\x00\x10\x0a\x03abc' >"$work/half"  # 16 bytes announced, 5 sent
printf '\x00\xff\xff\xff\xff' >"$work/huge"             # 2^32-1 announced, none sent
: >"$work/none"
for body in half huge none; do
  curl -s -v --http2-prior-knowledge --max-time 20 -H "content-type: application/grpc" \
    -H "te: trailers" --data-binary @"$work/$body" "http://$address/paramd.v1.Data/Push" \
    -o /dev/null 2>"$work/curl.$body" || true
  status=$(tr -d '\r' <"$work/curl.$body" | sed -n 's/^< grpc-status: //p')
  [ "$status" = 15 ] || { cat "$work/curl.$body"; fail "a push stream of '$body' got status '$status', not 15 (DATA_LOSS)"; }
  grep -aq "ended before its last chunk" "$work/curl.$body" || fail "the '$body' refusal does not say why"
done
"$build/tools/paramctl" --address="$address" status >/dev/null || fail "the daemon stopped answering"
echo "PASS: cut-off push streams are DATA_LOSS and the daemon goes on"
