#!/usr/bin/env bash
# Idempotent set-up: .venv with the project and its dev extras, Delta's jars for Spark, and the
# S3-compatible server the tests run (versitygw, built with Go when Go is on PATH).
# Needs python3 (3.11+), Java 17+ and Maven on PATH. Safe to rerun: finished steps are skipped.
# Installs nothing outside .venv: no apt-get, no system package, ever.
#
#   scripts/setup.sh              the project, Delta's jars, the S3 server
#   scripts/setup.sh --s3-spark   also Spark's S3A jars (hadoop-aws and the AWS SDK bundle, ~690 MB)
set -euo pipefail

S3_SPARK=0
for arg in "$@"; do
  case "$arg" in
    --s3-spark) S3_SPARK=1 ;;
    *) echo "setup: unknown option $arg (known: --s3-spark)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
VENV="$ROOT/.venv"
JARS="$VENV/jars"
S3_JARS="$VENV/jars-s3"
STAMP="$VENV/.jetlake-setup-stamp"
DELTA_VERSION="4.4.0"
ARTIFACTS=(
  "io.delta:delta-spark_2.13:$DELTA_VERSION"
  "io.delta:delta-storage:$DELTA_VERSION"
)
# S3A for pyspark 4.2.0, whose Hadoop is 3.5.0: hadoop-aws must match it, and the SDK bundle and the
# analytics accelerator are the versions hadoop-aws 3.5.0 declares.
S3_ARTIFACTS=(
  "org.apache.hadoop:hadoop-aws:3.5.0"
  "software.amazon.awssdk:bundle:2.35.4"
  "software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:1.3.1"
)
# The S3-compatible server of the tests and of docker-compose.yml (Apache-2.0); pinned.
VERSITYGW_MODULE="github.com/versity/versitygw"
VERSITYGW_VERSION="v1.8.0"

say() { echo "setup: $*"; }

for tool in python3 java mvn; do
  command -v "$tool" >/dev/null || { echo "setup: '$tool' not found on PATH" >&2; exit 1; }
done

if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating .venv"
  python3 -m venv "$VENV"
fi

want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [[ "$want" != "$have" ]]; then
  say "installing the project and its dev dependencies (first run downloads pyspark, ~400 MB)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[dev]"
  echo "$want" >"$STAMP"
else
  say "python packages up to date"
fi

# fetch_jars DIR ARTIFACT...: each artifact's jar into DIR with Maven, unless it is there already.
fetch_jars() {
  local dir="$1"; shift
  mkdir -p "$dir"
  local artifact group name version jar
  for artifact in "$@"; do
    IFS=: read -r group name version <<<"$artifact"
    jar="$dir/$name-$version.jar"
    if [[ -s "$jar" ]]; then
      say "have $(basename "$jar")"
      continue
    fi
    say "fetching $artifact"
    mvn -B -q dependency:copy -Dartifact="$artifact" -DoutputDirectory="$dir"
    [[ -s "$jar" ]] || { echo "setup: $jar missing after mvn dependency:copy" >&2; exit 1; }
  done
}

fetch_jars "$JARS" "${ARTIFACTS[@]}"

if [[ "$S3_SPARK" == 1 ]]; then
  say "Spark's S3A jars into .venv/jars-s3 (the AWS SDK bundle is ~690 MB; fetched once)"
  fetch_jars "$S3_JARS" "${S3_ARTIFACTS[@]}"
fi

# versitygw_version BINARY: the module version Go recorded in the binary (its --version says "git").
versitygw_version() {
  go version -m "$1" 2>/dev/null | awk '$1 == "mod" && $2 == "'"$VERSITYGW_MODULE"'" { print $3 }'
}

if ! command -v go >/dev/null; then
  if [[ -x "$VENV/bin/versitygw" ]]; then
    say "Go not found: keeping .venv/bin/versitygw as it is (its version cannot be checked)"
  else
    say "Go not found: the S3 server (versitygw) is not installed; the tests that need it will be skipped"
  fi
elif [[ -x "$VENV/bin/versitygw" && "$(versitygw_version "$VENV/bin/versitygw")" == "$VERSITYGW_VERSION" ]]; then
  say "have versitygw $VERSITYGW_VERSION"
else
  say "building versitygw $VERSITYGW_VERSION into .venv/bin (about a minute on 2 cores)"
  build="$(mktemp -d)"
  GOBIN="$build" go install "$VERSITYGW_MODULE/cmd/versitygw@$VERSITYGW_VERSION"
  mv -f "$build/versitygw" "$VENV/bin/versitygw"
  rmdir "$build"
fi

# The nats CLI (natscli v0.5.0) for the NATS door's tests and bench/nats_protocol.py, built with Go.
NATSCLI_VERSION="v0.5.0"
if [[ -x "$VENV/bin/nats" ]] && "$VENV/bin/nats" --version 2>/dev/null | grep -qx "$NATSCLI_VERSION"; then
  say "have nats CLI $NATSCLI_VERSION"
elif command -v go >/dev/null; then
  say "building the nats CLI $NATSCLI_VERSION with Go (a few minutes the first time)"
  GOBIN="$VENV/bin" go install "github.com/nats-io/natscli/nats@$NATSCLI_VERSION" \
    || say "building the nats CLI failed; its tests will be skipped"
else
  say "Go not found: the nats CLI is not built; its tests (tests/nats/test_cli.py) will be skipped"
fi

# Bytecode for the project's modules now, so that a gateway's first start does not compile ~115
# modules (and none does where PYTHONDONTWRITEBYTECODE is set); Python refreshes stale files itself.
"$VENV/bin/python" -m compileall -q -j 0 engine api jobs >/dev/null || say "compiling bytecode failed; starts are slower"

say "done (.venv ready, jars in .venv/jars)"
