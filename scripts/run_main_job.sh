#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, runs the main job
# (scripts/main_job.sh: the daemon plus a 2-rank training job through it, checked bit for bit).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
exec "$root/scripts/main_job.sh"
