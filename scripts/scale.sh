#!/usr/bin/env bash
# How resd's cost grows with its data (issue 41): a 3-node cluster on loopback loaded with N
# resources of 1 KiB, then measured — load time, RSS and disk per node, a paged list of
# everything, a selector matching 1 %, a clean and an unclean restart to serving, a new node
# joining until it serves (an InstallSnapshot of the whole state), and an operator snapshot
# saved and restored. Then the same workloads, where they translate, against a 3-node etcd
# (3.4) with N keys of 1 KiB, loaded by ../shared/bench's anchorbench and paged by
# `ctl/examples/etcd_pages.rs` as Kubernetes pages etcd. Prints a Markdown table, resd and etcd
# side by side; every figure comes from this one run.
#
#   cargo build --release -p server -p ctl --example etcd_pages
#   scripts/scale.sh                 # N=1,000,000 (about 40 minutes on 2 cores)
#   SCALE_N=100000 scripts/scale.sh  # a quicker look
#   SCALE_ETCD=0 scripts/scale.sh    # resd only
#
# RESD_BIN: the directory of resd, resctl and examples/etcd_pages (default target/release).
# ANCHORBENCH: the anchorbench binary (default: built from ../shared/bench). Everything runs
# under a temporary directory, removed at the end; only processes this script started are
# stopped.
set -euo pipefail
n=${SCALE_N:-1000000}
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RESD_BIN:-$root/target/release}"
work="$(mktemp -d -t resd-scale-XXXXXX)"
results="$work/results.md"
node_flags=(--snapshot-every 100000)
# shellcheck source=scripts/cluster-lib.sh
source "$root/scripts/cluster-lib.sh"
ports 1 2 3 4
# A figure of resd (key, what, value) or of etcd (key, value), said as soon as measured.
figure() { echo "$1|$2|$3" >>"$work/resd.rows"; echo "| $2 | resd: $3 |" >&2; }
etcd_figure() { echo "$1|$2" >>"$work/etcd.rows"; echo "| $1 | etcd: $2 |" >&2; }

resctl() { "$bin/resctl" --server "127.0.0.1:${api[1]},127.0.0.1:${api[2]},127.0.0.1:${api[3]}" "$@"; }

say "starting 3 nodes"
three_nodes

say "loading $n resources of 1 KiB"
t=$(now)
resctl bench --workload write -c 64 -N "$n" --keys "$n" --value-size 1024 --keep -o json >"$work/load.json"
load_s=$(since "$t")
load_rate=$(python3 -c "import json; print(round(json.load(open('$work/load.json')).get('per_second', 0)))")
figure load "load (64 writes in flight)" "${load_s} s (${load_rate} writes/s)"

say "memory and disk"
figure rss "RSS per node after load, MiB: total (anonymous)" "$(rss_split "${pid[1]}") / $(rss_split "${pid[2]}") / $(rss_split "${pid[3]}")"
figure disk "disk per node (MiB)" "$(disk_mib 1) / $(disk_mib 2) / $(disk_mib 3)"

say "a paged list of everything"
t=$(now)
listed=$(resctl get demo.v1.Artist -A -o name | wc -l)
figure list "paged list of everything (pages of 500)" "$(since "$t") s ($listed listed)"
# Reading everything maps every page of the file it was read from (resd's LMDB, etcd's bbolt).
figure rss_listed "RSS per node after that list, MiB: total (anonymous)" "$(rss_split "${pid[1]}") / $(rss_split "${pid[2]}") / $(rss_split "${pid[3]}")"

say "labelling 1 % and selecting it"
resctl get demo.v1.Artist -A -o name | awk -v every=100 'NR % every == 0' | sed 's|.*/||' \
  | head -n $((n / 100)) >"$work/labelled"
ns=$(resctl get demo.v1.Artist -A -o jsonpath='{.items[0].tenancy.namespace}')
xargs -P 8 -I{} "$bin/resctl" --server "127.0.0.1:${api[1]}" -n "$ns" label demo.v1.Artist {} scale=one-percent \
  <"$work/labelled" >/dev/null
t=$(now)
selected=$(resctl get demo.v1.Artist -A -l scale=one-percent -o name | wc -l)
figure selector "selector matching 1 %" "$(since "$t") s ($selected selected)"

say "operator snapshot save"
t=$(now)
resctl snapshot save "$work/state.snap" >/dev/null
figure save "operator snapshot save" "$(since "$t") s ($(du -m "$work/state.snap" | cut -f1) MiB)"

say "clean restart of node 3"
kill -TERM "${pid[3]}"; wait "${pid[3]}" 2>/dev/null || true
t=$(now); RESD_LOG=${RESD_LOG:-info} start 3 --join "127.0.0.1:${api[1]}"
figure clean "clean restart (SIGTERM) to serving" "$(until_ready 3 "$t") s"

say "unclean restart of node 3 (SIGKILL)"
kill -KILL "${pid[3]}"; wait "${pid[3]}" 2>/dev/null || true
t=$(now); RESD_LOG=${RESD_LOG:-info} start 3 --join "127.0.0.1:${api[1]}"
figure unclean "unclean restart (SIGKILL) to serving" "$(until_ready 3 "$t") s"

say "a new node joins and serves"
t=$(now); start 4 --join "127.0.0.1:${api[1]}"
joined=$(until_ready 4 "$t")
figure join "a new node joins until it serves" "$joined s (RSS then $(rss_mib 4) MiB)"
# The restore runs on three nodes, as the load did (and a fourth copy of everything, staged
# and snapshotted, does not fit every disk this runs on).
resctl cluster remove 4 >/dev/null
kill -TERM "${pid[4]}"; wait "${pid[4]}" 2>/dev/null || true
unset 'pid[4]'
rm -rf "$work/node4"

say "operator snapshot restore"
t=$(now)
resctl snapshot restore "$work/state.snap" --yes >/dev/null
figure restore "operator snapshot restore" "$(since "$t") s"

for node in "${!pid[@]}"; do kill "${pid[$node]}" 2>/dev/null || true; done
wait 2>/dev/null || true
pid=()
rm -rf "$work"/node[0-9]

# The anchorbench binary for the etcd column on stdout, or why there is no etcd column.
etcd_column() {
  if [[ "${SCALE_ETCD:-1}" == 0 ]]; then echo "SCALE_ETCD=0"; return 1; fi
  command -v etcd >/dev/null && command -v etcdctl >/dev/null \
    || { echo "etcd and etcdctl are not on PATH (Debian: apt-get install etcd-server etcd-client)"; return 1; }
  [[ -x "$bin/examples/etcd_pages" ]] \
    || { echo "$bin/examples/etcd_pages is missing: cargo build --release -p ctl --example etcd_pages"; return 1; }
  local shared="$root/../shared/bench"
  [[ -x "$shared/scripts/etcd-cluster.sh" ]] || { echo "no $shared (its scripts start etcd)"; return 1; }
  if [[ -n "${ANCHORBENCH:-}" ]]; then echo "$ANCHORBENCH"; return 0; fi
  (cd "$shared" && cargo build --release -q) >&2 || { echo "anchorbench did not build"; return 1; }
  echo "${CARGO_TARGET_DIR:-$shared/target}/release/anchorbench"
}
if ! anchorbench=$(etcd_column); then
  say "no etcd column: $anchorbench"
else
  cluster="$root/../shared/bench/scripts/etcd-cluster.sh"
  export ANCHOR_BASE="$work/anchor" ETCD_EXTRA="--quota-backend-bytes=17179869184 --snapshot-count=100000"
  etcd_stop() { "$cluster" stop 3 >/dev/null 2>&1 || true; }
  trap 'etcd_stop; cleanup' EXIT
  say "etcd: starting 3 members"
  "$cluster" start 3 >&2
  eps=$("$cluster" eps 3)
  etcd_pid() { cat "$ANCHOR_BASE/etcd3/$1.pid"; }
  etcd_rss() { rss_split "$(etcd_pid "$1")"; }
  etcd_disk() { du -sm "$ANCHOR_BASE/etcd3/$1" | cut -f1; }
  etcd_serving() { # seconds from $2 until member $1 answers a serializable read of the last key
    local ep
    ep=$(echo "$eps" | tr ',' '\n' | sed -n "${1#m}p")
    until etcdctl --endpoints="$ep" --dial-timeout=1s --command-timeout=2s get --consistency=s \
        "bench/put/$(printf %08d $((n - 1)))" 2>/dev/null | grep -q .; do sleep 0.1; done
    since "$2"
  }
  say "etcd: loading $n keys of 1 KiB"
  t=$(now)
  "$anchorbench" --backend etcd --endpoints "$eps" --clients 64 --max-secs 3600 --label scale \
    --out "$work/etcd-load.jsonl" put --total "$n" --keys "$n" --key-dist seq --value-size 1024 >&2
  etcd_figure load "$(since "$t") s"
  etcd_figure rss "$(etcd_rss m1) / $(etcd_rss m2) / $(etcd_rss m3)"
  etcd_figure disk "$(etcd_disk m1) / $(etcd_disk m2) / $(etcd_disk m3)"
  say "etcd: a paged range of everything"
  paged=$("$bin/examples/etcd_pages" "$(echo "$eps" | cut -d, -f1)" bench/put/ 500)
  etcd_figure list "$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(f\"{d['seconds']:.2f} s ({d['keys']} listed)\")" "$paged")"
  etcd_figure rss_listed "$(etcd_rss m1) / $(etcd_rss m2) / $(etcd_rss m3)"
  etcd_figure selector "— (etcd has no selectors)"
  say "etcd: snapshot save"
  t=$(now)
  etcdctl --endpoints="$(echo "$eps" | cut -d, -f1)" --command-timeout=600s snapshot save "$work/etcd.snap" >/dev/null
  etcd_figure save "$(since "$t") s ($(du -m "$work/etcd.snap" | cut -f1) MiB)"
  rm -f "$work/etcd.snap"
  say "etcd: clean restart of m3"
  "$cluster" stop-member 3 m3
  t=$(now); "$cluster" start-member 3 m3
  etcd_figure clean "$(etcd_serving m3 "$t") s"
  say "etcd: unclean restart of m3 (SIGKILL)"
  kill -KILL "$(etcd_pid m3)"; sleep 0.5
  t=$(now); "$cluster" start-member 3 m3
  etcd_figure unclean "$(etcd_serving m3 "$t") s"
  say "etcd: a new member joins and serves"
  initial=$(echo "$eps" | tr ',' '\n' | awk -F: '{printf "%sm%d=http://127.0.0.1:%d", (NR>1?",":""), NR, $3 + 10}')
  # etcd refuses a member while one restarted moments ago (its strict reconfiguration check).
  for attempt in $(seq 1 60); do
    etcdctl --endpoints="$eps" member add m4 --peer-urls=http://127.0.0.1:23804 >/dev/null 2>&1 && break
    (( attempt < 60 )) || { say "etcd refused the new member for a minute"; exit 1; }
    sleep 1
  done
  t=$(now)
  etcd --name m4 --data-dir "$ANCHOR_BASE/etcd3/m4" --listen-client-urls http://127.0.0.1:23794 \
    --advertise-client-urls http://127.0.0.1:23794 --listen-peer-urls http://127.0.0.1:23804 \
    --initial-advertise-peer-urls http://127.0.0.1:23804 --initial-cluster-state existing \
    --initial-cluster "$initial,m4=http://127.0.0.1:23804" --quota-backend-bytes=17179869184 \
    >>"$ANCHOR_BASE/etcd3/m4.log" 2>&1 &
  pid[etcd4]=$!
  eps="$eps,http://127.0.0.1:23794"
  etcd_figure join "$(etcd_serving m4 "$t") s (RSS then $(awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/${pid[etcd4]}/status") MiB)"
  etcd_figure restore "— (etcd restores offline, member by member)"
  etcd_stop
fi

echo
echo "| figure (N = $n objects of 1 KiB, 3 nodes on loopback) | resd | etcd 3.4 |"
echo "|---|---|---|"
python3 - "$work/resd.rows" "$work/etcd.rows" <<'PY'
import os, sys
etcd = {}
if os.path.exists(sys.argv[2]):
    for line in open(sys.argv[2]):
        key, value = line.rstrip("\n").split("|", 1)
        etcd[key] = value
for line in open(sys.argv[1]):
    key, what, value = line.rstrip("\n").split("|", 2)
    print(f"| {what} | {value} | {etcd.get(key, '—')} |")
PY
