//! Names of staging (temp) files in a blob directory shared by many processes on one host or several, and the
//! start-up sweep's decision about each temp file and unreferenced blob. Pure: the caller gathers the facts (what
//! this host is, whether a pid is alive and since when, file ages) and acts on the verdict.
//!
//! A staging name is `stage-<host>-<pid>-<start>-<random>`:
//! - `host`: 16 hex digits hashed from what makes a pid meaningful here (machine id or hostname, boot id, pid
//!   namespace; see [`host_id_from`]). Two containers on one machine get different ids, and so does one machine
//!   after a reboot, so a pid is only ever judged where it was issued.
//! - `pid` and `start`: the owner process and its start time (clock ticks since boot, `/proc/<pid>/stat` field
//!   22), which tells a live owner from a new process that reuses its pid.
//! - `random`: 16 hex digits, so two writers never share a name even if everything else matched.

use std::time::Duration;

use sha2::{Digest, Sha256};

/// Prefix of in-progress uploads in `tmp/`.
pub const STAGE_PREFIX: &str = "stage-";

/// Hex digits of a host id and of the random part of a staging name.
const ID_HEX: usize = 16;

/// Who wrote a staging file: enough to tell, on its own host, whether that process still runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageOwner {
    pub host: String,
    pub pid: u32,
    pub start_ticks: u64,
}

/// `stage-<host>-<pid>-<start>-<random>`.
pub fn stage_name(owner: &StageOwner, random: &str) -> String {
    format!("{STAGE_PREFIX}{}-{}-{}-{random}", owner.host, owner.pid, owner.start_ticks)
}

/// The owner encoded in a staging name; `None` for any other name (including the `stage-<pid>-<random>` names of
/// older versions, whose pid cannot be placed on a host).
pub fn parse_stage_name(name: &str) -> Option<StageOwner> {
    let mut parts = name.strip_prefix(STAGE_PREFIX)?.split('-');
    let host = parts.next().filter(|h| is_hex_id(h))?;
    let pid = parts.next().and_then(parse_decimal::<u32>)?;
    let start_ticks = parts.next().and_then(parse_decimal::<u64>)?;
    parts.next().filter(|r| is_hex_id(r))?;
    if parts.next().is_some() {
        return None;
    }
    Some(StageOwner { host: host.to_owned(), pid, start_ticks })
}

/// The host id from what this machine says about itself; any input may be missing. Every input that differs
/// gives a different id, which only ever makes the sweep more careful (a pid of "another host" is never judged).
pub fn host_id_from(
    machine_id: Option<&str>,
    hostname: Option<&str>,
    boot_id: Option<&str>,
    pid_namespace: Option<&str>,
) -> String {
    let mut hasher = Sha256::new();
    for part in [machine_id, hostname, boot_id, pid_namespace] {
        // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
        let part = part.map(str::trim).unwrap_or_default();
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(&hasher.finalize()[..ID_HEX / 2])
}

/// A process's start time in clock ticks since boot, from the text of `/proc/<pid>/stat`: field 22. The command
/// name (field 2) is in parentheses and may itself hold spaces and parentheses, so fields are counted from the
/// last `)`.
pub fn start_ticks_from_stat(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // After the name come field 3 (state) onwards: field 22 is the 20th of them.
    after_name.split_ascii_whitespace().nth(19).and_then(parse_decimal::<u64>)
}

/// What the sweep saw of a temp file in `tmp/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TempOwner {
    /// Its owner is a process on this host that still runs (same pid, same start time).
    LiveHere,
    /// Its owner was a process on this host that is gone (no such pid, or a pid reused by a newer process).
    DeadHere,
    /// Another host's, or a name that says nothing about its owner: only its age can tell.
    Unknown,
}

/// The owner class of a staging file called `name`, given this host's id and, for a pid, the start time of the
/// process that has it now (`None`: no such process).
pub fn classify_stage(name: &str, this_host: &str, start_ticks_of: impl FnOnce(u32) -> Option<u64>) -> TempOwner {
    match parse_stage_name(name) {
        Some(owner) if owner.host == this_host => {
            if start_ticks_of(owner.pid) == Some(owner.start_ticks) {
                TempOwner::LiveHere
            } else {
                TempOwner::DeadHere
            }
        }
        _ => TempOwner::Unknown,
    }
}

/// Whether the start-up sweep may remove a staging file. A live owner's file stays whatever its age (a staged
/// upload waiting for the lock); a dead owner's goes at once; anything else only when it has not been written for
/// `grace`. `idle`: time since its last modification, `None` when its mtime is in the future (clock skew between
/// hosts on a shared filesystem), which counts as fresh.
pub fn may_sweep_temp(owner: TempOwner, idle: Option<Duration>, grace: Duration) -> bool {
    match owner {
        TempOwner::LiveHere => false,
        TempOwner::DeadHere => true,
        TempOwner::Unknown => is_past_grace(idle, grace),
    }
}

/// Whether the sweep may remove an unreferenced blob: only when it is older than `grace`, so a peer that installed
/// it a moment ago (and whose row is on its way) keeps it. The caller still re-checks references under the
/// blob-reference lock.
pub fn may_sweep_unreferenced_blob(idle: Option<Duration>, grace: Duration) -> bool {
    is_past_grace(idle, grace)
}

fn is_past_grace(idle: Option<Duration>, grace: Duration) -> bool {
    idle.is_some_and(|idle| idle >= grace)
}

fn is_hex_id(s: &str) -> bool {
    s.len() == ID_HEX && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Plain decimal digits only: no sign, no spaces (`str::parse` would take `+5`).
fn parse_decimal<T: std::str::FromStr>(s: &str) -> Option<T> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOST: &str = "0123456789abcdef";
    const RANDOM: &str = "fedcba9876543210";

    fn owner(pid: u32, start_ticks: u64) -> StageOwner {
        StageOwner { host: HOST.into(), pid, start_ticks }
    }

    #[test]
    fn a_stage_name_carries_host_pid_start_and_random() {
        let name = stage_name(&owner(4242, 987654), RANDOM);
        assert_eq!(name, "stage-0123456789abcdef-4242-987654-fedcba9876543210");
        assert_eq!(parse_stage_name(&name), Some(owner(4242, 987654)));
    }

    #[test]
    fn other_names_have_no_owner() {
        for name in [
            "stage-4242-fedcba9876543210",                           // an older version's name
            "stage-0123456789abcdef-4242-987654",                    // no random part
            "stage-0123456789abcdef-4242-987654-fedcba9876543210-x", // a trailing part
            "stage-0123456789ABCDEF-4242-987654-fedcba9876543210",   // upper-case host
            "stage-0123456789abcdef-+42-987654-fedcba9876543210",    // a sign
            "stage-0123456789abcdef-99999999999-1-fedcba9876543210", // pid out of range
            "retired-0123456789abcdef-4242-987654-fedcba9876543210",
            "notes.txt",
        ] {
            assert_eq!(parse_stage_name(name), None, "{name}");
        }
    }

    #[test]
    fn every_host_input_changes_the_id() {
        let base = host_id_from(Some("m"), Some("h"), Some("b"), Some("pid:[1]"));
        assert_eq!(base.len(), 16);
        assert!(is_hex_id(&base));
        assert_eq!(base, host_id_from(Some("m\n"), Some("h"), Some("b\n"), Some("pid:[1]")), "trailing newlines");
        for other in [
            host_id_from(None, Some("h"), Some("b"), Some("pid:[1]")),
            host_id_from(Some("m2"), Some("h"), Some("b"), Some("pid:[1]")),
            host_id_from(Some("m"), Some("h2"), Some("b"), Some("pid:[1]")),
            host_id_from(Some("m"), Some("h"), Some("b2"), Some("pid:[1]")),
            host_id_from(Some("m"), Some("h"), Some("b"), Some("pid:[2]")),
            host_id_from(Some("mh"), Some(""), Some("b"), Some("pid:[1]")),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn the_start_time_is_field_22_counted_after_the_command_name() {
        let stat = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(start_ticks_from_stat(stat), Some(987654));
        assert_eq!(start_ticks_from_stat("4242 (short) S 1 2"), None);
        assert_eq!(start_ticks_from_stat("no parentheses"), None);
    }

    #[test]
    fn a_stage_file_is_judged_by_its_owner_on_this_host_only() {
        let name = stage_name(&owner(7, 100), RANDOM);
        assert_eq!(classify_stage(&name, HOST, |_| Some(100)), TempOwner::LiveHere);
        assert_eq!(classify_stage(&name, HOST, |_| None), TempOwner::DeadHere, "no such pid");
        assert_eq!(classify_stage(&name, HOST, |_| Some(101)), TempOwner::DeadHere, "the pid was reused");
        let elsewhere = classify_stage(&name, "aaaaaaaaaaaaaaaa", |_| panic!("another host's pid is never looked up"));
        assert_eq!(elsewhere, TempOwner::Unknown);
        assert_eq!(classify_stage("stage-7-fedcba9876543210", HOST, |_| Some(100)), TempOwner::Unknown);
    }

    #[test]
    fn the_sweep_decision() {
        let grace = Duration::from_secs(3600);
        let (fresh, old) = (Some(Duration::from_secs(10)), Some(Duration::from_secs(3600)));
        assert!(!may_sweep_temp(TempOwner::LiveHere, old, grace), "a live owner keeps even an old file");
        assert!(may_sweep_temp(TempOwner::DeadHere, fresh, grace), "a dead owner's file goes at once");
        assert!(!may_sweep_temp(TempOwner::Unknown, fresh, grace));
        assert!(may_sweep_temp(TempOwner::Unknown, old, grace), "at the grace period, not only after");
        assert!(!may_sweep_temp(TempOwner::Unknown, None, grace), "an mtime in the future is fresh");
        assert!(!may_sweep_unreferenced_blob(fresh, grace));
        assert!(may_sweep_unreferenced_blob(old, grace));
        assert!(!may_sweep_unreferenced_blob(None, grace));
    }

    proptest! {
        /// Every name this module makes parses back to its owner.
        #[test]
        fn names_round_trip(host in "[0-9a-f]{16}", pid in any::<u32>(), start in any::<u64>(), random in "[0-9a-f]{16}") {
            let owner = StageOwner { host, pid, start_ticks: start };
            prop_assert_eq!(parse_stage_name(&stage_name(&owner, &random)), Some(owner));
        }

        /// Only a file whose owner is provably gone from this host goes before the grace period.
        #[test]
        fn nothing_young_of_an_unknown_owner_is_swept(idle in 0u64..3600) {
            prop_assert!(!may_sweep_temp(TempOwner::Unknown, Some(Duration::from_secs(idle)), Duration::from_secs(3600)));
            prop_assert!(!may_sweep_unreferenced_blob(Some(Duration::from_secs(idle)), Duration::from_secs(3600)));
        }
    }
}
