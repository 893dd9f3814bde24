//! The trusted JavaScript of every run (the prelude, the web APIs) and how it becomes bytecode:
//! at build time, so that a worker's first engine reads it instead of compiling it (~2.2 ms of
//! a cold start).
//!
//! ```text
//! prelude.js + web_lazy.js ─┐                     (build.rs includes this file)
//! web.js ───────────────────┴─> compile() ──> $OUT_DIR/{prelude,web}.qbc ──include_bytes!──> engine
//! ```
//! The bytecode is written by the same QuickJS (the same `rquickjs` version and features, as a
//! build dependency) that reads it, from our own sources: never from a guest, a file or a store.
//! The source text is left out: QuickJS keeps a copy per nested function (the prelude's bytecode
//! was 3.7 times bigger with it, and every run reads it); stacks keep their lines, and
//! `toString` of a prelude function shows `[native code]`.

use std::ffi::{CStr, CString};

use rquickjs::context::intrinsic;
use rquickjs::{qjs, Context, Runtime, Value};

/// The prelude, wrapped by the web APIs' lazy globals (web_lazy.js, called with `install`).
pub const PRELUDE_SOURCE: &str = concat!(include_str!("web_lazy.js"), "(", include_str!("prelude.js"), ")");
#[cfg_attr(not(test), allow(dead_code))]
pub const PRELUDE_NAME: &CStr = c"<prelude>";

/// The web APIs' JavaScript, read into a run on first use; part of the prelude's identity.
pub const WEB_SOURCE: &str = include_str!("web.js");
#[cfg_attr(not(test), allow(dead_code))]
pub const WEB_NAME: &CStr = c"<web>";

/// The guest's intrinsics: no `WeakRef`/`FinalizationRegistry` (GC-observable, nondeterministic)
/// and no `performance` (a clock outside the journal).
pub fn sandbox_context(runtime: &Runtime) -> rquickjs::Result<Context> {
    Context::builder()
        .with::<intrinsic::Date>()
        .with::<intrinsic::Eval>()
        .with::<intrinsic::RegExpCompiler>()
        .with::<intrinsic::RegExp>()
        .with::<intrinsic::Json>()
        .with::<intrinsic::Proxy>()
        .with::<intrinsic::MapSet>()
        .with::<intrinsic::TypedArrays>()
        .with::<intrinsic::Promise>()
        .build(runtime)
}

/// Compiles trusted source to bytecode (without its source text) in a scratch runtime.
#[cfg_attr(not(test), allow(dead_code))] // (the build script's; the crate's tests check it)
pub fn compile(code: &str, name: &CStr) -> Result<Vec<u8>, String> {
    let runtime = Runtime::new().map_err(|e| e.to_string())?;
    let context = sandbox_context(&runtime).map_err(|e| e.to_string())?;
    let source = CString::new(code).map_err(|e| e.to_string())?;
    context.with(|ctx| {
        let raw = ctx.as_raw().as_ptr();
        // SAFETY: `raw` is the live context of this `with` scope; the compiled function is owned
        // by `compiled` and freed when it drops; the buffer from JS_WriteObject is copied and
        // freed with the context's allocator.
        unsafe {
            let value = qjs::JS_Eval(
                raw,
                source.as_ptr(),
                code.len() as _,
                name.as_ptr(),
                (qjs::JS_EVAL_TYPE_GLOBAL | qjs::JS_EVAL_FLAG_STRICT | qjs::JS_EVAL_FLAG_COMPILE_ONLY) as i32,
            );
            if qjs::JS_IsException(value) {
                let error = ctx.catch();
                return Err(format!("{name:?} does not compile: {error:?}"));
            }
            let compiled = Value::from_raw(ctx.clone(), value);
            let mut len: qjs::size_t = 0;
            let buf = qjs::JS_WriteObject(
                raw,
                &mut len,
                compiled.as_raw(),
                (qjs::JS_WRITE_OBJ_BYTECODE | qjs::JS_WRITE_OBJ_STRIP_SOURCE) as i32,
            );
            if buf.is_null() {
                return Err(format!("{name:?} bytecode could not be written"));
            }
            let bytes = std::slice::from_raw_parts(buf, len as usize).to_vec();
            qjs::js_free(raw, buf.cast());
            Ok(bytes)
        }
    })
}
