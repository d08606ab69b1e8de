//! # blobgate
//!
//! An object-storage download gateway whose data listener sends object bytes with `sendfile(2)` only.
//!
//! ## Layout
//! Dependencies point one way, as the layer table in ARCHITECTURE.md says (`tests/architecture.rs` checks it, and
//! the files its invariants name).
//! - [`cli`]: the command line (serve, bucket, put, import, ls, rm, token, s3-key, presign, signing, stats,
//!   uploads, db).
//! - [`config`]: layered settings; the only module that reads the environment (clap reads `BLOBGATE_CONFIG`).
//! - [`startup`]: builds the application from settings and runs both listeners until shutdown.
//! - [`names`]: bucket names and object keys, parsed once and shared by every entry point.
//! - [`store`]: the metadata on SQLite or PostgreSQL (the only SQL) and the content-addressed blob files, in the
//!   data dir or an S3-compatible object store (with the data dir as its cache).
//! - [`http`]: axum routes and handlers for both listeners, and the one error type.
//! - [`auth`]: who may read or write what: the `Authorizer` and its `AuthError`s, over a lookup the catalog provides.
//! - [`catalog`]: caches of metadata and open blobs for the data path, coherent with the database; the one blob
//!   source of a response.
//! - [`header_values`]: ETag, HTTP date, Content-Disposition, CORS rule and upload digest values (pure), shared by
//!   store, auth, http, driver.
//! - [`file_body`]: the contract that hands a file's regions (and a filling file's gate) from handlers to the driver.
//! - [`driver`]: the HTTP/1.1 loop both listeners run; `driver::sys` is its only raw-fd code.
//! - [`metrics`]: Prometheus series, all names in one place; the stats batcher.
//! - [`s3`]: the S3 wire format (XML documents, list parameters, the listing planner) and `operation::classify`, pure.
//! - [`stats`]: download records and the per-object counters they add up to (pure data).
//! - [`access_log`]: one JSON line per response, written by its own thread, credentials redacted.
//! - [`throttle`]: limits on principals (pure values) and the counters a replica keeps for them.

// `unsafe` only where a module allows it (the driver's raw syscalls, the shared generation mapping), and each block
// says why it is sound.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod access_log;
pub mod auth;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod driver;
pub mod file_body;
pub mod header_values;
pub mod http;
pub mod metrics;
pub mod names;
pub mod s3;
pub mod startup;
pub mod stats;
pub mod store;
pub mod throttle;
