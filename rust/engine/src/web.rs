//! Host side of the guest's web APIs (`web.js`): UTF-8, forgiving base64, WHATWG URLs and
//! `application/x-www-form-urlencoded`, and the class brands `structuredClone` dispatches on.
//!
//! ```text
//! guest ──> web.js (argument conversion, classes, errors) ──> web.* (here) ──> url / base64 crates
//! ```
//! Everything here is pure: no state, no I/O, no clock. URL parsing is the `url` crate's (the
//! WHATWG algorithm, with its setters in `url::quirks`), never a parser of ours. `web.js` is
//! compiled once per process and read into a run only when the guest first touches one of the
//! APIs (`web_lazy.js` holds the lazy globals), so a cell that never does pays nothing for it.
//!
//! Pitfalls: strings arrive already well-formed (`web.js` applies `toWellFormed`, the USVString
//! conversion), and are read in place from the QuickJS heap. Whatever a function builds on the
//! Rust side (a decoded copy, a URL serialization) is first reserved against the run's memory
//! limit ([`Reserved`]), as if QuickJS had allocated it: a huge input ends the run with
//! `memory_limit_exceeded` before the allocation, never takes the worker down.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::{alphabet, Engine as _};
use rquickjs::{qjs, Array, Ctx, Exception, Function, Object, Value};
use url::{quirks, Url};

use crate::engine::{run_bytecode, throw_uncatchable};
use crate::limits::{Abort, Flags};

/// Bytes a host function holds outside the QuickJS heap while it works, counted in
/// `Flags::held` (which the allocator adds to the heap) until it returns.
struct Reserved<'a> {
    flags: &'a Flags,
    bytes: usize,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let _ =
            self.flags.held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| Some(h.saturating_sub(self.bytes)));
    }
}

/// Reserves `bytes` for Rust-side work, or ends the run as a refused QuickJS allocation would.
fn reserve<'a>(ctx: &Ctx<'_>, flags: &'a Flags, bytes: usize) -> rquickjs::Result<Reserved<'a>> {
    let held = flags.held.load(Ordering::Relaxed);
    let wanted = flags.used.load(Ordering::Relaxed).saturating_add(held).saturating_add(bytes);
    if wanted > flags.memory_limit.load(Ordering::Relaxed) {
        flags.abort(Abort::Memory);
        return Err(throw_uncatchable(ctx, "code mode memory limit exceeded"));
    }
    flags.held.fetch_add(bytes, Ordering::Relaxed);
    Ok(Reserved { flags, bytes })
}

/// The UTF-8 bytes of a guest string, read in place from the QuickJS heap.
fn utf8<'a>(s: &'a rquickjs::CString<'_>) -> &'a [u8] {
    // SAFETY: the CString owns this buffer (in the QuickJS heap) for its lifetime.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), s.len()) }
}

/// A guest string as `&str`. QuickJS writes a lone surrogate as WTF-8, which is not UTF-8:
/// `web.js` makes every string well-formed first, and this check keeps a slip from being UB.
fn text<'a>(ctx: &Ctx<'_>, s: &'a rquickjs::CString<'_>) -> rquickjs::Result<&'a str> {
    std::str::from_utf8(utf8(s)).map_err(|_| Exception::throw_type(ctx, "web API: the string is not well-formed"))
}

/// The bytes `[offset, offset + length)` of an ArrayBuffer or SharedArrayBuffer.
fn buffer_range<'js>(ctx: &Ctx<'js>, buffer: &Value<'js>, offset: f64, length: f64) -> rquickjs::Result<*mut [u8]> {
    let mut size: qjs::size_t = 0;
    // SAFETY: `buffer` is a live value of this context; the pointer stays valid while no JS runs.
    let data = unsafe { qjs::JS_GetArrayBuffer(ctx.as_raw().as_ptr(), &mut size, buffer.as_raw()) };
    if data.is_null() {
        return Err(rquickjs::Error::Exception);
    }
    let size = size as usize;
    let whole = |n: f64| n.is_finite() && n >= 0.0 && n.fract() == 0.0 && n <= size as f64;
    if !whole(offset) || !whole(length) || offset + length > size as f64 {
        return Err(Exception::throw_range(ctx, "web API: the view lies outside its buffer"));
    }
    // SAFETY: the range was just checked against the buffer's current size.
    Ok(std::ptr::slice_from_raw_parts_mut(unsafe { data.add(offset as usize) }, length as usize))
}

// ---- UTF-8 -------------------------------------------------------------------------------------

/// Encodes as much of `source` as fits in `dest` without splitting a character:
/// `(UTF-16 code units read, bytes written)`, as `TextEncoder.encodeInto` reports them.
pub fn encode_into(source: &str, dest: &mut [u8]) -> (usize, usize) {
    let (mut read, mut written) = (0, 0);
    for c in source.chars() {
        let n = c.len_utf8();
        let Some(slot) = dest.get_mut(written..written + n) else { break };
        c.encode_utf8(slot);
        written += n;
        read += c.len_utf16();
    }
    (read, written)
}

/// How many trailing bytes of `bytes` are an unfinished (but so far valid) UTF-8 sequence,
/// which a streaming decoder keeps for the next chunk.
fn unfinished_tail(bytes: &[u8]) -> usize {
    match bytes.utf8_chunks().last() {
        Some(chunk) if !chunk.invalid().is_empty() => match std::str::from_utf8(chunk.invalid()) {
            Err(e) if e.error_len().is_none() => chunk.invalid().len(),
            _ => 0,
        },
        _ => 0,
    }
}

/// UTF-8 decoding as the WHATWG Encoding standard does it: each maximal invalid subpart becomes
/// U+FFFD (or, when `fatal`, the whole decode fails). With `stream`, an unfinished sequence at
/// the end is not decoded: its length is returned for the caller to keep.
pub fn decode_utf8(bytes: &[u8], fatal: bool, stream: bool) -> Option<(Cow<'_, str>, usize)> {
    let kept = if stream { unfinished_tail(bytes) } else { 0 };
    let body = &bytes[..bytes.len() - kept];
    let text = match std::str::from_utf8(body) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) if fatal => return None,
        Err(_) => String::from_utf8_lossy(body),
    };
    Some((text, kept))
}

// ---- base64 ------------------------------------------------------------------------------------

/// Decodes the remaining symbols once padding is stripped; trailing bits are allowed, as
/// forgiving-base64 says.
const FORGIVING: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// WHATWG forgiving-base64 decode (`atob`): ASCII whitespace anywhere is ignored, one or two
/// `=` may end a length that is a multiple of four, and anything else outside the alphabet
/// (or a length of 4n+1) is a failure (`None`).
pub fn forgiving_base64_decode(input: &str) -> Option<Vec<u8>> {
    let mut data: Vec<u8> = input.bytes().filter(|b| !matches!(b, b'\t' | b'\n' | 0x0c | b'\r' | b' ')).collect();
    if data.len().is_multiple_of(4) {
        let pad = if data.ends_with(b"==") { 2 } else { usize::from(data.ends_with(b"=")) };
        data.truncate(data.len() - pad);
    }
    if data.len() % 4 == 1 {
        return None;
    }
    FORGIVING.decode(&data).ok()
}

/// `btoa`: base64 of a string's code points taken as bytes; `None` when one is above U+00FF.
pub fn latin1_base64_encode(input: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = input.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect();
    bytes.map(|b| STANDARD.encode(b))
}

// ---- URLs --------------------------------------------------------------------------------------

/// What `web.js` keeps of a URL, in this order: href, origin, protocol, username, password,
/// host, hostname, port, pathname, search, hash.
pub fn url_components(url: &Url) -> [Cow<'_, str>; 11] {
    [
        Cow::Borrowed(quirks::href(url)),
        Cow::Owned(quirks::origin(url)),
        Cow::Borrowed(quirks::protocol(url)),
        Cow::Borrowed(quirks::username(url)),
        Cow::Borrowed(quirks::password(url)),
        Cow::Borrowed(quirks::host(url)),
        Cow::Borrowed(quirks::hostname(url)),
        Cow::Borrowed(quirks::port(url)),
        Cow::Borrowed(quirks::pathname(url)),
        Cow::Borrowed(quirks::search(url)),
        Cow::Borrowed(quirks::hash(url)),
    ]
}

/// Parses `input` against `base` as `new URL(input, base)` does.
pub fn parse_url(input: &str, base: Option<&str>) -> Option<Url> {
    match base {
        Some(base) => Url::parse(base).ok()?.join(input).ok(),
        None => Url::parse(input).ok(),
    }
}

/// Applies one URL setter (numbered as in [`url_components`]; 0 is href) to `url`. Only the
/// href setter can fail (`false`); the others ignore a value they cannot use, as the spec says.
pub fn set_url_component(url: &mut Url, which: u32, value: &str) -> bool {
    match which {
        0 => return quirks::set_href(url, value).is_ok(),
        2 => drop(quirks::set_protocol(url, value)),
        3 => drop(quirks::set_username(url, value)),
        4 => drop(quirks::set_password(url, value)),
        5 => drop(quirks::set_host(url, value)),
        6 => drop(quirks::set_hostname(url, value)),
        7 => drop(quirks::set_port(url, value)),
        8 => quirks::set_pathname(url, value),
        9 => quirks::set_search(url, value),
        10 => quirks::set_hash(url, value),
        _ => {}
    }
    true
}

/// What a URL operation may hold on the Rust side per byte of its input: the parsed copy, a
/// serialization (percent-encoding triples a byte) and the host's IDNA steps.
const URL_BYTES_PER_INPUT_BYTE: usize = 8;

fn components_array<'js>(ctx: &Ctx<'js>, url: &Url) -> rquickjs::Result<Array<'js>> {
    let out = Array::new(ctx.clone())?;
    for (i, part) in url_components(url).iter().enumerate() {
        define_index(ctx, &out, i, rquickjs::String::from_str(ctx.clone(), part)?.into_value())?;
    }
    Ok(out)
}

/// Defines `out[index] = value` as an own element: assigning would run a setter a guest put on
/// `Array.prototype`.
fn define_index<'js>(ctx: &Ctx<'js>, out: &Array<'js>, index: usize, value: Value<'js>) -> rquickjs::Result<()> {
    let index = u32::try_from(index).map_err(|_| Exception::throw_range(ctx, "web API: too many items"))?;
    let raw = ctx.as_raw().as_ptr();
    // SAFETY: defines an element of a live array; the call takes the reference duplicated here.
    let done = unsafe {
        qjs::JS_DefinePropertyValueUint32(
            raw,
            out.as_raw(),
            index,
            qjs::JS_DupValue(raw, value.as_raw()),
            qjs::JS_PROP_C_W_E as i32,
        )
    };
    if done < 0 {
        return Err(rquickjs::Error::Exception);
    }
    Ok(())
}

fn number<'js>(ctx: &Ctx<'js>, n: usize) -> Value<'js> {
    Value::new_number(ctx.clone(), n as f64)
}

// ---- the web bytecode --------------------------------------------------------------------------

/// `web.js` compiled at build time (`bytecode.rs`), read into a run on its first use of a web
/// API (most cells never touch one).
const WEB_BYTECODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/web.qbc"));

/// Hands `web_lazy.js` `host.loadWeb()`, which gives `[installWeb, host functions]` on the
/// run's first use of a web API: a run that never uses one builds neither.
pub(crate) fn install_host<'js>(ctx: &Ctx<'js>, host: &Object<'js>, flags: &Arc<Flags>) -> rquickjs::Result<()> {
    let flags = flags.clone();
    let load = Function::new(ctx.clone(), move |ctx: Ctx<'js>| -> rquickjs::Result<Array<'js>> {
        let install = run_bytecode(&ctx, WEB_BYTECODE)
            .map_err(|e| Exception::throw_internal(&ctx, &format!("web APIs unavailable: {e}")))?;
        let out = Array::new(ctx.clone())?;
        define_index(&ctx, &out, 0, install)?;
        define_index(&ctx, &out, 1, host_functions(&ctx, &flags)?.into_value())?;
        Ok(out)
    })?;
    host.set("loadWeb", load)
}

/// The host functions web.js calls (`web.*` there).
fn host_functions<'js>(ctx: &Ctx<'js>, flags: &Arc<Flags>) -> rquickjs::Result<Object<'js>> {
    let web = Object::new(ctx.clone())?;
    web.set(
        "classId",
        Function::new(ctx.clone(), |value: Value<'js>| -> u32 {
            // SAFETY: reads the class id of a live value (0 for a non-object).
            unsafe { qjs::JS_GetClassID(value.as_raw()) }
        })?,
    )?;

    web.set(
        "encode",
        Function::new(ctx.clone(), |ctx: Ctx<'js>, s: rquickjs::String<'js>| -> rquickjs::Result<Value<'js>> {
            // Read in place and copied straight into a new ArrayBuffer: nothing on the Rust side.
            let s = s.to_cstring()?;
            Ok(rquickjs::TypedArray::<u8>::new_copy(ctx, utf8(&s))?.into_value())
        })?,
    )?;
    web.set(
        "encodeInto",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>,
             s: rquickjs::String<'js>,
             buffer: Value<'js>,
             offset: f64,
             length: f64|
             -> rquickjs::Result<Array<'js>> {
                let s = s.to_cstring()?;
                let source = text(&ctx, &s)?;
                let (read, written) = if length == 0.0 {
                    (0, 0)
                } else {
                    let dest = buffer_range(&ctx, &buffer, offset, length)?;
                    // SAFETY: the range is inside the live buffer, which nothing else touches
                    // while this runs (no JS runs here); the source string is another block.
                    encode_into(source, unsafe { &mut *dest })
                };
                let out = Array::new(ctx.clone())?;
                define_index(&ctx, &out, 0, number(&ctx, read))?;
                define_index(&ctx, &out, 1, number(&ctx, written))?;
                Ok(out)
            },
        )?,
    )?;

    let f = flags.clone();
    web.set(
        "decode",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>,
                  prefix: Vec<u8>,
                  buffer: Value<'js>,
                  offset: f64,
                  length: f64,
                  fatal: bool,
                  stream: bool|
                  -> rquickjs::Result<Value<'js>> {
                let input: &[u8] = if length == 0.0 {
                    &[]
                } else {
                    // SAFETY: in bounds of the live buffer; only read while no JS runs.
                    unsafe { &*buffer_range(&ctx, &buffer, offset, length)? }
                };
                // The bytes a previous `stream` call kept (at most 3) go first.
                let (joined, _joined_held);
                let bytes: &[u8] = if prefix.is_empty() {
                    input
                } else {
                    _joined_held = reserve(&ctx, &f, prefix.len().saturating_add(input.len()))?;
                    joined = [prefix.as_slice(), input].concat();
                    &joined
                };
                // A lossy decode builds its text here: each input byte may become 3.
                let _lossy = if std::str::from_utf8(bytes).is_err() && !fatal {
                    Some(reserve(&ctx, &f, bytes.len().saturating_mul(3))?)
                } else {
                    None
                };
                let Some((text, kept)) = decode_utf8(bytes, fatal, stream) else {
                    return Err(Exception::throw_type(&ctx, "The encoded data was not valid for encoding utf-8"));
                };
                let out = Array::new(ctx.clone())?;
                define_index(&ctx, &out, 0, rquickjs::String::from_str(ctx.clone(), &text)?.into_value())?;
                let kept_bytes = Array::new(ctx.clone())?;
                for (i, &b) in bytes[bytes.len() - kept..].iter().enumerate() {
                    define_index(&ctx, &kept_bytes, i, number(&ctx, usize::from(b)))?;
                }
                define_index(&ctx, &out, 1, kept_bytes.into_value())?;
                Ok(out.into_value())
            },
        )?,
    )?;

    let f = flags.clone();
    web.set(
        "atob",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, s: rquickjs::String<'js>| -> rquickjs::Result<Option<rquickjs::String<'js>>> {
                let s = s.to_cstring()?;
                let input = text(&ctx, &s)?;
                // The whitespace-free copy, the bytes, and their Latin-1 text (up to 2 bytes each).
                let _held = reserve(&ctx, &f, input.len().saturating_mul(3))?;
                let Some(bytes) = forgiving_base64_decode(input) else { return Ok(None) };
                let latin1: String = bytes.iter().map(|&b| char::from(b)).collect();
                Ok(Some(rquickjs::String::from_str(ctx, &latin1)?))
            },
        )?,
    )?;
    let f = flags.clone();
    web.set(
        "btoa",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, s: rquickjs::String<'js>| -> rquickjs::Result<Option<rquickjs::String<'js>>> {
                let s = s.to_cstring()?;
                let input = text(&ctx, &s)?;
                // The bytes (at most one per input byte) and their base64 (4 per 3).
                let _held = reserve(&ctx, &f, input.len().saturating_mul(3))?;
                match latin1_base64_encode(input) {
                    Some(encoded) => Ok(Some(rquickjs::String::from_str(ctx, &encoded)?)),
                    None => Ok(None),
                }
            },
        )?,
    )?;

    let f = flags.clone();
    web.set(
        "urlParse",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>,
                  input: rquickjs::String<'js>,
                  base: Option<rquickjs::String<'js>>|
                  -> rquickjs::Result<Option<Array<'js>>> {
                let input = input.to_cstring()?;
                let base = base.map(|b| b.to_cstring()).transpose()?;
                let size = input.len().saturating_add(base.as_ref().map_or(0, |b| b.len()));
                let _held = reserve(&ctx, &f, size.saturating_mul(URL_BYTES_PER_INPUT_BYTE))?;
                let base = match &base {
                    Some(b) => Some(text(&ctx, b)?),
                    None => None,
                };
                match parse_url(text(&ctx, &input)?, base) {
                    Some(url) => Ok(Some(components_array(&ctx, &url)?)),
                    None => Ok(None),
                }
            },
        )?,
    )?;
    let f = flags.clone();
    web.set(
        "urlSet",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>,
                  href: rquickjs::String<'js>,
                  which: u32,
                  value: Option<rquickjs::String<'js>>|
                  -> rquickjs::Result<Option<Array<'js>>> {
                let href = href.to_cstring()?;
                let value = value.map(|v| v.to_cstring()).transpose()?;
                let size = href.len().saturating_add(value.as_ref().map_or(0, |v| v.len()));
                let _held = reserve(&ctx, &f, size.saturating_mul(URL_BYTES_PER_INPUT_BYTE))?;
                let Ok(mut url) = Url::parse(text(&ctx, &href)?) else {
                    return Err(Exception::throw_type(&ctx, "web API: a URL's own href does not parse"));
                };
                match &value {
                    // `null` for the query: the URLSearchParams update step removes it.
                    None if which == QUERY => url.set_query(None),
                    None => return Err(Exception::throw_type(&ctx, "web API: a URL setter needs a value")),
                    Some(v) if which == QUERY => url.set_query(Some(text(&ctx, v)?)),
                    Some(v) => {
                        if !set_url_component(&mut url, which, text(&ctx, v)?) {
                            return Ok(None);
                        }
                    }
                }
                Ok(Some(components_array(&ctx, &url)?))
            },
        )?,
    )?;

    let f = flags.clone();
    web.set(
        "formParse",
        Function::new(ctx.clone(), move |ctx: Ctx<'js>, s: rquickjs::String<'js>| -> rquickjs::Result<Array<'js>> {
            let s = s.to_cstring()?;
            // Percent-decoding never grows a pair; U+FFFD replaces at least what it stands for.
            let _held = reserve(&ctx, &f, s.len())?;
            let out = Array::new(ctx.clone())?;
            let mut i = 0;
            for (name, value) in url::form_urlencoded::parse(utf8(&s)) {
                define_index(&ctx, &out, i, rquickjs::String::from_str(ctx.clone(), &name)?.into_value())?;
                define_index(&ctx, &out, i + 1, rquickjs::String::from_str(ctx.clone(), &value)?.into_value())?;
                i += 2;
            }
            Ok(out)
        })?,
    )?;
    let f = flags.clone();
    web.set(
        "formSerialize",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, flat: Array<'js>| -> rquickjs::Result<rquickjs::String<'js>> {
                // Names and values alternate; each is already well-formed.
                let _list = reserve(&ctx, &f, flat.len().saturating_mul(std::mem::size_of::<rquickjs::CString>()))?;
                let mut parts = Vec::with_capacity(flat.len());
                let mut size = 0usize;
                for i in 0..flat.len() {
                    let part = flat.get::<rquickjs::String>(i)?.to_cstring()?;
                    size = size.saturating_add(part.len());
                    parts.push(part);
                }
                // Percent-encoding triples a byte at most; `=` and `&` add one per name and value.
                let _held = reserve(&ctx, &f, size.saturating_mul(3).saturating_add(flat.len()))?;
                let mut form = url::form_urlencoded::Serializer::new(String::new());
                for pair in parts.chunks(2) {
                    if let [name, value] = pair {
                        form.append_pair(text(&ctx, name)?, text(&ctx, value)?);
                    }
                }
                rquickjs::String::from_str(ctx, &form.finish())
            },
        )?,
    )?;
    Ok(web)
}

/// `urlSet`'s pseudo-component for the URLSearchParams update step (the query without `?`).
const QUERY: u32 = 11;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, ErrorCode, Status};
    use crate::frontend::Language;
    use crate::limits::Limits;
    use crate::Catalog;

    fn run_with(limits: Limits, code: &str) -> Status {
        let mut engine = match Engine::new(limits, Arc::new(Catalog::empty())) {
            Ok(engine) => engine,
            Err(e) => panic!("{e}"),
        };
        engine.start(code, Language::JavaScript, 10_000.0, 1, "{}").status
    }

    /// The cell's value as JSON text; panics with the failure otherwise.
    fn run(code: &str) -> String {
        match run_with(Limits::default(), code) {
            Status::Completed(json) => json,
            other => panic!("{code}: {other:?}"),
        }
    }

    /// Runs `code` with the host's web functions as the global `web` in a bare context, as the
    /// prelude would call them: the way to hand them arguments web.js never would.
    fn call_host(code: &str) -> Result<String, String> {
        let flags = Arc::new(Flags::new(64 << 20));
        let runtime = rquickjs::Runtime::new().map_err(|e| e.to_string())?;
        let context = rquickjs::Context::full(&runtime).map_err(|e| e.to_string())?;
        context.with(|ctx| {
            let web = host_functions(&ctx, &flags).map_err(|e| e.to_string())?;
            ctx.globals().set("web", web).map_err(|e| e.to_string())?;
            match ctx.eval::<String, _>(code) {
                Ok(v) => Ok(v),
                Err(rquickjs::Error::Exception) => Err(format!("{:?}", ctx.catch())),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    /// The error `call_host(code)` must end with.
    fn host_error(code: &str) -> String {
        match call_host(code) {
            Err(message) => message,
            Ok(value) => panic!("{code} gave {value}"),
        }
    }

    #[test]
    fn encode_into_stops_before_a_character_that_does_not_fit() {
        let mut buf = [0u8; 5];
        assert_eq!(encode_into("a€𝄞", &mut buf), (2, 4));
        assert_eq!(&buf, &[b'a', 0xE2, 0x82, 0xAC, 0]);
        assert_eq!(encode_into("𝄞", &mut [0u8; 4]), (2, 4));
        assert_eq!(encode_into("x", &mut []), (0, 0));
    }

    #[test]
    fn decode_replaces_each_maximal_invalid_subpart_as_whatwg_does() {
        let (text, kept) = decode_utf8(b"a\xFFb\xF0\x80\x80\xE2\x82", false, false).unwrap_or_default();
        assert_eq!((text.as_ref(), kept), ("a\u{FFFD}b\u{FFFD}\u{FFFD}\u{FFFD}\u{FFFD}", 0));
        assert!(decode_utf8(b"ok\xC0", true, false).is_none());
    }

    #[test]
    fn streaming_decode_keeps_only_an_unfinished_valid_prefix() {
        assert_eq!(decode_utf8(b"a\xE2\x82", false, true).map(|(t, k)| (t.into_owned(), k)), Some(("a".into(), 2)));
        assert_eq!(decode_utf8(b"a\xF0\x9D\x84", true, true).map(|(t, k)| (t.into_owned(), k)), Some(("a".into(), 3)));
        // An invalid byte at the end is not a prefix: it is replaced (or fatal) at once.
        assert_eq!(decode_utf8(b"a\xFF", false, true).map(|(t, k)| (t.into_owned(), k)), Some(("a\u{FFFD}".into(), 0)));
        assert!(decode_utf8(b"a\xE2\x28", true, true).is_none());
    }

    #[test]
    fn forgiving_base64_follows_the_whatwg_algorithm() {
        assert_eq!(forgiving_base64_decode(" aGVs\tbG8=\n").as_deref(), Some(&b"hello"[..]));
        assert_eq!(forgiving_base64_decode("aGVsbG8").as_deref(), Some(&b"hello"[..]));
        assert_eq!(forgiving_base64_decode("ab").as_deref(), Some(&b"i"[..]));
        assert_eq!(forgiving_base64_decode("").as_deref(), Some(&b""[..]));
        for bad in ["aGVsbG8==", "a", "=", "ab=c", "ab===", "a-b_", "\u{e9}AAA", "AA\u{a0}A"] {
            assert_eq!(forgiving_base64_decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn latin1_base64_refuses_code_points_above_ff() {
        assert_eq!(latin1_base64_encode("\u{ff}\u{fe}").as_deref(), Some("//4="));
        assert_eq!(latin1_base64_encode("\u{100}"), None);
    }

    #[test]
    fn url_setters_ignore_unusable_values_and_only_href_fails() {
        let Some(mut url) = parse_url("../x?q#f", Some("http://h/a/b/")) else { panic!("does not parse") };
        assert_eq!(url.as_str(), "http://h/a/x?q#f");
        assert!(set_url_component(&mut url, 7, "not a port"));
        assert!(set_url_component(&mut url, 9, "?a=1"));
        assert_eq!(url_components(&url)[9], "?a=1");
        assert!(!set_url_component(&mut url, 0, "no scheme"));
        assert_eq!(url.as_str(), "http://h/a/x?a=1#f");
        assert!(parse_url("/relative", None).is_none());
    }

    #[test]
    fn host_functions_refuse_a_view_outside_its_buffer() {
        let message = host_error("web.decode([], new ArrayBuffer(4), 2, 8, false, false)");
        assert!(message.contains("outside its buffer"), "{message}");
        let message = host_error("String(web.encodeInto('ab', new ArrayBuffer(4), -1, 2))");
        assert!(message.contains("outside its buffer"), "{message}");
        let message = host_error("web.decode([], {}, 0, 1, false, false)");
        assert!(message.contains("ArrayBuffer"), "{message}");
    }

    #[test]
    fn host_functions_reject_strings_that_are_not_well_formed() {
        let message = host_error("web.btoa('\\uD800')");
        assert!(message.contains("not well-formed"), "{message}");
    }

    #[test]
    fn host_functions_report_failure_as_undefined_for_web_js_to_throw() {
        assert_eq!(
            call_host("String([web.atob('*'), web.btoa('\\u0100'), web.urlParse('nope', undefined)])"),
            Ok(",,".into())
        );
        assert_eq!(call_host("web.formSerialize(['a b', '\\u00e9', '&', '='])"), Ok("a+b=%C3%A9&%26=%3D".into()));
    }

    #[test]
    fn a_reservation_past_the_memory_limit_ends_the_run() {
        let limits = Limits { memory_bytes: 4 << 20, ..Limits::default() };
        // 1.5 MiB of input is 4.5 MiB reserved for atob: past the limit before anything is built.
        match run_with(limits, "try { atob('A'.repeat(1536 << 10)); } catch (e) { return 'caught'; } return 'fit'") {
            Status::Failed(f) => assert_eq!(f.code, Some(ErrorCode::MemoryLimitExceeded), "{f:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reservations_are_given_back_when_the_host_function_returns() {
        let limits = Limits { memory_bytes: 8 << 20, ..Limits::default() };
        let code = "const s = 'A'.repeat(512 << 10); for (let i = 0; i < 64; i++) atob(s); return 'done'";
        assert_eq!(run_with(limits, code), Status::Completed("\"done\"".into()));
    }

    #[test]
    fn the_web_apis_load_on_first_use_only() {
        // Before any use the globals are accessors; reading one turns them all into values.
        let code = "const d = () => Object.getOwnPropertyDescriptor(globalThis, 'URL'); const before = typeof d().get; typeof btoa; return [before, typeof d().value]";
        assert_eq!(run(code), r#"["function","function"]"#);
    }

    #[test]
    fn the_embedded_web_bytecode_is_this_source_compiled() {
        let fresh = crate::bytecode::compile(crate::bytecode::WEB_SOURCE, crate::bytecode::WEB_NAME);
        assert_eq!(fresh.as_deref(), Ok(WEB_BYTECODE));
    }
}
