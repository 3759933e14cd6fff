//! NRI protocol bindings (`nri.pkg.api.v1alpha1`), generated at build time from `nri/api.proto`
//! by ttrpc-codegen and rust-protobuf. Never edit the generated code: change the `.proto`.
//!
//! `api` holds the messages and enums; `api_ttrpc` the `Plugin` service (served by the plugin)
//! and the `Runtime` client (called by the plugin). Only `plugin/src/nri` uses this crate; the
//! rest of nri-resize sees its own domain types.
#![allow(
    unsafe_code,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations,
    unused_qualifications,
    rust_2018_idioms,
    unused_mut
)]

include!(concat!(env!("OUT_DIR"), "/mod.rs"));

pub use protobuf;
pub use ttrpc;
