#!/usr/bin/env bash
# The S3-compatible server of the tests, CI and local trials: versitygw on 127.0.0.1:PORT, every
# top-level folder of DIR a bucket, access key `jetlake`, secret `jetlake-secret`. Runs in the
# foreground; SIGTERM (or Ctrl-C) stops it. scripts/setup.sh builds the binary into .venv/bin.
# JETLAKE_S3_HOST changes the address (docker-compose.yml: 0.0.0.0 inside its network); ROOT_ACCESS_KEY
# and ROOT_SECRET_KEY change the keys.
#
#   scripts/s3-server.sh DIR PORT
#   AWS_ENDPOINT_URL=http://127.0.0.1:PORT AWS_ACCESS_KEY_ID=jetlake AWS_SECRET_ACCESS_KEY=jetlake-secret \
#   AWS_REGION=us-east-1 AWS_ALLOW_HTTP=true .venv/bin/jetlake serve --warehouse s3://jetlake/wh
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 DIR PORT" >&2
  exit 2
fi
DIR="$1"
PORT="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${JETLAKE_VERSITYGW:-$ROOT/.venv/bin/versitygw}"
if [[ ! -x "$BIN" ]]; then
  echo "s3-server: $BIN not found; run scripts/setup.sh with Go on PATH to build it" >&2
  exit 1
fi
mkdir -p "$DIR"

export ROOT_ACCESS_KEY="${ROOT_ACCESS_KEY:-jetlake}"
export ROOT_SECRET_KEY="${ROOT_SECRET_KEY:-jetlake-secret}"
# exec: the server is this process, so SIGTERM sent to the script's PID reaches it directly.
exec "$BIN" --port "${JETLAKE_S3_HOST:-127.0.0.1}:$PORT" posix "$DIR"
