#!/usr/bin/env bash
# Write throughput of a registered type with two CEL rules against demo.v2.Artist (built in,
# hooks in Rust), on one 3-node loopback cluster from target/release, runs interleaved.
#
#   cargo build --release -p server -p ctl
#   scripts/rules-bench.sh [ROUNDS] [CONCURRENCY] [COUNT]     # default 3 64 20000
#
# The registered type is bench.v1.Note (the data resctl bench writes: `name`, `description`);
# its rules read every byte of the description (a size bound and a regex).
set -euo pipefail
rounds=${1:-3}; concurrency=${2:-64}; count=${3:-20000}
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RESD_BIN:-$root/target/release}"
work="$(mktemp -d -t resd-rules-bench-XXXXXX)"
results="$work/results.md"
node_flags=()
# shellcheck source=scripts/cluster-lib.sh
source "$root/scripts/cluster-lib.sh"

ports 1 2 3
three_nodes
server="127.0.0.1:${api[1]}"
"$bin/resctl" --server "$server" apply -f - <<'YAML' >&2
type: registry.v1.Type
name: bench-note
data:
  group: bench
  groupVersion: v1
  kind: Note
  scope: SCOPE_NAMESPACE
  proto: |
    syntax = "proto3";
    package resd.bench.v1;
    message Note {
      string name = 1;
      string description = 2;
    }
  rules:
    - expression: size(self.name) > 0 && size(self.description) <= 65536
      message: a note has a name and at most 64 KiB of text
    - expression: self.description.matches('^[ -~]*$')
      message: the description is printable ASCII
YAML
echo "| type | round | writes/s | p50 ms | p99 ms | errors |"
echo "|---|---|---|---|---|---|"
for round in $(seq 1 "$rounds"); do
  for type in demo.v2.Artist bench.v1.Note; do
    say "round $round: $type"
    "$bin/resctl" --server "$server" bench --workload write --type "$type" \
      -c "$concurrency" -N "$count" -o json \
      | python3 -c "import json,sys; r=json.load(sys.stdin); print(f\"| $type | $round | {r['per_second']:.0f} | {r['latency_ms']['p50']:.2f} | {r['latency_ms']['p99']:.2f} | {r['errors']} |\")"
  done
done
