//! A paged range over etcd's KV API, the etcd column of `scripts/scale.sh`: reads every key
//! under a prefix in pages of `--limit`, the way Kubernetes pages etcd (every page at the first
//! page's revision, the next page starting after the last key), and prints one JSON line with
//! the keys, value bytes, pages and seconds. etcd's messages are declared here by hand (the
//! fields this needs, with etcd's numbers), so nothing needs `protoc`.
//!
//!   cargo run --release -p ctl --example etcd_pages -- http://127.0.0.1:23791 bench/put/ 500

#![allow(clippy::print_stdout)] // its one line of JSON is what scale.sh reads

use std::time::Instant;

use anyhow::{Context as _, bail};

/// `etcdserverpb.RangeRequest` (the fields a paged read uses).
#[derive(Clone, PartialEq, prost::Message)]
struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    limit: i64,
    #[prost(int64, tag = "4")]
    revision: i64,
}

/// `etcdserverpb.RangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    kvs: Vec<KeyValue>,
    #[prost(bool, tag = "3")]
    more: bool,
}

/// `etcdserverpb.ResponseHeader`.
#[derive(Clone, PartialEq, prost::Message)]
struct ResponseHeader {
    #[prost(int64, tag = "3")]
    revision: i64,
}

/// `mvccpb.KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    value: Vec<u8>,
}

/// The end of the range of keys starting with `prefix` (etcd's `--prefix`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [endpoint, prefix, limit] = args.as_slice() else {
        bail!(
            "usage: etcd_pages ENDPOINT PREFIX LIMIT (e.g. http://127.0.0.1:23791 bench/put/ 500)"
        );
    };
    let limit: i64 = limit.parse().context("LIMIT must be a number of keys")?;
    let channel = tonic::transport::Endpoint::from_shared(endpoint.clone())?
        .connect()
        .await
        .with_context(|| format!("cannot connect to etcd at {endpoint}"))?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(256 << 20);
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/etcdserverpb.KV/Range");
    let end = prefix_end(prefix.as_bytes());
    let (mut key, mut revision) = (prefix.as_bytes().to_vec(), 0);
    let (mut keys, mut bytes, mut pages) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    loop {
        grpc.ready().await.context("etcd's connection")?;
        let request = RangeRequest {
            key: key.clone(),
            range_end: end.clone(),
            limit,
            revision,
        };
        let codec = tonic_prost::ProstCodec::<RangeRequest, RangeResponse>::default();
        let page = grpc
            .unary(tonic::Request::new(request), path.clone(), codec)
            .await
            .context("etcd's Range")?
            .into_inner();
        pages += 1;
        if revision == 0 {
            revision = page.header.map(|h| h.revision).unwrap_or(0);
        }
        keys += page.kvs.len() as u64;
        bytes += page.kvs.iter().map(|kv| kv.value.len() as u64).sum::<u64>();
        match page.kvs.last() {
            Some(last) if page.more => {
                key = last.key.clone();
                key.push(0);
            }
            _ => break,
        }
    }
    println!(
        "{{\"keys\": {keys}, \"value_bytes\": {bytes}, \"pages\": {pages}, \"seconds\": {:.3}}}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_at_its_successor() {
        assert_eq!(prefix_end(b"bench/"), b"bench0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
