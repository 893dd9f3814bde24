//! libFuzzer entry point: every input goes through the shared harness (`src/lib.rs`), which
//! `rust/engine/tests/fuzz_regressions.rs` also runs over the committed regression inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    codemode_engine_fuzz::run(data);
});
