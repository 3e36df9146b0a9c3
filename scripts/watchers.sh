#!/usr/bin/env bash
# What many watchers, and stalled ones, cost (issue 41): a 3-node cluster on loopback, every
# watch on node 1, the same writes measured without watches, with 10,000 reading watches, and
# with 10,000 of which 100 never read (a consumer that stopped: etcd issues #16839, #18109 and
# #22264). Reading watches select a label group each (`resctl bench --watch-groups`: with
# 10,000 groups each write reaches one of them, as a platform's controllers each watch their
# own share; GROUPS_OF_WATCHES=100 makes each write reach 100); stalled ones select every write,
# so they stop reading with the whole type's changes coming. Prints a Markdown table; every
# figure comes from this one run.
#
#   cargo build --release -p server -p ctl
#   scripts/watchers.sh                               # 10,000 watchers, 100 stalled
#   WATCHERS=1000 STALLED=10 WRITES=5000 scripts/watchers.sh   # a quicker look
#
# RESD_BIN: the directory of resd and resctl (default target/release). Everything runs under a
# temporary directory, removed at the end; only processes this script started are stopped.
set -euo pipefail
watchers=${WATCHERS:-10000}
stalled=${STALLED:-100}
writes=${WRITES:-20000}
groups=${GROUPS_OF_WATCHES:-10000}
keys=${KEYS:-$groups}
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RESD_BIN:-$root/target/release}"
work="$(mktemp -d -t resd-watchers-XXXXXX)"
results="$work/results.md"
node_flags=(--max-watches-per-token $((watchers * 2)))
# shellcheck source=scripts/cluster-lib.sh
source "$root/scripts/cluster-lib.sh"
ports 1 2 3

say "starting 3 nodes"
three_nodes

# Samples node 1's RSS every 100 ms into $1 until the file $1.stop appears.
sample_rss() {
  local out=$1
  : >"$out"
  while [[ ! -e "$out.stop" ]]; do rss_mib 1 >>"$out"; echo >>"$out"; sleep 0.1; done
}
peak() { sort -n "$1" | tail -1; }
# Runs `resctl bench` against node 1 with node 1's RSS sampled; the report goes to $1.json,
# the peak RSS to $1.peak.
bench() {
  local name=$1; shift
  sample_rss "$work/$name.rss" & local sampler=$!
  "$bin/resctl" --server "127.0.0.1:${api[1]}" bench -c 16 --keys "$keys" --value-size 1024 -o json "$@" \
    >"$work/$name.json"
  touch "$work/$name.rss.stop"; wait "$sampler"
  peak "$work/$name.rss" >"$work/$name.peak"
}
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, d))" "$work/$1.json" "$2"; }

idle=$(rss_mib 1)
row "node 1 RSS, idle (MiB)" "$idle"

say "$writes writes, no watches"
bench none --workload write -N "$writes"
row "put p99 / p50, no watches (ms)" "$(field none 'round(latency_ms["p99"],2)') / $(field none 'round(latency_ms["p50"],2)')"

say "opening $watchers watches and writing once (memory per watch)"
bench opened --workload watch -N 1 --watchers "$watchers" --watch-groups "$groups"
per=$(python3 -c "print(round(($(cat "$work/opened.peak") - $idle) * 1024 / $watchers, 1))")
row "node 1 RSS with $watchers open watches (MiB; KiB per watch)" "$(cat "$work/opened.peak") ($per)"

say "$writes writes, $watchers reading watches"
bench readers --workload watch -N "$writes" --watchers "$watchers" --watch-groups "$groups"
row "put p99 / p50, $watchers reading watches (ms)" "$(field readers 'round(latency_ms["p99"],2)') / $(field readers 'round(latency_ms["p50"],2)')"
row "  write → event p99, events delivered" "$(field readers 'round(watch_delay_ms["p99"],2)') ms, $(field readers 'str(fan_out["delivered_events"]) + " of " + str(fan_out["expected_events"])')"
row "  node 1 peak RSS (MiB)" "$(cat "$work/readers.peak")"

say "$writes writes, $watchers watches of which $stalled never read"
bench stalled --workload watch -N "$writes" --watchers "$watchers" --stalled "$stalled" --watch-groups "$groups"
row "put p99 / p50, $watchers watches, $stalled stalled (ms)" "$(field stalled 'round(latency_ms["p99"],2)') / $(field stalled 'round(latency_ms["p50"],2)')"
row "  write → event p99, events delivered to readers, readers disturbed" "$(field stalled 'round(watch_delay_ms["p99"],2)') ms, $(field stalled 'str(fan_out["delivered_events"]) + " of " + str(fan_out["expected_events"])'), $(field stalled 'fan_out["disturbed_readers"]')"
row "  node 1 peak RSS (MiB)" "$(cat "$work/stalled.peak")"
row "put p99 with $stalled stalled ÷ put p99 without watches" \
  "$(python3 -c "print(round($(field stalled 'latency_ms["p99"]') / $(field none 'latency_ms["p99"]'), 2))")"

echo
echo "| figure ($writes writes of 1 KiB over $keys resources, 16 in flight; watches on node 1 of 3; $groups groups) | value |"
echo "|---|---|"
cat "$results"
