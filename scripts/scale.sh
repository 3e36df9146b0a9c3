#!/usr/bin/env bash
# How resd's cost grows with its data (issue 41): a 3-node cluster on loopback loaded with N
# resources of 1 KiB, then measured — load time, RSS and disk per node, a paged list of
# everything, a selector matching 1 %, a clean and an unclean restart to serving, a new node
# joining until it serves (an InstallSnapshot of the whole state), and an operator snapshot
# saved and restored. Prints a Markdown table; every figure comes from this one run.
#
#   cargo build --release -p server -p ctl
#   scripts/scale.sh                 # N=1,000,000 (about half an hour on 2 cores)
#   SCALE_N=100000 scripts/scale.sh  # a quicker look
#
# RESD_BIN: the directory of resd and resctl (default target/release). Everything runs under a
# temporary directory, removed at the end; only processes this script started are stopped.
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

resctl() { "$bin/resctl" --server "127.0.0.1:${api[1]},127.0.0.1:${api[2]},127.0.0.1:${api[3]}" "$@"; }

say "starting 3 nodes"
three_nodes

say "loading $n resources of 1 KiB"
t=$(now)
resctl bench --workload write -c 64 -N "$n" --keys "$n" --value-size 1024 --keep -o json >"$work/load.json"
load_s=$(since "$t")
load_rate=$(python3 -c "import json; print(round(json.load(open('$work/load.json')).get('per_second', 0)))")
row "load (resctl bench write, 64 in flight)" "${load_s} s (${load_rate} writes/s)"

say "memory and disk"
row "RSS per node after load (MiB)" "$(rss_mib 1) / $(rss_mib 2) / $(rss_mib 3)"
row "disk per node (MiB)" "$(disk_mib 1) / $(disk_mib 2) / $(disk_mib 3)"

say "a paged list of everything"
t=$(now)
listed=$(resctl get demo.v1.Artist -A -o name | wc -l)
row "paged list of everything ($listed listed, pages of 500)" "$(since "$t") s"

say "labelling 1 % and selecting it"
resctl get demo.v1.Artist -A -o name | awk -v every=100 'NR % every == 0' | sed 's|.*/||' \
  | head -n $((n / 100)) >"$work/labelled"
ns=$(resctl get demo.v1.Artist -A -o jsonpath='{.items[0].tenancy.namespace}')
xargs -P 8 -I{} "$bin/resctl" --server "127.0.0.1:${api[1]}" -n "$ns" label demo.v1.Artist {} scale=one-percent \
  <"$work/labelled" >/dev/null
t=$(now)
selected=$(resctl get demo.v1.Artist -A -l scale=one-percent -o name | wc -l)
row "selector matching 1 % ($selected selected)" "$(since "$t") s"

say "operator snapshot save"
t=$(now)
resctl snapshot save "$work/state.snap" >/dev/null
row "operator snapshot save ($(du -m "$work/state.snap" | cut -f1) MiB)" "$(since "$t") s"

say "clean restart of node 3"
kill -TERM "${pid[3]}"; wait "${pid[3]}" 2>/dev/null || true
t=$(now); start 3 --join "127.0.0.1:${api[1]}"
row "clean restart to serving" "$(until_ready 3 "$t") s"

say "unclean restart of node 3 (SIGKILL)"
kill -KILL "${pid[3]}"; wait "${pid[3]}" 2>/dev/null || true
t=$(now); start 3 --join "127.0.0.1:${api[1]}"
row "unclean restart (SIGKILL) to serving" "$(until_ready 3 "$t") s"

say "a new node joins and serves"
t=$(now); start 4 --join "127.0.0.1:${api[1]}"
joined=$(until_ready 4 "$t")
row "a new node joins until it serves (RSS then $(rss_mib 4) MiB)" "$joined s"

say "operator snapshot restore"
t=$(now)
resctl snapshot restore "$work/state.snap" --yes >/dev/null
row "operator snapshot restore" "$(since "$t") s"

echo
echo "| figure (N = $n resources of 1 KiB, 3 nodes on loopback) | value |"
echo "|---|---|"
cat "$results"
