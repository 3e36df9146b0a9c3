//! # Feature flags

#![doc = include_str!("feature-flags-toc.md")]
//
#![doc = include_str!("feature-flags.md")]
