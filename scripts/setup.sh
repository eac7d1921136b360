#!/usr/bin/env bash
# Idempotent set-up: .venv with the project and its dev extras, plus Delta's jars for Spark.
# Needs python3 (3.11+), Java 17+ and Maven on PATH. Safe to rerun: finished steps are skipped.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
VENV="$ROOT/.venv"
JARS="$VENV/jars"
STAMP="$VENV/.jetlake-setup-stamp"
DELTA_VERSION="4.4.0"
ARTIFACTS=(
  "io.delta:delta-spark_2.13:$DELTA_VERSION"
  "io.delta:delta-storage:$DELTA_VERSION"
)

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

mkdir -p "$JARS"
for artifact in "${ARTIFACTS[@]}"; do
  IFS=: read -r group name version <<<"$artifact"
  jar="$JARS/$name-$version.jar"
  if [[ -s "$jar" ]]; then
    say "have $(basename "$jar")"
    continue
  fi
  say "fetching $artifact"
  mvn -B -q dependency:copy -Dartifact="$artifact" -DoutputDirectory="$JARS"
  [[ -s "$jar" ]] || { echo "setup: $jar missing after mvn dependency:copy" >&2; exit 1; }
done

# The docker-compose test validates docker-compose.yml with Debian's docker-compose (no engine needed).
if ! command -v docker-compose >/dev/null && command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
  say "installing Debian's docker-compose (to validate docker-compose.yml)"
  apt-get update -qq >/dev/null && apt-get install -y -qq docker-compose >/dev/null || say "docker-compose not installed; its test will be skipped"
fi

say "done (.venv ready, jars in .venv/jars)"
