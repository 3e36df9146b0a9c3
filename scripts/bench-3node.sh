#!/usr/bin/env bash
# A 3-node cluster on loopback started from target/release, one `resctl bench` run against it,
# then stopped (by PID): to compare transports and ACLs with the same client.
#
#   cargo build --release -p server -p ctl
#   scripts/bench-3node.sh plain|tls|acl WORKLOAD CONCURRENCY [COUNT]
#   scripts/bench-3node.sh tls write 64        # mutual TLS on both ports, client certificates
#   scripts/bench-3node.sh acl read 16         # ACLs on (and so TLS), with the management token
#
# Interleave modes (plain tls plain tls …): this kind of machine drifts 10–15 % between minutes.
set -euo pipefail
mode=${1:?plain, tls or acl}; workload=${2:-write}; concurrency=${3:-64}; count=${4:-30000}
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RESD_BIN:-$root/target/release}"
work="$(mktemp -d -t resd-bench-XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
api=(); raft=()
for n in 1 2 3; do api+=("$(port)"); raft+=("$(port)"); done

node_flags=(); client=()
make_certs() {
    "$bin/resd" tls ca create --dir "$work/tls" >/dev/null
    for n in 1 2 3; do "$bin/resd" tls cert create --node-id "$n" --dir "$work/tls" >/dev/null; done
    "$bin/resd" tls cert create --client bench --dir "$work/tls" >/dev/null
    client=(--ca-cert "$work/tls/resd-ca.pem" --client-cert "$work/tls/client-bench.pem"
            --client-key "$work/tls/client-bench-key.pem")
}
case "$mode" in
  plain) node_flags=(--insecure) ;;
  tls) make_certs ;;
  acl) make_certs; node_flags=(--acl-enabled) ;;
  *) echo "mode must be plain, tls or acl" >&2; exit 2 ;;
esac

start() {
  local n=$1; shift
  local extra=()
  if [ "$mode" != plain ]; then
    extra=(--tls-ca "$work/tls/resd-ca.pem" --tls-cert "$work/tls/node-$n.pem"
           --tls-key "$work/tls/node-$n-key.pem" --tls-verify-clients)
  fi
  RUST_LOG=warn "$bin/resd" agent --node-id "$n" --data-dir "$work/node$n" \
    --api-addr "127.0.0.1:${api[$((n-1))]}" --raft-addr "127.0.0.1:${raft[$((n-1))]}" \
    "${node_flags[@]}" "${extra[@]}" "$@" >"$work/node$n.log" 2>&1 &
  pids+=($!)
}

start 1 --bootstrap
sleep 1.5
join=()
if [ "$mode" = acl ]; then
  secret="$("$bin/resctl" --server "127.0.0.1:${api[0]}" "${client[@]}" acl bootstrap -o name)"
  client+=(--token "$secret")
fi
start 2 --join "127.0.0.1:${api[0]}" "${join[@]}"
start 3 --join "127.0.0.1:${api[0]}" "${join[@]}"
for _ in $(seq 1 100); do
  voters=$("$bin/resctl" --server "127.0.0.1:${api[0]}" "${client[@]}" cluster members -o json 2>/dev/null \
    | python3 -c 'import json,sys; print(sum(1 for m in json.load(sys.stdin) if m["role"] in ("leader","voter")))' 2>/dev/null || echo 0)
  [ "$voters" = 3 ] && break
  sleep 0.2
done
echo "== $mode: $workload -c $concurrency -N $count against a 3-node cluster"
"$bin/resctl" --server "127.0.0.1:${api[0]}" "${client[@]}" bench --workload "$workload" \
  -c "$concurrency" -N "$count"
