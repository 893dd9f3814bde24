"""The web APIs a cell can use: TextEncoder/TextDecoder, atob/btoa, URL/URLSearchParams,
structuredClone and DOMException, run through the public API.

Each behaviour is the WHATWG/HTML one; hostile cells (wrong types, throwing getters, tampered
prototypes, huge inputs) get a clear error or a clean failure, and the pool keeps working.
"""

from __future__ import annotations

from typing import Any

import pytest
from codemode import CodeMode, Session

WEB_GLOBALS = [
    "TextEncoder",
    "TextDecoder",
    "atob",
    "btoa",
    "URL",
    "URLSearchParams",
    "structuredClone",
    "DOMException",
]


def value(session: Session, code: str) -> Any:
    result = session.exec({"code": code, "language": "javascript"})
    assert result["status"] == "completed", result
    return result["value"]


def error(session: Session, code: str) -> str:
    result = session.exec({"code": code, "language": "javascript"})
    assert result["status"] == "failed", result
    assert "code" not in result, result  # a guest exception, not a broken limit
    return result["error"]


# ---- the globals ---------------------------------------------------------------------------------


def test_web_globals_exist_and_are_functions(session):
    assert value(session, f"return {WEB_GLOBALS}.map((n) => typeof globalThis[n])") == ["function"] * len(WEB_GLOBALS)


def test_web_globals_are_listed_before_first_use_and_not_enumerable(session):
    code = (
        f"const names = Object.getOwnPropertyNames(globalThis); return [{WEB_GLOBALS}.every((n) => "
        f"names.includes(n)), Object.keys(globalThis)]"
    )
    assert value(session, code) == [True, []]


def test_web_globals_can_be_replaced_and_deleted_by_the_guest(session):
    code = "globalThis.atob = (s) => 'mine:' + s; delete globalThis.URL; return [atob('x'), typeof URL, btoa('a')]"
    assert value(session, code) == ["mine:x", "undefined", "YQ=="]


def test_a_global_read_after_first_use_is_a_plain_writable_value(session):
    code = (
        "btoa('x'); const d = Object.getOwnPropertyDescriptor(globalThis, 'URL'); return [typeof d.value, "
        "d.writable, d.enumerable, d.configurable]"
    )
    assert value(session, code) == ["function", True, False, True]


def test_classes_carry_their_to_string_tag(session):
    code = """return [new TextEncoder(), new TextDecoder(), new URL('http://a'), new URLSearchParams(),
        new URLSearchParams().entries(), new DOMException()].map((o) => Object.prototype.toString.call(o))"""
    assert value(session, code) == [
        "[object TextEncoder]",
        "[object TextDecoder]",
        "[object URL]",
        "[object URLSearchParams]",
        "[object URLSearchParams Iterator]",
        "[object DOMException]",
    ]


def test_namespace_names_cannot_take_a_web_global():
    from codemode.namespaces import guest_globals

    assert set(WEB_GLOBALS) <= guest_globals()


# ---- TextEncoder ---------------------------------------------------------------------------------


def test_text_encoder_encodes_utf8_and_replaces_lone_surrogates(session):
    code = (
        "const e = new TextEncoder(); return [e.encoding, [...e.encode('h€𝄞\\uD800')], e.encode().length, "
        "[...e.encode(null)]]"
    )
    assert value(session, code) == [
        "utf-8",
        [104, 226, 130, 172, 240, 157, 132, 158, 239, 191, 189],
        0,
        [110, 117, 108, 108],
    ]


def test_encode_into_writes_whole_characters_and_reports_code_units(session):
    code = """const e = new TextEncoder(); const small = new Uint8Array(5);
    const big = new Uint8Array(8);
    return [e.encodeInto('a€𝄞', small), [...small], e.encodeInto('𝄞x', big.subarray(2, 7)), [...big]]"""
    assert value(session, code) == [
        {"read": 2, "written": 4},
        [97, 226, 130, 172, 0],
        {"read": 3, "written": 5},
        [0, 0, 240, 157, 132, 158, 120, 0],
    ]


@pytest.mark.parametrize(
    ("destination", "message"),
    [
        ("new Int8Array(4)", "the destination is not a Uint8Array"),
        ("[0, 0]", "the destination is not a Uint8Array"),
        ("new Uint8Array(new ArrayBuffer(4).transferToImmutable())", "immutable"),
    ],
)
def test_encode_into_refuses_a_destination_it_may_not_write(session, destination, message):
    assert message in error(session, f"new TextEncoder().encodeInto('ab', {destination})")


def test_encode_into_a_detached_or_empty_view_writes_nothing(session):
    code = (
        "const b = new ArrayBuffer(4); const v = new Uint8Array(b); b.transfer(); return [new "
        "TextEncoder().encodeInto('ab', v), new TextEncoder().encodeInto('ab', new Uint8Array(0))]"
    )
    assert value(session, code) == [{"read": 0, "written": 0}] * 2


def test_text_encoder_methods_refuse_a_foreign_this(session):
    assert "'this' is not a TextEncoder" in error(session, "TextEncoder.prototype.encode.call({}, 'a')")


# ---- TextDecoder ---------------------------------------------------------------------------------


def test_text_decoder_replaces_invalid_bytes_and_strips_one_bom(session):
    code = """const d = new TextDecoder();
    return [d.decode(new Uint8Array([0xEF, 0xBB, 0xBF, 0xEF, 0xBB, 0xBF, 0x61, 0xFF, 0x62, 0xF0, 0x80, 0x80, 0xE2,
      0x82])),
        new TextDecoder('utf-8', {ignoreBOM: true}).decode(new Uint8Array([0xEF, 0xBB, 0xBF])).length, d.decode()]"""
    assert value(session, code) == ["\ufeffa\ufffdb\ufffd\ufffd\ufffd\ufffd", 1, ""]


def test_text_decoder_reads_every_buffer_source(session):
    code = """const bytes = new TextEncoder().encode('abc'); const d = new TextDecoder();
    const shared = new SharedArrayBuffer(2); new Uint8Array(shared).set([0x68, 0x69]);
    return [d.decode(bytes.buffer), d.decode(new DataView(bytes.buffer, 1, 1)), d.decode(new Uint16Array([0x6261])),
        d.decode(bytes.subarray(2)), d.decode(shared)]"""
    assert value(session, code) == ["abc", "b", "ab", "c", "hi"]


def test_text_decoder_fatal_mode_throws_a_type_error(session):
    message = error(session, "new TextDecoder('utf8', {fatal: true}).decode(new Uint8Array([0x61, 0xC0]))")
    assert message == "TypeError: The encoded data was not valid for encoding utf-8"


def test_streaming_decode_keeps_a_split_character_and_bom_for_the_next_chunk(session):
    code = """const d = new TextDecoder();
    const parts = [[0xEF, 0xBB], [0xBF, 0xE2, 0x82], [0xAC, 0xF0], [0x9D, 0x84,
      0x9E]].map((p) => d.decode(new Uint8Array(p), {stream: true}));
    parts.push(d.decode(new Uint8Array([0xE2]), {stream: true}), d.decode());
    return parts"""
    assert value(session, code) == ["", "", "€", "𝄞", "", "\ufffd"]


def test_text_decoder_accepts_utf8_labels_and_refuses_others_with_a_range_error(session):
    code = "return [' UTF8\\n', 'unicode-1-1-utf-8', 'Utf-8'].map((l) => new TextDecoder(l).encoding)"
    assert value(session, code) == ["utf-8"] * 3
    message = error(session, "new TextDecoder('latin1')")
    assert message.startswith("RangeError:") and "('latin1')" in message and "only UTF-8" in message


@pytest.mark.parametrize(
    "code",
    [
        "new TextDecoder().decode('text')",
        "new TextDecoder().decode({length: 3})",
        "new TextDecoder().decode(new Uint8Array(1), 5)",
        "new TextDecoder('utf-8', 1)",
    ],
)
def test_text_decoder_refuses_wrong_argument_types(session, code):
    assert error(session, code).startswith("TypeError:")


def test_decode_reads_the_buffer_after_an_options_getter_detached_it(session):
    code = (
        "const b = new Uint8Array([0x61, 0x62]); return new TextDecoder().decode(b, {get stream() { "
        "b.buffer.transfer(); return false; }})"
    )
    assert value(session, code) == ""


# ---- atob / btoa ---------------------------------------------------------------------------------


def test_btoa_and_atob_round_trip_binary_strings(session):
    code = "return [btoa('hello'), btoa('\\xff\\xfe'), btoa(''), atob(btoa('\\x00\\x80\\xff')) === '\\x00\\x80\\xff']"
    assert value(session, code) == ["aGVsbG8=", "//4=", "", True]


@pytest.mark.parametrize(
    ("encoded", "decoded"),
    [
        (" aGVs\tbG8=\n", "hello"),
        ("aGVsbG8", "hello"),
        ("ab", "i"),
        ("abc", "i\xb7"),
        ("/w==", "\xff"),
        ("", ""),
        ("YQ= =", "a"),
        ("YQ", "a"),
    ],
)
def test_atob_is_forgiving_about_whitespace_and_padding(session, encoded, decoded):
    assert value(session, f"return atob({encoded!r})") == decoded


@pytest.mark.parametrize("encoded", ["aGVsbG8==", "a", "=", "ab=c", "ab===", "a-b_", "€€€€", "YQ=x"])
def test_atob_refuses_what_is_not_base64_with_an_invalid_character_error(session, encoded):
    code = (
        f"try {{ atob({encoded!r}); return 'decoded'; }} catch (e) {{ return [e.name, e.code, e instanceof "
        f"DOMException, e instanceof Error] }}"
    )
    assert value(session, code) == ["InvalidCharacterError", 5, True, True]


def test_btoa_refuses_characters_above_latin1(session):
    message = error(session, "btoa('caf\\u00e9 \\u20ac')")
    assert (
        message
        == "InvalidCharacterError: btoa: the string to be encoded contains characters outside of the Latin1 range."
    )


def test_atob_and_btoa_need_an_argument_and_convert_others_to_strings(session):
    assert error(session, "atob()") == "TypeError: atob: 1 argument required, but only 0 present."
    assert value(session, "return [btoa(null), btoa(12)]") == ["bnVsbA==", "MTI="]


# ---- URL -----------------------------------------------------------------------------------------


def test_url_parses_into_whatwg_components(session):
    code = """const u = new URL('https://user:pw@EXAMPLE.com:8080/a/../b?x=1#h');
    return [u.href, u.origin, u.protocol, u.username, u.password, u.host, u.hostname, u.port, u.pathname, u.search,
      u.hash]"""
    assert value(session, code) == [
        "https://user:pw@example.com:8080/b?x=1#h",
        "https://example.com:8080",
        "https:",
        "user",
        "pw",
        "example.com:8080",
        "example.com",
        "8080",
        "/b",
        "?x=1",
        "#h",
    ]


def test_url_resolves_against_a_base_and_maps_idna_hosts(session):
    code = (
        "return [new URL('../c?d', 'http://h/a/b/').href, new URL('http://münchen.DE/').hostname, new "
        "URL('HTTP://h:80/').href]"
    )
    assert value(session, code) == ["http://h/a/c?d", "xn--mnchen-3ya.de", "http://h/"]


def test_invalid_url_throws_a_type_error_naming_the_input(session):
    assert error(session, "new URL('no scheme')") == "TypeError: Invalid URL: 'no scheme'"
    assert "against base 'also bad'" in error(session, "new URL('/a', 'also bad')")


def test_url_can_parse_and_parse_do_not_throw(session):
    code = (
        "return [URL.canParse('x:'), URL.canParse('/a'), URL.canParse('/a', 'http://b'), URL.parse('/q'), "
        "URL.parse('/q', 'http://h').href]"
    )
    assert value(session, code) == [True, False, True, None, "http://h/q"]


def test_url_setters_follow_the_spec_and_ignore_what_they_cannot_use(session):
    code = """const u = new URL('http://a.example/p?q#f');
    u.protocol = 'https'; u.port = 'abc'; u.port = '8443'; u.hostname = 'b.example'; u.pathname = 'x y';
    u.hash = ''; u.username = 'me'; u.protocol = 'nope!';
    return u.href"""
    assert value(session, code) == "https://me@b.example:8443/x%20y?q"


def test_url_href_setter_throws_on_an_invalid_url_and_keeps_the_old_one(session):
    code = "const u = new URL('http://a/'); try { u.href = 'bad'; } catch (e) { return [String(e), u.href] }"
    assert value(session, code) == ["TypeError: Invalid URL: 'bad'", "http://a/"]


def test_url_serializes_as_its_href(session):
    code = "const u = new URL('http://a/b'); return [String(u), u.toJSON(), JSON.stringify({u}), `${u}`]"
    assert value(session, code) == ["http://a/b", "http://a/b", '{"u":"http://a/b"}', "http://a/b"]
    assert value(session, "return new URL('http://a/b')") == "http://a/b"


def test_search_params_are_live_linked_to_their_url(session):
    code = """const u = new URL('http://h/p?a=1#f'); const p = u.searchParams; const out = [];
    p.append('b', '2 é'); out.push(u.href);
    u.search = '?c=3'; out.push(p.get('c'), p.get('a'), p === u.searchParams);
    u.href = 'http://h/?d=4'; out.push([...p.keys()]);
    p.delete('d'); out.push(u.href, u.search);
    return out"""
    assert value(session, code) == ["http://h/p?a=1&b=2+%C3%A9#f", "3", None, True, ["d"], "http://h/", ""]


def test_clearing_search_params_of_an_opaque_path_strips_its_trailing_spaces(session):
    code = "const u = new URL('data:space    ?query'); u.searchParams.delete('query'); return u.href"
    assert value(session, code) == "data:space"


def test_url_getters_refuse_a_foreign_this(session):
    assert "'this' is not a URL" in error(
        session, "Object.getOwnPropertyDescriptor(URL.prototype, 'href').get.call({})"
    )


# ---- URLSearchParams -----------------------------------------------------------------------------


def test_search_params_parse_and_serialize_form_encoding(session):
    code = """const p = new URLSearchParams('?a=1&b=2&a=3+4&c=%zz&=e&&f');
    return [p.getAll('a'), p.get('c'), p.get(''), p.get('f'), p.get('nope'), p.size, p.toString()]"""
    assert value(session, code) == [["1", "3 4"], "%zz", "e", "", None, 6, "a=1&b=2&a=3+4&c=%25zz&=e&f="]


def test_search_params_take_a_record_a_sequence_or_another_params(session):
    code = """const p = new URLSearchParams([['x', 'y'], new Set(['k', 'v'])]);
    return [new URLSearchParams({a: '1', b: 2}).toString(), p.toString(), new URLSearchParams(new Map([['m',
      'n']])).toString(),
        new URLSearchParams(p).toString(), new URLSearchParams(null).toString(), new URLSearchParams().toString()]"""
    assert value(session, code) == ["a=1&b=2", "x=y&k=v", "m=n", "x=y&k=v", "null=", ""]


@pytest.mark.parametrize(
    ("init", "message"),
    [
        ("[['a']]", "exactly two items"),
        ("[['a', 'b', 'c']]", "exactly two items"),
        ("[5]", "iterable [name, value]"),
        ("{[Symbol.iterator]: 5}", "Symbol.iterator is not a function"),
        ("{[Symbol('s')]: 1}", "symbol to string"),
    ],
)
def test_search_params_refuse_malformed_initializers_with_a_type_error(session, init, message):
    result = error(session, f"new URLSearchParams({init})")
    assert result.startswith("TypeError:") and message in result, result


def test_search_params_mutators_and_lookups(session):
    code = """const p = new URLSearchParams('a=1&b=2&a=3');
    const out = [p.has('a'), p.has('a', '3'), p.has('a', '9')];
    p.set('a', 'x'); out.push(p.toString());
    p.append('c', '1'); p.append('c', '2'); p.delete('c', '1'); out.push(p.toString());
    p.delete('a'); out.push(p.toString(), p.size);
    return out"""
    assert value(session, code) == [True, True, False, "a=x&b=2", "a=x&b=2&c=2", "b=2&c=2", 2]


def test_search_params_sort_is_stable_by_code_units(session):
    code = (
        "const p = new URLSearchParams('z=1&a=2&\\uFFFD=3&a=1&\\uD83D\\uDE00=4&A=5'); p.sort(); return "
        "[...p.keys()].map((k) => k.codePointAt(0))"
    )
    assert value(session, code) == [65, 97, 97, 122, 0x1F600, 0xFFFD]


def test_search_params_iterate_live_in_every_form(session):
    code = """const p = new URLSearchParams('a=1&b=2'); const seen = [];
    p.forEach((v, k, self) => { seen.push(k + v); if (k === 'a') self.append('c', '3'); });
    const it = p.entries();
    return [seen, [...p], [...p.keys()], [...p.values()], it.next(), typeof it[Symbol.iterator],
      p.keys().map((k) => k.toUpperCase()).toArray()]"""
    assert value(session, code) == [
        ["a1", "b2", "c3"],
        [["a", "1"], ["b", "2"], ["c", "3"]],
        ["a", "b", "c"],
        ["1", "2", "3"],
        {"value": ["a", "1"], "done": False},
        "function",
        ["A", "B", "C"],
    ]


def test_search_params_methods_check_arity_and_this(session):
    assert error(session, "new URLSearchParams().append('a')") == (
        "TypeError: URLSearchParams.append: 2 arguments required, but only 1 present."
    )
    assert "'this' is not a URLSearchParams" in error(session, "URLSearchParams.prototype.get.call({}, 'a')")
    assert "not a function" in error(session, "new URLSearchParams('a=1').forEach(5)")


# ---- structuredClone -----------------------------------------------------------------------------


def test_structured_clone_keeps_cycles_and_shared_references(session):
    code = """const shared = {n: 1}; const a = {shared, again: shared, list: [shared]}; a.self = a;
    const c = structuredClone(a);
    return [c !== a, c.self === c, c.shared === c.again, c.list[0] === c.shared, c.shared !== shared]"""
    assert value(session, code) == [True] * 5


def test_structured_clone_copies_every_serializable_kind(session):
    code = """const buf = new ArrayBuffer(8); new Uint8Array(buf).set([1, 2, 3, 4, 5, 6, 7, 8]);
    const src = {d: new Date(5), re: /x+/gi, m: new Map([[1, {a: 2}]]), s: new Set(['k']), buf,
      u8: new Uint8Array(buf, 2, 3), f64: new Float64Array([1.5]), dv: new DataView(buf, 4, 2), big: 10n,
      boxed: [Object(1n), new Number(3), new String('s'), new Boolean(false)], neg: -0, nan: NaN, undef: undefined};
    src.re.lastIndex = 3;
    const c = structuredClone(src);
    return [c.d instanceof Date && c.d.getTime(), String(c.re), c.re.lastIndex, c.m.get(1).a, c.s.has('k'),
      c.u8.buffer === c.buf, [...c.u8], c.f64[0], c.dv.getUint8(0), c.dv.byteLength, typeof c.big,
      c.boxed.map((b) => typeof b + ':' + b.valueOf()), Object.is(c.neg, -0), Number.isNaN(c.nan), 'undef' in c,
      c.buf !== buf]"""
    assert value(session, code) == [
        5,
        "/x+/gi",
        0,
        2,
        True,
        True,
        [3, 4, 5],
        1.5,
        5,
        2,
        "bigint",
        ["object:1", "object:3", "object:s", "object:false"],
        True,
        True,
        True,
        True,
    ]


def test_structured_clone_of_errors_keeps_name_message_and_kind(session):
    code = """const errors = [new TypeError('t'), new RangeError('r'), Object.assign(new Error('e'), {name: 'Custom'}),
      new DOMException('d', 'AbortError'), new AggregateError([], 'g')];
    return errors.map((e) => structuredClone(e)).map((c) => [c.constructor.name, c.name, c.message,
      c instanceof Error])"""
    assert value(session, code) == [
        ["TypeError", "TypeError", "t", True],
        ["RangeError", "RangeError", "r", True],
        ["Error", "Error", "e", True],
        ["DOMException", "AbortError", "d", True],
        ["Error", "Error", "g", True],
    ]


def test_structured_clone_drops_prototypes_symbols_and_non_enumerables_and_runs_getters(session):
    code = """class Point { constructor() { this.x = 1; } get len() { return 9; } }
    const o = new Point(); Object.defineProperty(o, 'hidden', {value: 1}); o[Symbol('s')] = 2;
    let calls = 0; Object.defineProperty(o, 'g', {get() { calls++; return 'got'; }, enumerable: true});
    const arr = [1, , 3]; arr.extra = 'e';
    const c = structuredClone({o, arr});
    return [Object.getPrototypeOf(c.o) === Object.prototype, Object.keys(c.o), c.o.g, calls,
      Object.getOwnPropertyDescriptor(c.o, 'g').value, 1 in c.arr, c.arr.length, c.arr.extra]"""
    assert value(session, code) == [True, ["x", "g"], "got", 1, "got", False, 3, "e"]


@pytest.mark.parametrize(
    ("expression", "what"),
    [
        ("() => 1", "An anonymous function"),
        ("function named() {}", "The function named"),
        ("Symbol('q')", "Symbol(q)"),
        ("new WeakMap()", "#<WeakMap>"),
        ("new WeakSet()", "#<WeakSet>"),
        ("Promise.resolve()", "#<Promise>"),
        ("new Proxy({}, {})", "#<Proxy>"),
        ("new SharedArrayBuffer(1)", "#<SharedArrayBuffer>"),
        ("(function* () {})()", "#<Object>"),
        ("new URL('http://a')", "A URL object"),
        ("new TextEncoder()", "A TextEncoder object"),
        ("{deep: [1, {fn: Math.max}]}", "The function max"),
        ("Object(Symbol('boxed'))", "#<Symbol>"),
    ],
)
def test_structured_clone_refuses_what_is_not_data_with_a_data_clone_error(session, expression, what):
    code = (
        f"try {{ structuredClone({expression}); return 'cloned'; }} catch (e) {{ return [e.name, e.code, e "
        f"instanceof DOMException, e.message] }}"
    )
    assert value(session, code) == ["DataCloneError", 25, True, f"{what} could not be cloned."]


def test_structured_clone_refuses_a_transfer_list_and_a_detached_buffer(session):
    assert "transferring objects is not supported" in error(
        session, "const b = new ArrayBuffer(1); structuredClone(b, {transfer: [b]})"
    )
    assert value(session, "return structuredClone(1, {transfer: []})") == 1
    assert "A detached ArrayBuffer could not be cloned." in error(
        session, "const b = new ArrayBuffer(1); b.transfer(); structuredClone(b)"
    )


def test_structured_clone_keeps_resizable_and_immutable_buffers_so(session):
    code = """const r = structuredClone(new ArrayBuffer(2, {maxByteLength: 8}));
      const i = structuredClone(new ArrayBuffer(2).transferToImmutable());
    return [r.resizable, r.maxByteLength, i.immutable]"""
    assert value(session, code) == [True, 8, True]


def test_structured_clone_of_a_very_deep_value_is_a_catchable_range_error(session):
    code = (
        "let v = 0; for (let i = 0; i < 200000; i++) v = [v]; try { structuredClone(v); } catch (e) { return e.name }"
    )
    assert value(session, code) == "RangeError"


def test_structured_clone_needs_an_argument(session):
    assert error(session, "structuredClone()") == "TypeError: structuredClone: 1 argument required, but only 0 present."


# ---- DOMException --------------------------------------------------------------------------------


def test_dom_exception_has_name_message_code_and_is_an_error(session):
    code = """const e = new DOMException('m', 'NotFoundError'); const plain = new DOMException();
    return [e.name, e.message, e.code, String(e), e instanceof Error, plain.name, plain.message, plain.code,
      Object.keys(e)]"""
    assert value(session, code) == ["NotFoundError", "m", 8, "NotFoundError: m", True, "Error", "", 0, []]


def test_an_uncaught_dom_exception_fails_the_cell_with_its_name(session):
    assert (
        error(session, "atob('*')") == "InvalidCharacterError: atob: the string to be decoded is not correctly encoded."
    )


# ---- hostile guests ------------------------------------------------------------------------------

TAMPER = """
Object.defineProperty(Array.prototype, '0', {set() { throw new Error('array setter ran'); }, configurable: true});
Object.defineProperty(Array.prototype, '1', {set() { throw new Error('array setter ran'); }, configurable: true});
Array.prototype.push = Array.prototype.sort = () => { throw new Error('array method ran'); };
Map.prototype.set = Map.prototype.get = Map.prototype.forEach = () => { throw new Error('map method ran'); };
Set.prototype.add = () => { throw new Error('set method ran'); };
String.prototype.toWellFormed = String.prototype.slice = () => 'HACKED';
String.prototype.charCodeAt = () => 0;
RegExp.prototype.exec = () => null;
Reflect.apply = Reflect.ownKeys = Object.keys = () => { throw new Error('reflect ran'); };
Object.defineProperty(ArrayBuffer.prototype, 'byteLength', {get() { return 1e9; }});
const TA = Object.getPrototypeOf(Uint8Array).prototype;
for (const k of ['byteLength', 'byteOffset', 'length', 'buffer']) Object.defineProperty(TA, k, {get() { return 1e9; }});
Object.defineProperty(TA, Symbol.toStringTag, {get() { return 'Uint8Array'; }});
Object.getPrototypeOf([][Symbol.iterator]()).next = () => { throw new Error('iterator ran'); };
Object.defineProperty(Object.prototype, 'get', {value: () => 1, configurable: true});
Object.defineProperty(Object.prototype, 'set', {__proto__: null, value: () => 1, configurable: true});
const bytes = new Uint8Array(4);
globalThis.Map = globalThis.Set = globalThis.Uint8Array = null;
globalThis.Error = globalThis.TypeError = globalThis.Object = null;
"""


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("new TextEncoder().encode('hé')[2]", 0xA9),
        ("new TextEncoder().encodeInto('ab', bytes).written", 2),
        ("new TextDecoder(' utf-8 ').decode(new TextEncoder().encode('ok'))", "ok"),
        ("btoa('hi') + atob('aGk=')", "aGk=hi"),
        (
            "(() => { const u = new URL('http://a/?q=1'); u.searchParams.append('z', '2'); u.searchParams.sort();"
            " return u.href + u.searchParams.size; })()",
            "http://a/?q=1&z=22",
        ),
        ("new URLSearchParams({b: '1', a: '2'}).toString()", "b=1&a=2"),
        ("(() => { const m = structuredClone({a: {b: 2}, d: new Date(7)}); return m.a.b + m.d.getTime(); })()", 9),
        ("(() => { try { structuredClone(() => 1); } catch (e) { return e.name; } })()", "DataCloneError"),
        (
            "(() => { try { new TextEncoder().encodeInto('a', new Int8Array(4)); } catch (e) { return e.name; } })()",
            "TypeError",
        ),
    ],
)
def test_tampered_prototypes_and_globals_change_nothing_in_the_web_apis(session, code, expected):
    cell = (
        TAMPER
        + f"const result = {code};\n"
        + "delete Array.prototype[0]; delete Array.prototype[1]; delete globalThis.__proto__.get; return result;"
    )
    result = session.exec({"code": cell, "language": "javascript"})
    assert result["status"] == "completed", result
    assert result["value"] == expected


def test_a_throwing_to_string_reaches_the_guest_as_its_own_error(session):
    code = (
        "const evil = {toString() { throw new RangeError('from the guest'); }}; const out = [];"
        + "".join(
            f"try {{ {call}; out.push('no error'); }} catch (e) {{ out.push(e.message); }}"
            for call in [
                "btoa(evil)",
                "new URL(evil)",
                "new URLSearchParams().append(evil, 'v')",
                "new TextEncoder().encode(evil)",
            ]
        )
        + " return out"
    )
    assert value(session, code) == ["from the guest"] * 4


def test_a_symbol_argument_is_a_type_error(session):
    assert error(session, "new URL(Symbol('s'))").startswith("TypeError:")


def test_an_endless_iterable_initializer_ends_the_run_cleanly(make_codemode):
    cm: CodeMode = make_codemode({"workers": 1, "timeoutMs": 500, "memoryLimitBytes": 16 << 20})
    session = cm.session("endless")
    code = "new URLSearchParams({*[Symbol.iterator]() { for (;;) yield ['a', 'b'.repeat(100)]; }})"
    result = session.exec({"code": code, "language": "javascript"})
    assert result["status"] == "failed" and result["code"] in {"timeout", "memory_limit_exceeded"}, result
    assert session.exec({"code": "return btoa('ok')", "language": "javascript"})["value"] == "b2s="


@pytest.mark.parametrize(
    "code",
    [
        "btoa('a'.repeat(12 << 20))",
        "atob('QUFB'.repeat(4 << 20))",
        "new TextDecoder().decode(new Uint8Array(8 << 20).fill(0xff))",
        "new URL('http://a/' + 'é'.repeat(2 << 20))",
        "new URLSearchParams('a=' + 'é'.repeat(3 << 20)).toString()",
        "new TextEncoder().encode('\\u20ac'.repeat(6 << 20))",
    ],
    ids=["btoa", "atob", "lossy-decode", "url", "form-serialize", "encode"],
)
def test_a_huge_input_ends_with_memory_limit_exceeded_not_a_crash(make_codemode, code):
    cm: CodeMode = make_codemode({"workers": 1, "timeoutMs": 10000, "memoryLimitBytes": 16 << 20})
    session = cm.session("huge")
    result = session.exec(
        {"code": f"try {{ {code}; }} catch (e) {{ return 'caught ' + e; }} return 'fit'", "language": "javascript"}
    )
    assert result["status"] == "failed" and result["code"] == "memory_limit_exceeded", result
    assert session.exec({"code": "return atob('b2s=')", "language": "javascript"})["value"] == "ok"


def test_large_inputs_within_the_limit_work(session):
    code = """const s = 'x'.repeat(1 << 20); const b = btoa(s);
    const bytes = new TextEncoder().encode(s);
    return [atob(b).length, new TextDecoder().decode(bytes).length, new URL('http://a/?' + s).search.length,
      structuredClone(Array.from({length: 10000}, (_, i) => ({i}))).length]"""
    assert value(session, code) == [1 << 20, 1 << 20, (1 << 20) + 1, 10000]
