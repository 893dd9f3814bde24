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

#[test]
fn every_committed_deep_regression_input_replays_without_a_finding() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join("regressions-deep");
    let mut replayed = 0;
    for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path();
        let data = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("replaying {}", path.display());
        harness::deep(&data);
        replayed += 1;
    }
    assert!(replayed > 0, "no regression inputs in {}", dir.display());
}

/// The deep target's inputs: `[language/mode, fragment, count_lo, count_hi, ...]`.
#[test]
fn the_deep_harness_refuses_every_nester_repeated_past_the_limit() {
    for (k, (open, _)) in harness::NESTERS.iter().enumerate() {
        // Flat repetitions: comments, line ends, a sequence of regexes.
        if matches!(*open, "/* ] */" | "\n" | "/]]]]/,") {
            continue;
        }
        let typescript = matches!(*open, "<any>" | "Array<" | "keyof ");
        let data = [u8::from(typescript), k as u8, 0x88, 0x13, harness::SOURCE_END];
        let status = harness::deep(&data);
        if typescript {
            // Type syntax in an expression: refused one way or another, never run.
            assert!(matches!(&status, Some(Status::Failed(f)) if f.code.is_some()), "{open:?}: {status:?}");
            continue;
        }
        assert!(
            matches!(&status, Some(Status::Failed(f)) if f.message.contains("nests deeper than")),
            "{open:?} x5000: {status:?}"
        );
    }
    // Deep values, every way out: never a completed deep value, never a crash.
    for way in 0..8u8 {
        let status = harness::deep(&[2, 0xa0, 0x0f, way]);
        assert!(!matches!(&status, Some(Status::Completed(v)) if v.len() > 4000), "way {way}: {status:?}");
    }
}
