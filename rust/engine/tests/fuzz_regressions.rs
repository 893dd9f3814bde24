//! Replays the engine fuzz harness over the committed regression inputs, so `cargo test` keeps
//! every crash `make fuzz` ever found (and the hand-picked bridge cases) fixed.
//!
//! The harness is the fuzz target's own code, included by path: one copy of the logic, and no
//! fuzzing dependency in this crate.

use std::fs;
use std::path::Path;

use codemode_engine::Status;

#[path = "../fuzz/src/lib.rs"]
mod harness;

/// Tool catalog, 4 MiB, 50 ms slices, 16 pending calls | 4 KiB output, 64 KiB bridge.
const HEADER: [u8; 2] = [0xF4, 0x09];

fn input(source: &str, ops: &[u8]) -> Vec<u8> {
    let mut bytes = HEADER.to_vec();
    bytes.extend_from_slice(source.as_bytes());
    bytes.push(harness::SOURCE_END);
    bytes.extend_from_slice(ops);
    bytes
}

#[test]
fn every_committed_regression_input_replays_without_a_finding() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join("regressions");
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) => panic!("{}: {e}", dir.display()),
    };
    let mut replayed = 0;
    for entry in entries {
        let path = match entry {
            Ok(entry) => entry.path(),
            Err(e) => panic!("{}: {e}", dir.display()),
        };
        let data = match fs::read(&path) {
            Ok(data) => data,
            Err(e) => panic!("{}: {e}", path.display()),
        };
        eprintln!("replaying {}", path.display());
        harness::run(&data);
        replayed += 1;
    }
    assert!(replayed > 0, "no regression inputs in {}", dir.display());
}

#[test]
fn harness_runs_the_source_after_the_header() {
    assert_eq!(harness::run(&input("return 1 + 1", &[])), Some(Status::Completed("2".into())));
}

#[test]
fn harness_settles_every_pending_call_with_null() {
    let cell =
        "const [a, b] = await Promise.all([tools.echo({}), tools.callValue('host:core:big', {})]); return [a, b]";
    assert_eq!(harness::run(&input(cell, &[])), Some(Status::Pending));
    assert_eq!(harness::run(&input(cell, &[5])), Some(Status::Completed("[null,null]".into())));
}

#[test]
fn harness_settles_with_chosen_ids_and_payloads() {
    // One settlement: the first pending call, ok, the payload dictionary's `"s"`; then a
    // never-issued id (0) that must change nothing.
    let ops = [0, 0, 0, 0x10, 0, 2, 0, 0, 0, 0, 0, 0x08];
    assert_eq!(harness::run(&input("return await tools.echo({})", &ops)), Some(Status::Completed("\"s\"".into())));
}

#[test]
fn harness_expands_snippets() {
    let Some(k) = harness::SNIPPETS.iter().position(|s| *s == "ALL_TOOLS") else {
        panic!("ALL_TOOLS is not a snippet");
    };
    let mut data = HEADER.to_vec();
    data.extend_from_slice(b"return ");
    data.extend_from_slice(&[harness::SNIPPET, k as u8]);
    data.extend_from_slice(b".length");
    assert_eq!(harness::run(&data), Some(Status::Completed("7".into())));
}
