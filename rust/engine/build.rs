//! Compiles the prelude and the web APIs to QuickJS bytecode (see src/bytecode.rs), which the
//! crate embeds: no engine compiles them at run time.

#[path = "src/bytecode.rs"]
mod bytecode;

use std::path::PathBuf;

fn main() -> Result<(), String> {
    for input in ["src/bytecode.rs", "src/prelude.js", "src/web_lazy.js", "src/web.js"] {
        println!("cargo:rerun-if-changed={input}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?);
    for (source, name, file) in [
        (bytecode::PRELUDE_SOURCE, bytecode::PRELUDE_NAME, "prelude.qbc"),
        (bytecode::WEB_SOURCE, bytecode::WEB_NAME, "web.qbc"),
    ] {
        std::fs::write(out.join(file), bytecode::compile(source, name)?).map_err(|e| e.to_string())?;
    }
    Ok(())
}
