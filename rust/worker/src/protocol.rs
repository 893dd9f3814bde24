//! The worker protocol's frames, mirrored from `python/codemode/protocol.py`.
//!
//! protocol.py stays the one definition: its msgspec structs are what the host encodes and
//! decodes, and these types decode and encode the same bytes. The two are pinned together by
//! `tests/test_protocol_pinned.py` (hypothesis builds every frame, msgspec encodes it, this
//! binary's `echo` mode decodes and re-encodes it, the bytes must be equal) and by the frame
//! fuzzer (`tests/frame_fuzz.py`) run against the worker.
//!
//! msgspec's rules, as these types follow them:
//! - a `Struct(tag=..., array_like=True)` is an array, its tag (a string) first, then its fields
//!   in declaration order; a nested tagged struct (`Replay.start`) carries its tag too, an
//!   untagged one (`EngineLimits`) does not. A map is refused.
//! - decoding, trailing fields with a default may be missing, and extra elements past the last
//!   field are ignored (msgspec's forward compatibility); bytes after the frame are refused.
//! - `int` is the smallest msgpack integer; a float field also takes an integer; `str` is msgpack
//!   str, `bytes` is bin; `tuple` and `list` are arrays; `None` is nil; a `Literal` is its value.
//!
//! Integers have the engine's types (a call id is a `u32`, a seed a `u64`): a host frame outside
//! them is malformed here, as it was for the Python worker (whose conversion into the engine
//! raised and ended it).

use std::fmt;
use std::marker::PhantomData;
use std::num::NonZeroU32;
use std::ops::Deref;

use codemode_engine::CallMethod;
use serde::de::{self, DeserializeSeed, IgnoredAny, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Cap on one frame in either direction: `MAX_FRAME_BYTES` in protocol.py (pinned by a test).
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// Counts macro arguments (the number of fields of a frame).
macro_rules! count {
    () => { 0usize };
    ($head:tt $($tail:tt)*) => { 1usize + count!($($tail)*) };
}

/// `str`: a msgpack str. (serde's `String` also takes bin holding UTF-8, which msgspec refuses.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Text(pub String);

impl Deref for Text {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<String> for Text {
    fn from(text: String) -> Text {
        Text(text)
    }
}

impl From<&str> for Text {
    fn from(text: &str) -> Text {
        Text(text.to_owned())
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextOnly;

        impl Visitor<'_> for TextOnly {
            type Value = Text;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a str")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Text, E> {
                Ok(Text(text.to_owned()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<Text, E> {
                Ok(Text(text))
            }
        }

        d.deserialize_string(TextOnly)
    }
}

/// `bytes`: a msgpack bin. (rmp-serde hands a str that is not UTF-8 over as bytes too: that
/// one str msgspec refuses is taken here.)
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bin(pub Vec<u8>);

impl Serialize for Bin {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Bin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct BinOnly;

        impl Visitor<'_> for BinOnly {
            type Value = Bin;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a bin")
            }

            fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Bin, E> {
                Ok(Bin(bytes.to_vec()))
            }

            fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<Bin, E> {
                Ok(Bin(bytes))
            }
        }

        d.deserialize_bytes(BinOnly)
    }
}

/// A `Literal` of strings: encoded as its text, any other text refused.
macro_rules! literal {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($variant),+ }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            fn parse(text: &str) -> Option<$name> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_str(TextVisitor(stringify!($name), $name::parse))
            }
        }
    };
}

/// Reads a msgpack str (never bin) and maps it through `.1`.
struct TextVisitor<T>(&'static str, fn(&str) -> Option<T>);

impl<T> Visitor<'_> for TextVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} string", self.0)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
        (self.1)(text).ok_or_else(|| E::invalid_value(de::Unexpected::Str(text), &self))
    }
}

literal!(
    /// `Status`: what a run's step ended in.
    Status { Completed = "completed", Failed = "failed", Pending = "pending" }
);

literal!(
    /// `FailureCode`: the codes an engine may report.
    FailureCode {
        InvalidInput = "invalid_input",
        Timeout = "timeout",
        OutputLimitExceeded = "output_limit_exceeded",
        MemoryLimitExceeded = "memory_limit_exceeded",
        InternalError = "internal_error",
    }
);

/// `CallMethod`: the engine's own names (`CallMethod::as_str`, the one definition).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Method(pub CallMethod);

impl Serialize for Method {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.as_str())
    }
}

impl<'de> Deserialize<'de> for Method {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(TextVisitor("CallMethod", |text| CallMethod::parse(text).map(Method)))
    }
}

/// `OutputKind`: protocol.py's `Literal[0, ...]`, the engine's `OutputKind` by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputKind(pub u8);

impl Serialize for OutputKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(self.0)
    }
}

impl<'de> Deserialize<'de> for OutputKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let kind = u8::deserialize(d)?;
        if codemode_engine::OutputKind::from_i32(kind.into()).is_none() {
            return Err(de::Error::invalid_value(de::Unexpected::Unsigned(kind.into()), &"an output kind"));
        }
        Ok(OutputKind(kind))
    }
}

/// `ClockRun`: a reading (whole ms) and how many times in a row it was read (1 to 2**32-1).
pub type ClockRun = (f64, NonZeroU32);
/// A tool result: `(call_id, ok, payload)`.
pub type Result3 = (u32, bool, Text);
/// `Call`: `(call_id, tool, input, method)`.
pub type Call = (u32, Text, Text, Method);
/// `Report.failure`: `(code, name, message, stack)`.
pub type FailureTuple = (Option<FailureCode>, Text, Text, Text);

/// The element reader of a struct's array: counts fields for the error of a missing one.
struct Fields<'a, A> {
    seq: &'a mut A,
    read: usize,
    expecting: &'static str,
}

impl<'de, A: SeqAccess<'de>> Fields<'_, A> {
    fn required<T: Deserialize<'de>>(&mut self) -> Result<T, A::Error> {
        match self.seq.next_element()? {
            Some(value) => {
                self.read += 1;
                Ok(value)
            }
            None => Err(de::Error::invalid_length(self.read, &self.expecting)),
        }
    }

    fn optional<T: Deserialize<'de>>(&mut self, default: impl FnOnce() -> T) -> Result<T, A::Error> {
        match self.seq.next_element()? {
            Some(value) => {
                self.read += 1;
                Ok(value)
            }
            None => Ok(default()),
        }
    }

    /// msgspec ignores elements past the last field.
    fn rest(self) -> Result<(), A::Error> {
        while self.seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

/// The tag at the head of a tagged frame: its index in `.0` (`.1` names what is read).
struct TagSeed<'t>(&'t [&'static str], &'static str);

impl<'de> DeserializeSeed<'de> for TagSeed<'_> {
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for TagSeed<'_> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the tag of {} (one of {:?})", self.1, self.0)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<usize, E> {
        self.0.iter().position(|tag| *tag == text).ok_or_else(|| E::invalid_value(de::Unexpected::Str(text), &self))
    }
}

/// Visits the array of one struct (`TAG` checked first when it has one).
struct StructVisitor<T>(PhantomData<T>);

/// A struct of the protocol: its fields after the tag, read from (and written to) one array.
trait ArrayLike: Sized {
    const TAG: Option<&'static str>;
    const EXPECTING: &'static str;
    fn read_fields<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<Self, A::Error>;
}

impl<'de, T: ArrayLike> Visitor<'de> for StructVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        if let Some(tag) = T::TAG {
            if seq.next_element_seed(TagSeed(std::slice::from_ref(&tag), T::EXPECTING))?.is_none() {
                return Err(de::Error::invalid_length(0, &self));
            }
        }
        T::read_fields(&mut seq)
    }
}

/// One `Struct(array_like=True)` of protocol.py, its fields in order (`= default` on trailing
/// fields msgspec lets a frame leave out).
macro_rules! frame {
    ($(#[$meta:meta])* $name:ident $([$tag:literal])? {
        $($(#[$fmeta:meta])* $field:ident: $ty:ty $(= $default:expr)?),+ $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        pub struct $name { $($(#[$fmeta])* pub $field: $ty),+ }

        impl ArrayLike for $name {
            const TAG: Option<&'static str> = frame!(@tag $($tag)?);
            const EXPECTING: &'static str = concat!("a `", stringify!($name), "` frame array");

            fn read_fields<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<Self, A::Error> {
                let mut fields = Fields { seq, read: 0, expecting: Self::EXPECTING };
                $(let $field: $ty = frame!(@read fields $($default)?);)+
                fields.rest()?;
                Ok($name { $($field),+ })
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let tagged = Self::TAG.is_some() as usize;
                let mut array = s.serialize_tuple(tagged + count!($($field)+))?;
                if let Some(tag) = Self::TAG {
                    array.serialize_element(tag)?;
                }
                $(array.serialize_element(&self.$field)?;)+
                array.end()
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_seq(StructVisitor(PhantomData))
            }
        }
    };
    (@tag $tag:literal) => { Some($tag) };
    (@tag) => { None };
    (@read $fields:ident $default:expr) => { $fields.optional(|| $default)? };
    (@read $fields:ident) => { $fields.required()? };
}

frame!(
    /// What a worker needs to build an engine; a change makes it rebuild its spare.
    EngineLimits {
        memory_limit_bytes: usize,
        max_output_bytes: usize,
        max_pending_calls: usize,
        search_default_limit: usize,
        max_search_limit: usize,
    }
);

frame!(
    /// Limits and catalog for the engines built from now on (sent only when they change).
    Configure["configure"] {
        limits: EngineLimits,
        catalog_json: Text,
        /// Hash of `catalog_json`: journals record it, a replay must see the same catalog.
        fingerprint: Text,
        /// The semantic search model as a pack, or empty: BM25 alone.
        semantic: Bin = Bin::default(),
    }
);

frame!(
    Start["start"] {
        run: u64,
        source: Text,
        language: Text,
        timeout_ms: f64,
        seed: u64,
        /// The run's setup: `{"namespaces"?: [...], "store"?: {key: json}}` (`{}` for none).
        run_json: Text = Text(String::from("{}")),
        /// A fixed clock's first reading (ms since the epoch), or the real clock.
        clock_start: Option<f64> = None,
    }
);

frame!(
    /// Tool results: `(call_id, ok, payload)`.
    Settle["settle"] {
        run: u64,
        results: Vec<Result3>,
        timeout_ms: f64,
    }
);

frame!(
    /// Rebuild a suspended run from its journal: start, settle each batch, keep it resident.
    Replay["replay"] {
        start: Start,
        batches: Vec<Vec<Result3>>,
        clock_reads: Vec<ClockRun>,
    }
);

frame!(
    /// Forget a resident run.
    Drop["drop"] { run: u64 }
);

frame!(
    Ready["ready"] { pid: u64, engine_version: Text }
);

frame!(
    /// One engine outcome.
    Report["report"] {
        run: u64,
        status: Status,
        value: Option<Text>,
        failure: Option<FailureTuple>,
        outputs: Vec<(OutputKind, Text)>,
        calls: Vec<Call>,
        clock_reads: Vec<ClockRun>,
        in_flight: u64,
        memory_bytes: u64,
        searches: u64,
        describes: u64,
        /// On completion: the cell's `store` writes, `{key: json | null}`.
        store_writes: Option<Text>,
    }
);

frame!(
    /// The worker could not serve a frame (e.g. its runtime could not be built).
    Fault["fault"] { run: u64, message: Text }
);

/// A tagged union of frames (msgspec picks the struct by the tag at the head of the array).
macro_rules! union {
    ($(#[$meta:meta])* $name:ident { $($variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        // (A frame is built once and moved once or twice: a `Report` needs no box.)
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug, Clone, PartialEq)]
        pub enum $name { $($variant($variant)),+ }

        impl $name {
            const TAGS: &'static [&'static str] = &[$(match $variant::TAG { Some(t) => t, None => "" }),+];
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                match self { $($name::$variant(frame) => frame.serialize(s)),+ }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct UnionVisitor;

                impl<'de> Visitor<'de> for UnionVisitor {
                    type Value = $name;

                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str(concat!("a ", stringify!($name), " array"))
                    }

                    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<$name, A::Error> {
                        let Some(index) = seq.next_element_seed(TagSeed($name::TAGS, stringify!($name)))? else {
                            return Err(de::Error::invalid_length(0, &self));
                        };
                        let mut at = 0usize;
                        $(
                            if index == at {
                                return $variant::read_fields(&mut seq).map($name::$variant);
                            }
                            at += 1;
                        )+
                        let _ = at;
                        Err(de::Error::custom("unknown tag"))
                    }
                }

                d.deserialize_seq(UnionVisitor)
            }
        }
    };
}

union!(
    /// host -> worker
    HostFrame { Configure, Start, Settle, Replay, Drop }
);

union!(
    /// worker -> host
    WorkerFrame { Ready, Report, Fault }
);

union!(
    /// Either direction: what the `echo` mode reads.
    AnyFrame { Configure, Start, Settle, Replay, Drop, Ready, Report, Fault }
);

/// Why a frame body did not decode.
#[derive(Debug)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One frame from a whole body: the body must hold exactly one msgpack value. (Read through a
/// slice that advances as it is read, so what is left after the frame is exact: trying to read a
/// second value instead would take a truncated one, `0x81` say, for the end of the body.)
pub fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    let mut rest = body;
    let frame = T::deserialize(&mut rmp_serde::Deserializer::new(&mut rest)).map_err(|e| DecodeError(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError("trailing bytes after the frame".to_owned()));
    }
    Ok(frame)
}

/// The frame with its 4-byte big-endian length prefix, ready for one write.
pub fn encode<T: Serialize>(frame: &T) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; 4];
    frame.serialize(&mut rmp_serde::Serializer::new(&mut out)).map_err(|e| e.to_string())?;
    let size = u32::try_from(out.len() - 4).map_err(|_| "frame larger than 4 GiB".to_owned())?;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(frame: AnyFrame) {
        let bytes = encode(&frame).expect("encodes");
        let back: AnyFrame = decode(&bytes[4..]).expect("decodes");
        assert_eq!(back, frame);
    }

    #[test]
    fn frames_round_trip() {
        roundtrip(AnyFrame::Drop(Drop { run: 5 }));
        roundtrip(AnyFrame::Start(Start {
            run: 1,
            source: "return 1".into(),
            language: "javascript".into(),
            timeout_ms: 1000.5,
            seed: u64::MAX,
            run_json: "{}".into(),
            clock_start: Some(1_735_689_600_000.0),
        }));
        roundtrip(AnyFrame::Report(Report {
            run: 3,
            status: Status::Failed,
            value: None,
            failure: Some((Some(FailureCode::Timeout), "E".into(), "m".into(), Text::default())),
            outputs: vec![(OutputKind(6), "image/png;AA".into())],
            calls: vec![(7, "t".into(), "{}".into(), Method(CallMethod::ReadOutput))],
            clock_reads: vec![(1.0, NonZeroU32::MIN)],
            in_flight: 1,
            memory_bytes: 1 << 40,
            searches: 0,
            describes: 2,
            store_writes: None,
        }));
    }

    #[test]
    fn drop_is_encoded_as_msgspec_encodes_it() {
        // msgspec.msgpack.encode(Drop(5)) == b'\x92\xa4drop\x05'
        assert_eq!(encode(&Drop { run: 5 }).expect("encodes"), b"\x00\x00\x00\x07\x92\xa4drop\x05");
    }

    #[test]
    fn missing_defaults_extra_elements_and_trailing_bytes() {
        // ["start", 1, "s", "js", 1, 2]: run_json left out, an int timeout.
        let start: HostFrame = decode(b"\x96\xa5start\x01\xa1s\xa2js\x01\x02").expect("decodes");
        let HostFrame::Start(start) = start else { panic!("not a start") };
        assert_eq!((start.timeout_ms, &*start.run_json), (1.0, "{}"));
        // ["drop", 5, 6]: the extra element is ignored, as msgspec ignores it.
        assert!(matches!(decode::<HostFrame>(b"\x93\xa4drop\x05\x06"), Ok(HostFrame::Drop(Drop { run: 5 }))));
        assert!(decode::<HostFrame>(b"\x92\xa4drop\x05\x00").is_err());
        // A truncated value after the frame (a map of one entry, then the end) is trailing too.
        assert!(decode::<HostFrame>(b"\x92\xa4drop\xcc\x00\x81").is_err());
        assert!(decode::<HostFrame>(b"\x92\xa4drop\x05\xa3ab").is_err());
        assert!(decode::<HostFrame>(b"\x91\xa4drop").is_err());
        assert!(decode::<HostFrame>(b"\x92\xa5ready\x05").is_err());
        assert!(decode::<HostFrame>(b"\x81\xa4drop\x05").is_err());
        assert!(decode::<HostFrame>(b"").is_err());
        assert!(decode::<HostFrame>(b"\x92\xc4\x04drop\x05").is_err());
    }
}
