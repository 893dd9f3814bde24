//! libFuzzer entry point for deep and large sources and values: the harness's `deep`
//! (`src/lib.rs`), which `rust/engine/tests/fuzz_regressions.rs` also replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    codemode_engine_fuzz::deep(data);
});
