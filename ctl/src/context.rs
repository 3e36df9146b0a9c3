//! The contexts file (named servers, tokens, default tenancy, TLS files): it lives in
//! [`proto::client::contexts`], shared with `resd dev`, which writes a context for the cluster
//! it runs.

pub use proto::client::contexts::{ContextEntry, ContextsFile, expand_home, path};
