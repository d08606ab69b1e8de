//! Over-the-wire tests: most spawn the real `blobgate` binary on port 0 with a throw-away data dir
//! (`helpers::TestEnv`); service-level ones build the application in this process (`in_process::spawn_app`).
//! One integration binary (this file and its modules) keeps link time down.

mod cases;
mod helpers;
mod in_process;

mod access_log;
mod admin;
mod admin_wire;
mod auth;
mod bad_input;
mod browser;
mod cache_cors;
mod cli;
mod clients;
mod cors;
mod crash;
mod deploy;
mod downloads;
mod faults;
mod harden3;
mod https;
mod lifecycle;
mod limits;
mod migrations;
mod native_put;
mod operations;
mod outage;
mod partition;
mod permissions;
mod postgres;
mod postgres_tls;
mod replicas;
mod s3_clients;
mod s3_conditional;
mod s3_copy;
mod s3_endpoint;
mod s3_grants;
mod s3_harden;
mod s3_listing;
mod s3_metadata;
mod s3_tagging;
mod s3_writes;
mod schema;
mod service;
mod shared_blobs;
mod shared_cache;
mod slow_readers;
mod stats;
mod syscalls;
mod upload_bounds;
mod variants;
mod varnish;
mod website;
mod wire;
