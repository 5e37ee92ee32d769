#!/usr/bin/env bash
# SQLite mode of the peer benchmark: the shared harness's driver and workloads,
# with every peer storing its jobs in a SQLite file (WAL) of its own.
#
#   benchmarks/sqlite/run.sh                      every peer
#   benchmarks/sqlite/run.sh later_django huey    only those
#
# Results: $BENCH_OUT (default ./bench-results/sqlite)/results.{json,md}, plus
# raw/ (one JSON per peer, pip freezes) and logs/. See benchmarks/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PEERS_ALL=(later_django django_tasks_db django_q2 huey)
COMMON=$(cd "${BENCH_PEERS_DIR:-$REPO/../shared/bench/peers}/common" && pwd)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/later-bench/sqlite-venvs
PY=${BENCH_PYTHON:-python3}
PEER_TIMEOUT=${BENCH_PEER_TIMEOUT_S:-300}
# Later repetitions are skipped past this many seconds per peer (driver.py).
export BENCH_PEER_BUDGET_S=${BENCH_PEER_BUDGET_S:-150}
mkdir -p "${BENCH_OUT:-./bench-results/sqlite}"
OUT=$(cd "${BENCH_OUT:-./bench-results/sqlite}" && pwd)

log() { printf '[sqlite/run.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

PEERS=()
for arg in "$@"; do
  p=${arg//-/_}
  case "$p" in django_tasks) p=django_tasks_db ;; django_q) p=django_q2 ;; esac
  if [ ! -f "$HERE/$p/adapter.py" ]; then
    echo "unknown peer '$arg' (known: ${PEERS_ALL[*]})" >&2
    exit 2
  fi
  PEERS+=("$p")
done
[ ${#PEERS[@]} -gt 0 ] || PEERS=("${PEERS_ALL[@]}")

# ---------------------------------------------------------------- cleanup
TMP="" CHILD_PID=""

stop_leftovers() {  # workers of a driver that was killed: found by this run's folder
  local environ pid pgid own
  own=$(ps -o pgid= -p $$ | tr -d ' ')
  for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    tr '\0' '\n' 2>/dev/null <"$environ" | grep -qF "BENCH_SQLITE_PATH=$TMP/" || continue
    pgid=$(ps -o pgid= -p "$pid" | tr -d ' ') || continue
    if [ -n "$pgid" ] && [ "$pgid" != "$own" ]; then
      log "stopping leftover process group $pgid"
      kill -KILL -- "-$pgid" 2>/dev/null
    fi
  done
}

cleanup() {
  local rc=$?
  set +e
  trap - INT TERM
  if [ -n "$CHILD_PID" ] && kill -0 "$CHILD_PID" 2>/dev/null; then
    log "stopping driver (pid $CHILD_PID)"
    kill -TERM "$CHILD_PID"
    wait "$CHILD_PID" 2>/dev/null
  fi
  if [ -n "$TMP" ]; then
    stop_leftovers
    [ -n "${BENCH_KEEP_TMP:-}" ] || rm -rf "$TMP"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- steps
ensure_venv() {  # the peer's own virtualenv; reinstalled when requirements.txt changes
  local name=$1 venv="$CACHE/$1" req="$HERE/$1/requirements.txt" stamp
  stamp=$(sha256sum "$req" | cut -c1-16)
  if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv"
    "$PY" -m venv "$venv"
  fi
  if [ "$(cat "$venv/.bench-stamp" 2>/dev/null)" != "$stamp" ] || [ -n "${BENCH_UPGRADE:-}" ]; then
    log "pip install -r $name/requirements.txt (latest releases)"
    # From the file's own folder, so that "-e ../../.." means this repository.
    (cd "$HERE/$name" && "$venv/bin/pip" install -q --upgrade -r "$req") \
      >"$OUT/logs/pip-$name.log" 2>&1 || return 1
    echo "$stamp" >"$venv/.bench-stamp"
  fi
  "$venv/bin/pip" freeze >"$OUT/raw/$name.freeze.txt" 2>/dev/null
}

run_child() {  # in the background, so that the trap can stop it
  "$@" &
  CHILD_PID=$!
  local rc=0
  wait "$CHILD_PID" || rc=$?
  CHILD_PID=""
  return "$rc"
}

failed_peer() {  # a result file for a peer that could not run at all
  "$PY" -c 'import json,sys; json.dump({"peer": sys.argv[1], "workloads": {}, "errors": [sys.argv[2]]}, open(sys.argv[3], "w"), indent=2)' \
    "$1" "$2" "$OUT/raw/$1.json"
}

# ---------------------------------------------------------------- main
mkdir -p "$OUT/raw" "$OUT/logs"
rm -f "$OUT"/raw/*.json "$OUT"/raw/*.freeze.txt "$OUT"/logs/*.log "$OUT"/results.*
TMP=$(mktemp -d "${TMPDIR:-/tmp}/later-bench-sqlite.XXXXXX")
# Adapters import sqlitebench; spawn() hands PYTHONPATH on to the workers.
export PYTHONPATH="$HERE/common${PYTHONPATH:+:$PYTHONPATH}"
export BENCH_SQLITE_SYNCHRONOUS=${BENCH_SQLITE_SYNCHRONOUS:-NORMAL}
t_start=$SECONDS

for p in "${PEERS[@]}"; do
  log "=== $p"
  if ! ensure_venv "$p"; then
    log "$p: pip install failed (logs/pip-$p.log)"
    failed_peer "$p" "pip install failed: $(tail -n 3 "$OUT/logs/pip-$p.log" | tr '\n' ' ')"
    continue
  fi
  mkdir "$TMP/$p"
  BENCH_SQLITE_PATH="$TMP/$p/jobs.sqlite3" TMPDIR="$TMP/$p" \
    run_child timeout --signal=TERM --kill-after=60 "$PEER_TIMEOUT" \
      "$CACHE/$p/bin/python" "$COMMON/driver.py" --peer-dir "$HERE/$p" \
      --out "$OUT/raw/$p.json" --log-dir "$OUT/logs" \
    || log "$p: driver reported errors (see results.md and logs/)"
  [ -f "$OUT/raw/$p.json" ] || failed_peer "$p" "driver wrote no result (timeout or crash)"
  stop_leftovers
done

"$PY" "$HERE/summary.py" --raw "$OUT/raw" --logs "$OUT/logs" --out "$OUT" \
  --order "$(IFS=,; echo "${PEERS[*]}")" --common "$COMMON"
log "took $((SECONDS - t_start)) s; results: $OUT/results.md and $OUT/results.json"
