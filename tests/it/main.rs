//! Cross-crate integration tests: real `resd` clusters driven through the client library (the
//! `ctl` library functions over `proto::client`) and through the real `resctl` binary, with one
//! scenario body for both drivers.

mod chaos;
mod cli;
mod client;
mod drivers;
mod evolve;
mod history;
mod http;
mod invoices;
mod lease;
mod scenario;
mod selectors;
mod teams;
mod tls;
mod tui;
