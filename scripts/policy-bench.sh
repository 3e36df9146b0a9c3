#!/usr/bin/env bash
# Write throughput under admission policies and a quota (DESIGN §17) against none, on one
# 3-node loopback cluster from target/release, configurations interleaved in each round:
# none, a quota counting every write, 1 matching DENY policy, 20 matching DENY policies.
#
#   cargo build --release -p server -p ctl
#   scripts/policy-bench.sh [ROUNDS] [CONCURRENCY] [COUNT]     # default 3 64 20000
set -euo pipefail
rounds=${1:-3}; concurrency=${2:-64}; count=${3:-20000}
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RESD_BIN:-$root/target/release}"
work="$(mktemp -d -t resd-policy-bench-XXXXXX)"
node_flags=()
# shellcheck source=scripts/cluster-lib.sh
source "$root/scripts/cluster-lib.sh"

ports 1 2 3
three_nodes
server="127.0.0.1:${api[1]}"
ctl() { "$bin/resctl" --server "$server" "$@"; }

policy() { # NAME
  cat <<YAML
type: policy.v1.AdmissionPolicy
name: $1
data:
  match: {types: ["demo.v1.Artist"]}
  validations:
    - expression: "size(object.data.description) <= 100000 && object.name != 'forbidden'"
      message: artists have short descriptions
  action: ACTION_DENY
---
YAML
}
quota() {
  cat <<YAML
type: tenancy.v1.Quota
name: bench
tenancy: {partition: default, namespace: default}
data:
  hard: {count/demo.*: 100000000, bytes: 100000000000}
YAML
}
setup() { # CONFIGURATION
  case $1 in
    none) ;;
    quota) quota | ctl apply -f - >/dev/null ;;
    policy-1) policy p0 | ctl apply -f - >/dev/null ;;
    policy-20) for i in $(seq 0 19); do policy "p$i"; done | ctl apply -f - >/dev/null ;;
  esac
}
teardown() {
  ctl delete tenancy.v1.Quota bench >/dev/null 2>&1 || true
  for i in $(seq 0 19); do ctl delete policy.v1.AdmissionPolicy "p$i" >/dev/null 2>&1 || true; done
}

echo "| configuration | round | writes/s | p50 ms | p99 ms | errors |"
echo "|---|---|---|---|---|---|"
for round in $(seq 1 "$rounds"); do
  for configuration in none quota policy-1 policy-20; do
    say "round $round: $configuration"
    setup "$configuration"
    ctl bench --workload write --type demo.v1.Artist -c "$concurrency" -N "$count" -o json \
      | python3 -c "import json,sys; r=json.load(sys.stdin); print(f\"| $configuration | $round | {r['per_second']:.0f} | {r['latency_ms']['p50']:.2f} | {r['latency_ms']['p99']:.2f} | {r['errors']} |\")"
    teardown
  done
done
