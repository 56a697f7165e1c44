#!/usr/bin/env bash
# Tokens from the command line: paramd --token_file, paramctl --token_file and a training job that
# reads $PARAMD_TOKEN_FILE (the C++ client's default) or its --token_file, and SIGHUP's reload
# taking a token away;
# then /metrics behind a password (--metrics_auth_file, HTTP basic authentication).
# Usage: tokens_cli_test.sh BUILD_DIR
set -euo pipefail
build=$1
source "$(dirname "$0")/daemon_test_lib.sh"
umask 077
admin=admin-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
trainer=trainer-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf 'admin %s\ntrainer %s mlp*\n' "$admin" "$trainer" >"$work/tokens"
echo "$admin" >"$work/admin.token"
echo "$trainer" >"$work/trainer.token"

start_paramd --listen=127.0.0.1:0 --metrics_listen= --token_file="$work/tokens"

out=$("$build/tools/paramctl" --address="$address" status 2>&1) &&
  fail "paramctl status without a token: $out"
grep -q "UNAUTHENTICATED" <<<"$out" || fail "paramctl without a token says: $out"
"$build/tools/paramctl" --address="$address" --token_file="$work/admin.token" status >/dev/null ||
  fail "paramctl status with the admin token"
out=$(PARAMD_TOKEN_FILE="$work/trainer.token" "$build/tools/paramctl" --address="$address" status 2>&1) &&
  fail "a trainer token listed every job: $out"
grep -q "PERMISSION_DENIED" <<<"$out" || fail "paramctl with a trainer token says: $out"

PARAMD_TOKEN_FILE="$work/trainer.token" "$build/examples/mlp/paramd_train_mlp" \
  --address="$address" --world_size=1 --steps=5 --check >"$work/train.log" 2>&1 ||
  { cat "$work/train.log"; fail "a training job with its trainer token"; }
grep -q "check passed" "$work/train.log" || fail "the job's check did not pass"
# The same token named by the example's --token_file (no environment): the job goes on.
env -u PARAMD_TOKEN_FILE "$build/examples/mlp/paramd_train_mlp" --address="$address" \
  --token_file="$work/trainer.token" --job=mlp2 --world_size=1 --steps=5 >"$work/train2.log" 2>&1 ||
  { cat "$work/train2.log"; fail "a training job with --token_file"; }
out=$(env -u PARAMD_TOKEN_FILE "$build/examples/mlp/paramd_train_mlp" --address="$address" \
  --job=mlp3 --world_size=1 --steps=5 2>&1) && fail "a training job without a token ran: $out"
grep -q "UNAUTHENTICATED" <<<"$out" || fail "a training job without a token says: $out"

# The trainer's line goes; SIGHUP; its token no longer answers.
printf 'admin %s\n' "$admin" >"$work/tokens"
kill -HUP "$daemon"
for _ in $(seq 100); do grep -q "token file was read again" "$work/log" && break; sleep 0.05; done
grep -q "token file was read again" "$work/log" || fail "no reload logged after SIGHUP"
out=$(PARAMD_TOKEN_FILE="$work/trainer.token" "$build/tools/paramctl" --address="$address" status mlp 2>&1) &&
  fail "a token taken away still answered: $out"
grep -q "UNAUTHENTICATED" <<<"$out" || fail "after the reload the trainer token gets: $out"
"$build/tools/paramctl" --address="$address" --token_file="$work/admin.token" status mlp >/dev/null ||
  fail "the admin token after the reload"
stop_paramd

# /metrics behind a password (--metrics_auth_file): 401 without it or with a wrong one.
password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "prometheus:$password" >"$work/metrics.auth"
start_paramd --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --metrics_auth_file="$work/metrics.auth"
metrics=$(sed -n 's|.*metrics \(http://[^ ]*/metrics\).*|\1|p' "$work/log" | head -1)
[ -n "$metrics" ] || fail "the daemon's log names no metrics address"
code=$(curl -s -o /dev/null -w '%{http_code}' "$metrics")
[ "$code" = 401 ] || fail "/metrics without the password answered $code, not 401"
code=$(curl -s -o /dev/null -w '%{http_code}' -u "prometheus:wrong-$password" "$metrics")
[ "$code" = 401 ] || fail "/metrics with a wrong password answered $code, not 401"
curl -sf -u "prometheus:$password" "$metrics" | grep -q "^paramd_" ||
  fail "/metrics with the password gave no paramd series"
echo "PASS: tokens from paramd, paramctl and a training job; SIGHUP takes one away; /metrics asks for its password"
