# Shared by scripts/scale.sh and scripts/watchers.sh (sourced, not run): loopback resd nodes
# under "$work", figures printed as they are measured, and only this script's processes
# stopped. The caller sets `work`, `bin` and `results` and may set `node_flags` (an array).
declare -A pid=() api=() raft=() http=()
cleanup() {
  for p in "${pid[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # KEEP_LOGS=DIR keeps the nodes' logs (RESD_LOG=info makes them say more).
  if [[ -n "${KEEP_LOGS:-}" ]]; then mkdir -p "$KEEP_LOGS" && cp "$work"/*.log "$KEEP_LOGS"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ports() { local node; for node in "$@"; do api[$node]=$(port); raft[$node]=$(port); http[$node]=$(port); done; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }
say() { echo "[$(basename "$0" .sh)] $*" >&2; }
# A figure, said as soon as it is measured (a later step that fails keeps the earlier ones).
row() { echo "| $1 | $2 |" | tee -a "$results" >&2; }

start() {
  local node=$1; shift
  RUST_LOG=${RESD_LOG:-warn} "$bin/resd" agent --insecure --node-id "$node" --data-dir "$work/node$node" \
    --api-addr "127.0.0.1:${api[$node]}" --raft-addr "127.0.0.1:${raft[$node]}" \
    --http-addr "127.0.0.1:${http[$node]}" "${node_flags[@]}" "$@" \
    >>"$work/node$node.log" 2>&1 &
  pid[$node]=$!
}
# Seconds until node answers /readyz with 200 (it serves: caught up, a voter, a leader known).
until_ready() {
  local node=$1 started=$2 limit=${3:-900}
  while ! curl -sf "http://127.0.0.1:${http[$node]}/readyz" >/dev/null 2>&1; do
    if ! kill -0 "${pid[$node]}" 2>/dev/null; then
      say "node $node exited; its log:"; tail -20 "$work/node$node.log" >&2; exit 1
    fi
    if (( $(python3 -c "print(int(float('$(since "$started")') > $limit))") )); then
      say "node $node not ready after ${limit}s"; exit 1
    fi
    sleep 0.1
  done
  since "$started"
}
# Starts nodes 1-3 (1 bootstraps, 2 and 3 join) and waits until all three serve.
three_nodes() {
  start 1 --bootstrap
  until_ready 1 "$(now)" >/dev/null
  start 2 --join "127.0.0.1:${api[1]}"
  start 3 --join "127.0.0.1:${api[1]}"
  until_ready 2 "$(now)" >/dev/null; until_ready 3 "$(now)" >/dev/null
}
rss_mib() { awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/${pid[$1]}/status"; }
# RSS of a process as "total (anon)" MiB: the anonymous part is its own memory; the rest is
# mapped file pages (LMDB's, bbolt's) the kernel may reclaim like page cache.
rss_split() { awk '/VmRSS/ {t=$2} /RssAnon/ {a=$2} END {printf "%.0f (%.0f)", t/1024, a/1024}' "/proc/$1/status"; }
disk_mib() { du -sm "$work/node$1" | cut -f1; }
