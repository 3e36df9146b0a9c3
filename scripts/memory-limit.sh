#!/usr/bin/env bash
# How much memory resd needs, as opposed to how much it shows (issue 41): a 3-node cluster on
# loopback, each node in its own memory cgroup limited to SCALE_LIMIT_MIB, loaded with N
# resources of 1 KiB, then listed whole. Most of a node's RSS is LMDB's file mapped into it
# (every page LMDB reads, and the kernel's fault-around maps up to 15 cached neighbours with
# it); under a limit the kernel takes those pages back, and the figures say what that costs.
# Prints the load time, RSS per node (total and anonymous) and a paged list's time, with the
# same without a limit for comparison. Needs root and a cgroup memory controller (v1 or v2).
#
#   cargo build --release -p server -p ctl
#   scripts/memory-limit.sh                                   # N=200,000, limit 256 MiB
#   SCALE_N=1000000 SCALE_LIMIT_MIB=768 scripts/memory-limit.sh
#
# RESD_BIN: the directory of resd and resctl (default target/release). Everything runs under a
# temporary directory and temporary cgroups, removed at the end; only processes this script
# started are stopped.
set -euo pipefail
n=${SCALE_N:-200000}
limit_mib=${SCALE_LIMIT_MIB:-256}
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RESD_BIN:-$root/target/release}"
work="$(mktemp -d -t resd-memory-XXXXXX)"
results="$work/results.md"
node_flags=()
# shellcheck source=scripts/cluster-lib.sh
source "$root/scripts/cluster-lib.sh"

# The directory under which this script may make memory cgroups, and how a limit is written.
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  parent="/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)"
  limit_file=memory.max
  grep -qw memory "$parent/cgroup.subtree_control" 2>/dev/null \
    || echo +memory >"$parent/cgroup.subtree_control" 2>/dev/null || true
else
  parent="/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)"
  limit_file=memory.limit_in_bytes
fi
[[ -w "$parent" ]] || { say "cannot make memory cgroups under $parent (run as root)"; exit 1; }
groups=()
remove_groups() {
  cleanup
  local group
  for group in "${groups[@]}"; do rmdir "$group" 2>/dev/null || true; done
}
trap remove_groups EXIT

# Starts node $1 inside cgroup $2 (a limit already written), like cluster-lib's `start`.
start_in() {
  local node=$1 group=$2; shift 2
  RUST_LOG=${RESD_LOG:-warn} sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$group" \
    "$bin/resd" agent --insecure --node-id "$node" --data-dir "$work/node$node" \
    --api-addr "127.0.0.1:${api[$node]}" --raft-addr "127.0.0.1:${raft[$node]}" \
    --http-addr "127.0.0.1:${http[$node]}" "$@" >>"$work/node$node.log" 2>&1 &
  pid[$node]=$!
}

# One run: 3 nodes limited to $1 MiB each (0: no limit), loaded and listed; prints a row.
run() {
  local limit=$1 what node group t load listed list
  what=$([[ "$limit" == 0 ]] && echo "no limit" || echo "limit $limit MiB per node")
  say "$what: starting 3 nodes"
  for node in 1 2 3; do
    group="$parent/resd-memory-$$-$node"
    mkdir -p "$group"; groups+=("$group")
    [[ -f "$group/$limit_file" ]] \
      || { say "no memory controller in $group (cgroup v2 needs +memory in the parent's subtree_control)"; exit 1; }
    if [[ "$limit" != 0 ]]; then echo $((limit << 20)) >"$group/$limit_file"; fi
  done
  ports 1 2 3
  start_in 1 "$parent/resd-memory-$$-1" --bootstrap
  until_ready 1 "$(now)" >/dev/null
  start_in 2 "$parent/resd-memory-$$-2" --join "127.0.0.1:${api[1]}"
  start_in 3 "$parent/resd-memory-$$-3" --join "127.0.0.1:${api[1]}"
  until_ready 2 "$(now)" >/dev/null; until_ready 3 "$(now)" >/dev/null
  say "$what: loading $n resources of 1 KiB"
  t=$(now)
  "$bin/resctl" --server "127.0.0.1:${api[1]},127.0.0.1:${api[2]},127.0.0.1:${api[3]}" \
    bench --workload write -c 64 -N "$n" --keys "$n" --value-size 1024 --keep -o json >/dev/null
  load=$(since "$t")
  t=$(now)
  listed=$("$bin/resctl" --server "127.0.0.1:${api[1]}" get demo.v1.Artist -A -o name | wc -l)
  list=$(since "$t")
  row "$what" "load $load s; RSS MiB, total (anonymous): $(rss_split "${pid[1]}") / $(rss_split "${pid[2]}") / $(rss_split "${pid[3]}"); paged list $list s ($listed listed); state file $(du -m "$work"/node1/raft/sm/*/data.mdb | cut -f1 | tail -1) MiB"
  for node in 1 2 3; do kill "${pid[$node]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pid=()
  rm -rf "$work"/node[0-9]
}

echo "| $n resources of 1 KiB, 3 nodes | figures |" >"$results"
echo "|---|---|" >>"$results"
run 0
run "$limit_mib"
cat "$results"
