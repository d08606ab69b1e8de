//! Over-the-wire tests: every test spawns the real `blobgate` binary on port 0 with a throw-away data dir.
//! One integration binary (this file and its modules) keeps link time down.

mod cases;
mod helpers;

mod admin;
mod auth;
mod bad_input;
mod cli;
mod clients;
mod crash;
mod downloads;
mod faults;
mod lifecycle;
mod limits;
mod permissions;
mod shared_cache;
mod slow_readers;
mod stats;
mod syscalls;
mod wire;
