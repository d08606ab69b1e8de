//! The calls of an `strace -f -yy -o` file, each whole: an interrupted call's name and arguments are on its
//! `<unfinished ...>` half and its result on the `<... name resumed>` half, both under its thread id. The syscall
//! proofs (`syscalls.rs`, the object store's, the kernel VM's in `https.rs`) all count from these.

use std::collections::HashMap;

/// One call: its thread, name, arguments (as strace printed them) and result.
#[derive(Debug)]
pub struct Call {
    pub tid: String,
    pub name: String,
    pub args: String,
    pub result: String,
}

impl Call {
    /// The first argument: with `-yy`, a descriptor and what it is (`27<TCP:[11289]>`, `28</d/blobs/ab/…>`).
    pub fn first_arg(&self) -> &str {
        self.args.split(", ").next().unwrap_or("")
    }

    /// The bytes the call moved (its result, when it is a count).
    pub fn moved(&self) -> u64 {
        self.result.parse::<i64>().unwrap_or(0).max(0) as u64
    }
}

/// What a `-yy` descriptor is, whichever number it has at the time: `27<TCP:[11289]>` → `TCP:[11289]`.
pub fn described(fd: &str) -> &str {
    fd.split_once('<').and_then(|(_, rest)| rest.rsplit_once('>')).map_or("", |(name, _)| name)
}

/// Every call of `trace`, in the order their results appear. A resumed half whose start is not in the file keeps
/// its name and loses its arguments.
pub fn calls(trace: &str) -> Vec<Call> {
    let mut started: HashMap<&str, (String, String)> = HashMap::new();
    let mut calls = Vec::new();
    for line in trace.lines() {
        let Some((tid, call)) = line.split_once(char::is_whitespace) else { continue };
        let call = call.trim_start();
        let (name, args) = match call.strip_prefix("<... ") {
            Some(resumed) => started
                .remove(tid)
                .unwrap_or_else(|| (resumed.split_whitespace().next().unwrap_or("").to_owned(), String::new())),
            None => {
                let (name, args) = call.split_once('(').unwrap_or((call, ""));
                if line.ends_with("<unfinished ...>") {
                    started.insert(tid, (name.to_owned(), args.to_owned()));
                    continue;
                }
                (name.to_owned(), args.to_owned())
            }
        };
        let result = strace_result(line).to_owned();
        calls.push(Call { tid: tid.to_owned(), name, args, result });
    }
    calls
}

/// The result of the call an strace line records (`100`, `-1`, `27<TCP:[11289]>`), or `""` for an `<unfinished
/// ...>` half. strace pads short lines (a resumed call's tail) so that `=` lines up: `<... write resumed>)    = 8`.
pub fn strace_result(line: &str) -> &str {
    let mut rest = line;
    while let Some((before, after)) = rest.rsplit_once("= ") {
        if before.trim_end().ends_with(')') {
            return after.split_whitespace().next().unwrap_or("");
        }
        rest = before;
    }
    ""
}

#[test]
fn interrupted_calls_are_joined_by_thread() {
    let trace = "190   sendfile(27<TCP:[1]>, 28</d/blobs/ee>, [0] <unfinished ...>
187   recvmsg(27<TCP:[1]>, {msg_namelen=128}, 0 <unfinished ...>
190   <... sendfile resumed> => [2097152], 2097152) = 2097152
187   <... recvmsg resumed>{msg_namelen=128 => 0}, 0) = 2
181   <... writev resumed>)              = 16406
";
    let calls = calls(trace);
    let seen: Vec<_> =
        calls.iter().map(|c| (c.tid.as_str(), c.name.as_str(), described(c.first_arg()), c.moved())).collect();
    assert_eq!(
        seen,
        [("190", "sendfile", "TCP:[1]", 2_097_152), ("187", "recvmsg", "TCP:[1]", 2), ("181", "writev", "", 16_406)]
    );
}
