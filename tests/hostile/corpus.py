"""The hostile-input corpus: model-written cells that try to escape, exhaust, abuse or bend the rules.

Every entry states the exact outcome the current package gives (``status`` + ``code``, and where
meaningful the value or the error text). ``test_corpus.py`` runs each one and then checks that
the next exec in the same ``CodeMode`` still completes.
"""

from __future__ import annotations

from typing import Any

import msgspec

MiB = 1 << 20
UNSET: Any = msgspec.UNSET

# Config every cell runs under unless an entry overrides keys of it.
BASE_CONFIG: dict[str, Any] = {
    "workers": 2,
    "timeoutMs": 1000,
    "memoryLimitBytes": 16 * MiB,
    "maxOutputBytes": 4096,
}
FAST_TIMEOUT: dict[str, Any] = {"timeoutMs": 300}


class Cell(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    tags: tuple[str, ...]
    code: str
    expect_status: str
    expect_code: str | None  # None: a guest error (the cell threw), no ``code`` key
    expect_error_contains: str | None = None
    expect_value: Any = UNSET
    config: dict[str, Any] | None = None  # overrides of BASE_CONFIG
    tools: tuple[str, ...] = ()  # host tools (from test_corpus.TOOLS) the cell relies on
    isolated: bool = False  # kills a worker on purpose (supervisor SIGKILL): gets its own CodeMode


TAGS = ("escape", "exhaustion", "protocol", "spec")
CORPUS: list[Cell] = []


def ok(name: str, tags: str, code: str, value: Any = UNSET, **kw: Any) -> None:
    CORPUS.append(
        Cell(
            name=name,
            tags=tuple(tags.split()),
            code=code,
            expect_status="completed",
            expect_code=None,
            expect_value=value,
            **kw,
        )
    )


def fail(name: str, tags: str, code: str, expect_code: str | None, contains: str | None = None, **kw: Any) -> None:
    CORPUS.append(
        Cell(
            name=name,
            tags=tuple(tags.split()),
            code=code,
            expect_status="failed",
            expect_code=expect_code,
            expect_error_contains=contains,
            **kw,
        )
    )


ECHO = "host:core:echo"

# ================================ escape =========================================================
# -- prototype pollution of what the bridge touches -----------------------------------------------
ok("proto_object_tojson_on_return", "escape", "Object.prototype.toJSON = () => 'pwned'; return {a: 1}", "pwned")
ok(
    "proto_object_tojson_on_tool_input",
    "escape",
    "Object.prototype.toJSON = () => 'pwned'; return await tools.echo({value: 1})",
    "pwned",
    tools=("echo",),
)
ok(
    "proto_array_tojson_on_return",
    "escape",
    "Array.prototype.toJSON = function () { return 'arr' }; return [1, 2]",
    "arr",
)
ok(
    "proto_array_push_replaced",
    "escape",
    "Array.prototype.push = () => { throw new Error('no') }; return [1, {a: [2]}, 3n]",
    [1, {"a": [2]}, "3"],
)
ok(
    "proto_array_map_replaced_then_tool",
    "escape",
    "Array.prototype.map = null; Array.prototype.join = null; return await tools.echo({value: [1, 2]})",
    [1, 2],
    tools=("echo",),
)
ok("json_stringify_replaced", "escape", "JSON.stringify = () => '{\"hijacked\":true}'; return {a: 1}", {"a": 1})
ok(
    "json_parse_replaced_tool_result",
    "escape",
    "JSON.parse = () => ({hijacked: true}); return await tools.echo({value: {a: 1}})",
    {"a": 1},
    tools=("echo",),
)
ok(
    "json_stringify_replaced_tool_input",
    "escape",
    "JSON.stringify = () => '{\"value\":\"evil\"}'; return await tools.echo({value: 'good'})",
    "good",
    tools=("echo",),
)
ok(
    "promise_then_replaced_before_tool",
    "escape",
    "const t = Promise.prototype.then; Promise.prototype.then = function (a, b) { return t.call(this, a, b) };"
    " return await tools.echo({value: 7})",
    7,
    tools=("echo",),
)
ok(
    "promise_then_throws",
    "escape",
    "Promise.prototype.then = function () { throw new Error('then hijacked') }; return await tools.echo({value: 7})",
    7,
    tools=("echo",),
)
ok(
    "promise_resolve_replaced",
    "escape",
    "Promise.resolve = () => 'x'; Promise.reject = () => 'y'; return await tools.echo({value: 3})",
    3,
    tools=("echo",),
)
ok(
    "promise_ctor_replaced",
    "escape",
    "globalThis.Promise = function () { throw new Error('no') }; return await tools.echo({value: 4})",
    4,
    tools=("echo",),
)
ok(
    "symbol_toprimitive_on_return",
    "escape",
    "return {[Symbol.toPrimitive]() { throw new Error('prim') }, a: 1}",
    {"a": 1},
)
ok(
    "symbol_toprimitive_as_tool_id",
    "escape",
    "const id = {[Symbol.toPrimitive]() { return 'host:core:echo' }}; try { await tools.callValue(id, {}) }"
    " catch (e) { return String(e) }",
    "Error: tools.callValue(id, input): id must be a string",
    tools=("echo",),
)
fail(
    "tojson_getter_throws_on_return",
    "escape",
    "try { return {get toJSON() { throw new Error('boom') }} } catch (e) { return 'c' }",
    None,
    "Error: boom",
)
fail("tojson_throws_on_return", "escape", "return {toJSON() { throw new Error('tojson boom') }}", None, "tojson boom")
fail(
    "tojson_throws_on_tool_input",
    "escape",
    "return await tools.echo({value: {toJSON() { throw new Error('input boom') }}})",
    None,
    "input boom",
    tools=("echo",),
)
ok("tojson_returns_function", "escape", "return {toJSON() { return () => 1 }}", "[Function: anonymous]")
ok("tojson_returns_self_cycle", "escape", "const o = {toJSON() { return o }}; return o", {})
ok("tojson_infinite_chain", "escape", "const mk = () => ({toJSON: mk}); return mk()", {})
ok(
    "tojson_reenters_tool",
    "escape",
    "let inner; const v = {toJSON() { inner = tools.callValue('host:core:echo', {value: 'inner'}); return 'outer' }};"
    " const r = await tools.echo({value: v}); return [r, await inner]",
    ["outer", "inner"],
    tools=("echo",),
)
ok(
    "tojson_reenters_tool_on_return",
    "escape",
    "return {toJSON() { tools.callValue('host:core:echo', {value: 1}); return 'done' }}",
    "done",
    tools=("echo",),
)
ok("tojson_calls_exit", "escape", "return {toJSON() { exit(); return 1 }}", None)
fail("getter_throws_on_return", "escape", "return {get a() { throw new Error('getter boom') }}", None, "getter boom")
fail(
    "getter_loops_on_return",
    "escape",
    "return {get a() { for (;;) {} }}",
    "timeout",
    "timeout exceeded",
    config=FAST_TIMEOUT,
)
fail(
    "getter_loops_on_tool_input",
    "escape",
    "return await tools.echo({value: {get a() { for (;;) {} }}})",
    "timeout",
    "timeout exceeded",
    config=FAST_TIMEOUT,
    tools=("echo",),
)
ok("getter_counts_reads_on_return", "escape", "let n = 0; return {get a() { return ++n }}", {"a": 1})
fail(
    "proxy_return_get_trap_throws",
    "escape",
    "return new Proxy({a: 1}, {get() { throw new Error('trap') }})",
    None,
    "trap",
)
ok(
    "proxy_return_ownkeys_lies",
    "escape",
    "return new Proxy({}, {ownKeys: () => ['x', 'y'], getOwnPropertyDescriptor: () => ({value: 1, enumerable: true,"
    " configurable: true}), get: (_, k) => k})",
    {"x": "x", "y": "y"},
)
fail(
    "proxy_input_trap_loops",
    "escape",
    "return await tools.echo({value: new Proxy({}, {ownKeys() { for (;;) {} }})})",
    "timeout",
    config=FAST_TIMEOUT,
    tools=("echo",),
)
ok(
    "proxy_input_array",
    "escape",
    "return await tools.echo({value: new Proxy([1, 2, 3], {get: (t, k) => k === 'length' ? 2 : t[k]})})",
    [1, 2],
    tools=("echo",),
)
fail(
    "proxy_revoked_return",
    "escape",
    "const {proxy, revoke} = Proxy.revocable({}, {}); revoke(); try { return proxy } catch (e) { return 'x' }",
    None,
    "revoked proxy",
)
ok(
    "proxy_tools_target_introspection",
    "escape",
    "const k = Object.keys(tools); return [k.includes('callValue'), k.includes('echo'), k.some(n => /host|__|exec|wait/"
    ".test(n)), typeof tools.hostCall, typeof tools.__cm]",
    [True, True, False, "undefined", "undefined"],
    tools=("echo",),
)
ok(
    "constructor_constructor_return_this",
    "escape",
    "const g = ({}).constructor.constructor('return this')(); return [g === globalThis, typeof g.hostCall,"
    " typeof g.host, typeof g.__cm]",
    [True, "undefined", "undefined", "undefined"],
)
ok(
    "function_return_globalthis",
    "escape",
    "const g = Function('return globalThis')(); return g === globalThis && typeof g.process",
    "undefined",
)
ok(
    "tools_proto",
    "escape",
    "return [Object.getPrototypeOf(tools), tools.__proto__ === undefined, typeof tools.constructor]",
    [None, True, "undefined"],
)
ok(
    "tools_callvalue_constructor",
    "escape",
    "const F = tools.callValue.constructor; return typeof F('return typeof host')()",
    "string",
)
ok(
    "global_names_nothing_hostish",
    "escape",
    "return Object.getOwnPropertyNames(globalThis).filter(n => /host|__cm|hook|native|bridge|install|emit|runCell/i"
    ".test(n))",
    [],
)
ok(
    "global_symbols_only_tostringtag",
    "escape",
    "return Object.getOwnPropertySymbols(globalThis).map(String)",
    ["Symbol(Symbol.toStringTag)"],
)
# A cell runs as sloppy-mode code, as a JavaScript engine runs a script: `caller` gives nothing
# (QuickJS never hands out a caller) and `arguments.callee` is the function itself. In strict
# mode both are refused.
ok(
    "function_caller_arguments",
    "escape",
    "function f() { try { return [typeof f.caller, arguments.callee === f] } catch (e) { return String(e) } }"
    " return f()",
    ["undefined", True],
)
ok(
    "function_caller_arguments_strict",
    "escape",
    "'use strict'; function f() { try { return [typeof f.caller, typeof arguments.callee] } catch (e) {"
    " return String(e) } } return f()",
    "TypeError: invalid property access",
)
ok(
    "strict_caller_of_callvalue",
    "escape",
    "try { return String(tools.callValue.caller) } catch (e) { return e.name }",
    "TypeError",
)
ok(
    "error_stack_no_host_paths",
    "escape",
    "try { null.x } catch (e) { return /\\/(home|usr|work|tmp)\\//.test(String(e.stack)) }",
    False,
)
fail(
    "prepare_stack_trace_hook",
    "escape",
    "'use strict'; Error.prepareStackTrace = (e, s) => s.map(f => f.getThis && f.getThis()); try { null.x }"
    " catch (e) { return typeof e.stack }",
    None,
    "'prepareStackTrace' is read-only",
)
# Sloppy mode: the assignment is ignored (not refused), and the hook is not there.
ok(
    "prepare_stack_trace_hook_sloppy",
    "escape",
    "Error.prepareStackTrace = (e, s) => s.map(f => f.getThis && f.getThis()); try { null.x } catch (e) {"
    " return [Error.prepareStackTrace, typeof e.stack] }",
    [None, "string"],
)
# CallSite.getFunction() hands out every function on the stack, including the prelude's own closures
# (toJson, display, runCell, storeKey, ...). None of them is a host hook; this cell checks that no
# native (Rust) function other than the intrinsics is ever reachable that way, from every bridge path.
fail(
    "prepare_stack_trace_getfunction_no_host_hook",
    "escape",
    "'use strict'; const fns = new Set(); Error.prepareStackTrace = (e, s) => { for (const f of s) {"
    " const fn = f.getFunction && f.getFunction(); if (fn) fns.add(fn) } return 'x' };"
    " const grab = () => { new Error().stack };"
    " const evil = {toJSON() { grab(); return 1 }, toString() { grab(); return 'k' }, valueOf() { grab(); return 1 }};"
    " try { await tools.echo({value: evil}) } catch (e) {}"
    " try { text(evil); json(evil); console.log(evil) } catch (e) {}"
    " try { store('k', evil) } catch (e) {} try { store(evil, 1) } catch (e) {} try { load(evil) } catch (e) {}"
    " try { await tools.search(evil, {get limit() { grab(); return 1 }}) } catch (e) {}"
    " try { await tools.describe(evil) } catch (e) {} try { image(evil) } catch (e) {}"
    " try { yield_control(evil).catch(() => {}) } catch (e) {}"
    " const native = [...fns].filter(f => /\\[native code\\]/.test(Function.prototype.toString.call(f)))"
    ".map(f => f.name).sort(); return [fns.size > 10, native]",
    None,
    "'prepareStackTrace' is read-only",
    tools=("echo",),
)
ok(
    "tool_function_tostring",
    "escape",
    "return !/\\bhost\\.call\\b|hostCall/.test(String(tools.echo))",
    True,
    tools=("echo",),
)
fail("eval_dynamic_import", "escape spec", "const m = await eval('import(\"fs\")'); return Object.keys(m)", None)
ok(
    "eval_dynamic_import_caught",
    "escape spec",
    "try { await eval('import(\"fs\")') } catch (e) { return 'blocked' } return 'loaded'",
    "blocked",
)
fail("new_function_return_require", "escape", "return new Function('return require')()('fs')", None, "require")
ok(
    "new_function_typeof_require",
    "escape",
    "return new Function('return [typeof require, typeof process, typeof module]')()",
    ["undefined", "undefined", "undefined"],
)
ok(
    "assign_tools_global",
    "escape",
    "try { tools = 1 } catch (e) {} try { globalThis.tools = null } catch (e) {} return typeof tools",
    "object",
)
ok(
    "assign_tools_property",
    "escape",
    "try { tools.callValue = () => 'hijacked' } catch (e) {} return await tools.callValue('host:core:echo',"
    " {value: 'real'})",
    "real",
    tools=("echo",),
)
ok(
    "define_tools_property",
    "escape",
    "try { Object.defineProperty(tools, 'echo', {value: () => 'fake'}) } catch (e) {} return await tools.echo("
    "{value: 'real'})",
    "real",
    tools=("echo",),
)
ok("delete_tools", "escape", "try { delete globalThis.tools } catch (e) {} return typeof tools", "object")
ok(
    "assign_all_tools",
    "escape",
    "try { ALL_TOOLS = [] } catch (e) {} try { ALL_TOOLS.push({id: 'x'}) } catch (e) {} return ALL_TOOLS.length",
    14,
)
ok("assign_console", "escape", "console = {log() { throw new Error('x') }}; return typeof console.log", "function")
ok("mutate_console_log", "escape", "try { console.log = null } catch (e) {} return typeof console.log", "function")
ok(
    "assign_text_json",
    "escape",
    "try { text = null } catch (e) {} try { json = null } catch (e) {} text('t'); return typeof text",
    "function",
)
ok(
    "assign_yield_control",
    "escape",
    "try { yield_control = null } catch (e) {} return typeof yield_control",
    "function",
)
ok("replace_math_random", "escape", "Math.random = () => 4; return Math.random()", 4)
ok("replace_date", "escape", "Date = null; return Date", None)
ok(
    "replace_set_and_reflect",
    "escape",
    "Set.prototype.has = () => true; Set.prototype.add = null; Reflect.apply = null; const a = {}; a.self = a;"
    " return a",
    {"self": "[Circular]"},
)
ok(
    "freeze_object_prototype",
    "escape",
    "Object.freeze(Object.prototype); Object.freeze(Array.prototype); return await tools.echo({value: [1]})",
    [1],
    tools=("echo",),
)
ok(
    "object_prototype_setter_for_result_keys",
    "escape",
    "Object.defineProperty(Object.prototype, 'value', {set() { throw new Error('setter') }, configurable: true});"
    " return await tools.echo({value: {value: 2}})",
    {"value": 2},
    tools=("echo",),
)
ok(
    "object_prototype_getter_then",
    "escape",
    "Object.defineProperty(Object.prototype, 'then', {get() { return r => r('thenable') }, configurable: true});"
    " return 1",
    1,
)
ok("thenable_return_value", "escape", "return {then(r) { r('from then') }}", "from then")
fail("thenable_never_resolves", "escape", "return {then() {}}", "timeout", "can never finish")
ok(
    "error_subclass_return",
    "escape",
    "class E extends Error { get message() { throw new Error('m') } } try { return new E() } catch (e) { return 'c' }",
    {"name": "Error", "message": "[unreadable]"},
)
ok("symbol_return", "escape", "return Symbol('s')", "Symbol(s)")
ok("function_return", "escape", "return function secret() {}", "[Function: secret]")
ok("bigint_nested_return", "escape", "return {a: [1n, 2n ** 70n]}", {"a": ["1", "1180591620717411303424"]})
ok(
    "tool_result_is_fresh_object",
    "escape",
    "Object.prototype.polluted = 'yes'; const r = await tools.echo({value: {}}); return Object.keys(r)",
    [],
    tools=("echo",),
)
ok(
    "search_result_frozen",
    "escape",
    "const r = await tools.search('echo'); try { r[0].id = 'x' } catch (e) {} return Object.isFrozen(r)",
    True,
    tools=("echo",),
)
ok(
    "codemode_global_frozen",
    "escape",
    "try { codemode.tools.call = null } catch (e) {} return typeof codemode.tools.call",
    "function",
)

# ================================ exhaustion =====================================================
KILL: dict[str, Any] = {"config": FAST_TIMEOUT, "isolated": True}
for fn, call in {
    "reverse": "Array.prototype.reverse.call({length: 2 ** 32 - 1})",
    "sort": "Array.prototype.sort.call({length: 2 ** 32 - 1})",
    "join": "Array.prototype.join.call({length: 2 ** 32 - 1}, '')",
    "splice": "Array.prototype.splice.call({length: 2 ** 53 - 1}, 0, 0, 1)",
    "indexof": "Array.prototype.indexOf.call({length: 2 ** 53 - 1}, 1)",
    "lastindexof": "Array.prototype.lastIndexOf.call({length: 2 ** 53 - 1}, 1)",
    "copywithin": "Array.prototype.copyWithin.call({length: 2 ** 53 - 1}, 1, 0)",
    "includes": "Array.prototype.includes.call({length: 2 ** 53 - 1}, 1)",
    "fill": "Array.prototype.fill.call({length: 2 ** 53 - 1}, 1)",
    "unshift": "Array.prototype.unshift.call({length: 2 ** 53 - 2}, 1)",
}.items():
    if fn == "splice":
        fail(f"builtin_{fn}_huge_array_like", "exhaustion", call, None, "Array loo long", **KILL)
    elif fn == "fill":
        fail(f"builtin_{fn}_huge_array_like", "exhaustion", call, "memory_limit_exceeded", **KILL)
    else:
        fail(f"builtin_{fn}_huge_array_like", "exhaustion", call, "timeout", "timeout exceeded", **KILL)
fail(
    "regex_catastrophic_backtracking",
    "exhaustion",
    "return /(a+)+$/.test('a'.repeat(30) + 'b')",
    "timeout",
    "timeout exceeded",
    **KILL,
)
fail(
    "regex_nested_quantifier_replace",
    "exhaustion",
    "return ('x'.repeat(28) + '!').replace(/^(x|x)*$/, 'y')",
    "timeout",
    "timeout exceeded",
    **KILL,
)
fail(
    "regex_caught_still_times_out",
    "exhaustion",
    "try { /(a|aa)+$/.exec('a'.repeat(40) + 'b') } catch (e) { return 'caught' }",
    "timeout",
    **KILL,
)
fail("loop_plain", "exhaustion", "for (;;) {}", "timeout", "timeout exceeded", config=FAST_TIMEOUT)
fail(
    "loop_in_catch_retry", "exhaustion", "for (;;) { try { for (;;) {} } catch (e) {} }", "timeout", config=FAST_TIMEOUT
)
fail(
    "loop_in_microtasks",
    "exhaustion",
    "const spin = () => Promise.resolve().then(spin); spin(); await new Promise(() => {})",
    "memory_limit_exceeded",
    config=FAST_TIMEOUT,
)
fail(
    "loop_queue_microtask_chain",
    "exhaustion",
    "const f = () => queueMicrotask(f); f(); await new Promise(() => {})",
    "timeout",
    config=FAST_TIMEOUT,
)
fail("loop_in_finally", "exhaustion", "try { return 1 } finally { for (;;) {} }", "timeout", config=FAST_TIMEOUT)
fail(
    "loop_in_generator",
    "exhaustion",
    "function* g() { for (;;) yield 1 } for (const x of g()) {}",
    "timeout",
    config=FAST_TIMEOUT,
)
fail(
    "loop_via_tool_ping_pong",
    "exhaustion",
    "for (;;) await tools.echo({value: 1})",
    "timeout",
    config=FAST_TIMEOUT,
    tools=("echo",),
    isolated=True,
)
MEM: dict[str, Any] = {"config": {"memoryLimitBytes": 16 * MiB}}
fail(
    "mem_array_push",
    "exhaustion",
    "const a = []; for (;;) a.push([a.length])",
    "memory_limit_exceeded",
    "memory limit",
    **MEM,
)
fail("mem_string_repeat", "exhaustion", "return 'x'.repeat(2 ** 28).length", "memory_limit_exceeded", **MEM)
fail("mem_string_doubling", "exhaustion", "let s = 'ab'; for (;;) s += s", None, "string too long", **MEM)
fail(
    "mem_string_concat_kept",
    "exhaustion",
    "const k = []; for (let i = 0; ; i++) k.push('x'.repeat(1000) + i)",
    "memory_limit_exceeded",
    **MEM,
)
fail(
    "mem_typed_array_big",
    "exhaustion",
    "return new Uint8Array(64 * 1024 * 1024).length",
    "memory_limit_exceeded",
    **MEM,
)
fail(
    "mem_typed_array_many",
    "exhaustion",
    "const k = []; for (;;) k.push(new Float64Array(65536))",
    "memory_limit_exceeded",
    **MEM,
)
fail(
    "mem_arraybuffer_resizable",
    "exhaustion",
    "const b = new ArrayBuffer(1, {maxByteLength: 2 ** 30}); b.resize(2 ** 30); return b.byteLength",
    "memory_limit_exceeded",
    **MEM,
)
fail(
    "mem_map_growth",
    "exhaustion",
    "const m = new Map(); for (let i = 0; ; i++) m.set(i, {i})",
    "memory_limit_exceeded",
    **MEM,
)
fail(
    "mem_set_growth",
    "exhaustion",
    "const s = new Set(); for (let i = 0; ; i++) s.add('k' + i)",
    "memory_limit_exceeded",
    **MEM,
)
fail(
    "mem_object_graph",
    "exhaustion",
    "let h = null; for (;;) h = {next: h, pad: [h, h]}",
    "memory_limit_exceeded",
    **MEM,
)
fail(
    "mem_wide_object",
    "exhaustion",
    "const o = {}; for (let i = 0; ; i++) o['k' + i] = i",
    "memory_limit_exceeded",
    **MEM,
)
fail("mem_array_length_fill", "exhaustion", "return new Array(2 ** 26).fill(0).length", "memory_limit_exceeded", **MEM)
fail(
    "mem_caught_still_fails",
    "exhaustion",
    "try { const a = []; for (;;) a.push({}) } catch (e) { return 'survived' }",
    "memory_limit_exceeded",
    **MEM,
)
fail(
    "mem_closures",
    "exhaustion",
    "const fs = []; for (let i = 0; ; i++) fs.push(() => i)",
    "memory_limit_exceeded",
    **MEM,
)
fail(
    "mem_promises_kept",
    "exhaustion",
    "const ps = []; for (;;) ps.push(new Promise(() => {}))",
    "memory_limit_exceeded",
    **MEM,
)
STACK = "RangeError: Maximum call stack size exceeded"
fail("mem_json_parse_deep_array", "exhaustion", "return JSON.parse('['.repeat(1e6))", None, STACK, **MEM)
fail("mem_json_parse_deep_object", "exhaustion", "return JSON.parse('{\"a\":'.repeat(2e5))", None, STACK, **MEM)
fail(
    "mem_json_parse_deep_valid",
    "exhaustion",
    "return JSON.parse('['.repeat(1e5) + ']'.repeat(1e5))",
    None,
    STACK,
    **MEM,
)
fail("mem_string_array_join", "exhaustion", "return new Array(1e7).join('xx').length", "memory_limit_exceeded", **MEM)
fail("mem_padstart", "exhaustion", "return ''.padStart(2 ** 29, 'x').length", "memory_limit_exceeded", **MEM)
fail("recursion_plain", "exhaustion", "function f() { return f() + 1 } return f()", None, "RangeError")
ok(
    "recursion_caught",
    "exhaustion",
    "function f() { return f() + 1 } try { f() } catch (e) { return e.name }",
    "RangeError",
)
fail("recursion_via_getter", "exhaustion", "const o = {get a() { return o.a }}; return o.a", None, "RangeError")
fail(
    "recursion_via_tostring",
    "exhaustion",
    "const o = {toString() { return '' + o }}; return '' + o",
    None,
    "RangeError",
)
fail(
    "recursion_via_proxy",
    "exhaustion",
    "const p = new Proxy({}, {get: (t, k) => p[k]}); return p.x",
    None,
    "RangeError",
)
fail("recursion_async", "exhaustion", "async function f() { return await f() } return await f()", None, "RangeError")
# Deeper than JSON.stringify can go on the C stack: refused as too deep, never cut and let out.
fail(
    "recursion_deep_return_value",
    "exhaustion",
    "let v = 1; for (let i = 0; i < 1e5; i++) v = [v]; return v",
    "invalid_input",
    "nested deeper than",
)
fail(
    "recursion_in_tojson_walker",
    "exhaustion",
    "let v = 1; for (let i = 0; i < 1e5; i++) v = {a: v, b: 1n}; return v",
    "invalid_input",
    "nested deeper than",
)  # BigInt would send it to the slow walker, but the depth is found first
ok(
    "recursion_deep_tool_input",
    "exhaustion",
    "let v = 1; for (let i = 0; i < 1e4; i++) v = [v]; try { await tools.echo({value: v}); return 'sent' }"
    " catch (e) { return e.name }",
    "RangeError",
    tools=("echo",),
)
fail("output_flood_text", "exhaustion", "for (;;) text('x'.repeat(100))", "output_limit_exceeded")
fail(
    "output_flood_console_caught",
    "exhaustion",
    "try { for (;;) console.log('y'.repeat(100)) } catch (e) { return 'survived' }",
    "output_limit_exceeded",
)
fail("output_single_huge_text", "exhaustion", "text('x'.repeat(5e6))", "output_limit_exceeded")
fail("output_huge_final_value", "exhaustion", "return 'z'.repeat(10000)", "output_limit_exceeded")
fail("output_json_flood", "exhaustion", "for (;;) json({a: 'b'.repeat(200)})", "output_limit_exceeded")
fail(
    "pending_10000_unresolved",
    "exhaustion",
    "const ps = []; for (let i = 0; i < 10000; i++) ps.push(tools.callValue('host:core:echo', {}));"
    " const settled = await Promise.allSettled(ps.slice(16)); throw settled[0].reason",
    None,
    "too many pending tool calls",
    config={"maxPendingToolCalls": 16},
    tools=("echo",),
)
ok(
    "pending_overflow_caught",
    "exhaustion",
    "const ps = Array.from({length: 20}, () => tools.callValue('host:core:echo', {}));"
    " const late = await Promise.allSettled(ps.slice(16)); return [late.length, late[0].reason.message]",
    [4, "too many pending tool calls: at most 16 may be in flight."],
    config={"maxPendingToolCalls": 16},
    tools=("echo",),
)
# Calls past maxPendingToolCalls reject (they used to throw at the call site, which
# Promise.allSettled(ids.map(callValue)) could not collect).
ok(
    "pending_10000_rejections_caught",
    "exhaustion",
    "const ps = []; for (let i = 0; i < 10000; i++) ps.push(tools.callValue('host:core:echo', {value: i}));"
    " const r = await Promise.allSettled(ps); const bad = r.filter(x => x.status === 'rejected');"
    " return [r.length - bad.length, bad.length, String(bad[0].reason).includes('too many pending tool calls')]",
    [16, 9984, True],
    config={"maxPendingToolCalls": 16},
    tools=("echo",),
)
fail(
    "tool_input_20mb",
    "exhaustion",
    "return await tools.echo({value: 'x'.repeat(20 * 1024 * 1024)})",
    None,
    "Error: tool input is larger than the bridge limit",
    config={"memoryLimitBytes": 128 * MiB},
    tools=("echo",),
)
ok(
    "tool_input_20mb_caught",
    "exhaustion",
    "try { await tools.echo({value: 'x'.repeat(20 * 1024 * 1024)}) } catch (e) { return e.name }",
    "Error",
    config={"memoryLimitBytes": 128 * MiB},
    tools=("echo",),
)

# ================================ protocol =======================================================
ok("tool_returns_nan", "protocol", "return await tools.nan()", None, tools=("nan",))
ok("tool_returns_infinity_list", "protocol", "return await tools.inf()", [None, None], tools=("inf",))
ok("guest_returns_nan_infinity", "protocol", "return [NaN, Infinity, -Infinity, -0]", [None, None, None, 0])
ok(
    "guest_sends_nan_to_tool",
    "protocol",
    "return await tools.echo({value: [NaN, -Infinity]})",
    [None, None],
    tools=("echo",),
)
fail(
    "tool_returns_lone_surrogate",
    "protocol",
    "const s = await tools.surrogate(); return [s.length, s.charCodeAt(0).toString(16)]",
    None,
    "returned a value that is not JSON",
    tools=("surrogate",),
)
# Lone surrogates in guest JSON become U+FFFD in the host (msgspec refuses them; the result must not).
ok("guest_returns_lone_surrogate", "protocol", "return '\\ud800x'", "\ufffdx")
ok("guest_returns_lone_surrogate_nested", "protocol", "return {s: ['\\udc00'], n: 1}", {"s": ["\ufffd"], "n": 1})
ok("guest_json_output_lone_surrogate", "protocol", "json({a: '\\udfff'}); return 1", 1)
ok("guest_store_lone_surrogate", "protocol spec", "store('k', '\\ud800'); return 1", 1)
fail(
    "guest_sends_lone_surrogate_to_tool",
    "protocol",
    "return await tools.echo({value: '\\udfff'})",
    None,
    "input is not valid JSON",
    tools=("echo",),
)
fail(
    "guest_text_lone_surrogate",
    "protocol",
    "text('a\\ud800b'); return 1",
    None,
    "TypeError: Conversion from string failed",
)
ok("guest_text_lone_surrogate_caught", "protocol", "try { text('\\ud800') } catch (e) { return e.name }", "TypeError")
ok(
    "guest_surrogate_pair_roundtrip",
    "protocol",
    "return await tools.echo({value: '\\ud83d\\ude00'})",
    "\U0001f600",
    tools=("echo",),
)
ok("guest_key_lone_surrogate", "protocol", "return {['\\udc00']: 1}", {"\ufffd": 1})
ok(
    "tool_returns_invalid_utf8_bytes", "protocol", "return await tools.raw_bytes()", "//4A", tools=("raw_bytes",)
)  # msgspec sends bytes as base64 text
ok(
    "tool_returns_bytes_caught",
    "protocol",
    "try { await tools.raw_bytes(); return 'accepted' } catch (e) { return e.name }",
    "accepted",
    tools=("raw_bytes",),
)
fail(
    "tool_returns_python_object",
    "protocol",
    "return await tools.py_object()",
    None,
    "returned a value that is not JSON",
    tools=("py_object",),
)
ok("tool_returns_set", "protocol", "return await tools.py_set()", [1, 2], tools=("py_set",))
ok(
    "tool_returns_deep_nesting",
    "protocol",
    "try { const r = await tools.deep({n: 5000}); let d = 0, x = r; while (Array.isArray(x)) { x = x[0]; d++ }"
    " return d } catch (e) { return e.name }",
    "Error",
    tools=("deep",),
)
ok(
    "tool_returns_deep_nesting_100",
    "protocol",
    "const r = await tools.deep({n: 100}); let d = 0, x = r; while (Array.isArray(x)) { x = x[0]; d++ } return d",
    100,
    tools=("deep",),
)
ok(
    "tool_returns_oversized_caught",
    "protocol",
    "try { await tools.big({n: 17 * 1024 * 1024}); return 'accepted' } catch (e) { return String(e) }",
    "Error: tool result is larger than the bridge limit (16777216 bytes)",
    config={"memoryLimitBytes": 128 * MiB},
    tools=("big",),
)
fail(
    "tool_returns_oversized",
    "protocol",
    "return (await tools.big({n: 17 * 1024 * 1024})).length",
    None,
    "bridge limit",
    config={"memoryLimitBytes": 128 * MiB},
    tools=("big",),
)
ok(
    "tool_result_near_guest_memory",
    "protocol",
    "return (await tools.big({n: 15 * 1024 * 1024})).length",
    15728640,
    tools=("big",),
)
ok("tool_result_fits", "protocol", "return (await tools.big({n: 100000})).length", 100000, tools=("big",))
ok(
    "tool_raises_message_only",
    "protocol",
    "try { await tools.raises() } catch (e) { return [e.name, e.message, typeof e.stack] }",
    ["Error", "tool host:core:raises failed: RuntimeError: tool failed", "string"],
    tools=("raises",),
)
ok(
    "tool_raises_no_traceback",
    "protocol",
    "try { await tools.raises() } catch (e) { return /Traceback|\\.py/.test(String(e) + e.stack) }",
    False,
    tools=("raises",),
)
ok(
    "unknown_tool_id",
    "protocol",
    "try { await tools.callValue('host:core:nope', {}) } catch (e) { return String(e).split('. ')[0] }",
    "Error: unknown tool: host:core:nope",
)
ok(
    "tool_id_internal_yield",
    "protocol",
    "try { await tools.callValue('\\u0000yield', {}) } catch (e) { return String(e) }",
    "Error: unknown tool: \x00yield",
)
ok(
    "tool_id_internal_ns_garbage",
    "protocol",
    "try { await tools.callValue('\\u0000ns', {ns: 'x', path: ['__proto__'], args: []}); return 'called' }"
    " catch (e) { return e.name }",
    "Error",
)
ok(
    "tool_id_internal_mcp_garbage",
    "protocol",
    "try { await tools.callValue('\\u0000mcp', {server: 'x', op: 'call', input: {}}); return 'called' }"
    " catch (e) { return String(e) }",
    "Error: unknown tool: \x00mcp",
)
ok(
    "tool_id_internal_mcp_host_tool",
    "protocol",
    "try { await tools.callValue('\\u0000mcp', {id: 'host:core:echo', input: {value: 1}}); return 'called' }"
    " catch (e) { return String(e) }",
    "Error: unknown tool: \x00mcp",
    tools=("echo",),
)
ok(
    "tool_id_non_string",
    "protocol",
    "try { await tools.callValue(42, {}) } catch (e) { return String(e) }",
    "Error: tools.callValue(id, input): id must be a string",
)
ok(
    "tool_input_non_object",
    "protocol",
    "try { return await tools.echo(5) } catch (e) { return String(e) }",
    5,
    tools=("echo",),
)
ok(
    "tool_input_bad_type",
    "protocol",
    "try { return await tools.big({n: 'lots'}) } catch (e) { return e.name }",
    "Error",
    tools=("big",),
)
ok(
    "tool_input_extra_fields",
    "protocol",
    "try { return await tools.echo({value: 1, extra: 2}) } catch (e) { return e.name }",
    "Error",
    tools=("echo",),
)
ok(
    "tool_input_cycle",
    "protocol",
    "const a = {}; a.a = a; return await tools.echo({value: a})",
    {"a": "[Circular]"},
    tools=("echo",),
)
ok(
    "tool_input_bigint_symbol_fn",
    "protocol",
    "return await tools.echo({value: [1n, Symbol('q'), () => 1]})",
    ["1", "Symbol(q)", "[Function: anonymous]"],
    tools=("echo",),
)
ok(
    "tool_result_contract_broken",
    "protocol",
    "try { return await tools.liar() } catch (e) { return e.name }",
    "Error",
    tools=("liar",),
)
ok(
    "tool_returns_huge_int",
    "protocol",
    "const v = await tools.huge_int(); return [v === Infinity, v]",
    [True, None],
    tools=("huge_int",),
)
ok(
    "tool_returns_nested_nan_dict",
    "protocol",
    "return await tools.nan_dict()",
    {"a": {"b": [None]}},
    tools=("nan_dict",),
)
fail(
    "output_lone_surrogate_console",
    "protocol",
    "console.log('\\udbff'); return 2",
    None,
    "TypeError: Conversion from string failed",
)
ok("return_undefined", "protocol", "return undefined", None)
ok("return_sparse_array", "protocol", "return [1, , 3]", [1, None, 3])
ok("return_date", "protocol", "return typeof JSON.stringify(new Date(0))", "string")
ok("return_typed_array", "protocol", "return new Uint8Array([1, 2])", {"0": 1, "1": 2})
ok("return_map_set", "protocol", "return [new Map([[1, 2]]), new Set([1])]", [{}, {}])
ok("return_object_null_proto", "protocol", "const o = Object.create(null); o.a = 1; return o", {"a": 1})
ok(
    "return_max_depth",
    "protocol",
    "let v = 1n; for (let i = 0; i < 100; i++) v = [v]; let d = 0, x = v; while (Array.isArray(x)) { x = x[0]; d++ }"
    " return d",
    100,
)
ok("return_nul_chars", "protocol", "return '\\u0000\\u0001\\uffff'", "\x00\x01\uffff")

# ================================ spec ===========================================================
MODULE = "code mode module access is disabled."
fail("spec_static_import", "spec", "import fs from 'fs'", "invalid_input", MODULE)
fail("spec_import_side_effect", "spec", "import 'fs'; return 1", "invalid_input", MODULE)
fail("spec_export", "spec", "export const a = 1", "invalid_input", MODULE)
fail("spec_export_default", "spec", "export default 1", "invalid_input", MODULE)
fail("spec_dynamic_import", "spec", "return await import('fs')", "invalid_input", MODULE)
fail("spec_dynamic_import_computed", "spec", "const m = 'f' + 's'; return await import(m)", "invalid_input", MODULE)
fail("spec_import_meta", "spec", "return import.meta.url", "invalid_input")
fail("spec_require_call", "spec", "return require('fs')", "invalid_input", MODULE)
ok(
    "spec_require_indirect",
    "spec",
    "try { return globalThis['req' + 'uire']('fs') } catch (e) { return e.name }",
    "TypeError",
)
fail(
    "spec_require_in_nested_fn",
    "spec",
    "function f() { return require('child_process') } return 1",
    "invalid_input",
    MODULE,
)
ok(
    "spec_function_ctor_import",
    "spec",
    "try { await Function('return import(\"fs\")')() } catch (e) { return 'blocked' } return 'loaded'",
    "blocked",
)
fail("spec_tools_exec", "spec", "return await tools.exec({code: 'return 1'})", None, "TypeError: not a function")
ok("spec_tools_exec_typeof", "spec", "return [typeof tools.exec, typeof tools.wait]", ["undefined", "undefined"])
ok(
    "spec_callvalue_exec",
    "spec",
    "try { await tools.callValue('exec', {code: 'return 1'}) } catch (e) { return String(e).split('. ')[0] }",
    "Error: unknown tool: exec",
)
ok(
    "spec_callvalue_wait",
    "spec",
    "try { await tools.callValue('wait', {runId: 'x'}) } catch (e) { return String(e).split('. ')[0] }",
    "Error: unknown tool: wait",
)
ok("spec_globals_exec_wait", "spec", "return [typeof exec, typeof wait]", ["undefined", "undefined"])
ok(
    "spec_callvalue_yield_id_null",
    "spec",
    "try { await tools.callValue('\\u0000yield', null); return 'y' } catch (e) { return e.name }",
    "Error",
)
fail(
    "spec_yield_control_not_awaited_then_loop",
    "spec",
    "yield_control('x'); for (;;) {}",
    "timeout",
    config=FAST_TIMEOUT,
)
fail(
    "spec_yield_control_bad_reason",
    "spec",
    "const r = yield_control({toString() { throw new Error('r') }}).catch(e => 'c'); return 1",
    None,
    "Error: r",
)
CORPUS.append(
    Cell(
        name="spec_yield_control_waits",
        tags=("spec",),
        code="await yield_control('need input'); return 1",
        expect_status="waiting",
        expect_code=None,
    )
)
CORPUS.append(
    Cell(
        name="spec_yield_control_many",
        tags=("spec",),
        code="await Promise.all([yield_control('a'), yield_control('b'), yield_control('c')]); return 1",
        expect_status="waiting",
        expect_code=None,
    )
)
ok("spec_exit_in_finally", "spec", "try { return 1 } finally { exit() }", None)
ok("spec_exit_in_catch_of_exit", "spec", "try { exit() } catch (e) { return 'caught exit' }", None)
ok("spec_exit_then_loop", "spec", "try { exit() } finally { }; for (;;) {}", None, config=FAST_TIMEOUT)
ok("spec_exit_in_tojson", "spec", "return {toJSON() { exit() }}", None)
ok("spec_exit_from_microtask", "spec", "Promise.resolve().then(() => exit()); await null; await null; return 5", None)
ok(
    "spec_store_function",
    "spec",
    "try { store('k', () => 1); return 'stored' } catch (e) { return String(e) }",
    "TypeError: store(key, value): value is not JSON-serializable",
)
ok(
    "spec_store_undefined",
    "spec",
    "try { store('k', undefined); return 'stored' } catch (e) { return String(e) }",
    "stored",
)
ok(
    "spec_store_cycle",
    "spec",
    "const a = {}; a.a = a; try { store('k', a); return load('k') } catch (e) { return String(e) }",
    "TypeError: circular reference",
)
ok(
    "spec_store_bigint",
    "spec",
    "try { store('k', 1n); return load('k') } catch (e) { return String(e) }",
    "TypeError: BigInt are forbidden in JSON.stringify",
)
ok(
    "spec_store_symbol",
    "spec",
    "try { store('k', Symbol()); return 'stored' } catch (e) { return String(e) }",
    "TypeError: store(key, value): value is not JSON-serializable",
)
ok("spec_store_nan", "spec", "store('n', NaN); return load('n')", None)
ok(
    "spec_store_tojson_throws",
    "spec",
    "try { store('k', {toJSON() { throw new Error('tj') }}) } catch (e) { return e.message }",
    "tj",
)
ok(
    "spec_store_oversized_value",
    "spec",
    "try { store('k', 'x'.repeat(300000)) } catch (e) { return e.name }",
    "RangeError",
)
ok("spec_store_bad_key", "spec", "try { store('', 1) } catch (e) { return e.name }", "TypeError")
ok("spec_store_then_throw_not_committed", "spec", "return load('never-committed')", None)
ok("spec_load_returns_copy", "spec", "store('o', {a: 1}); const x = load('o'); x.a = 2; return load('o')", {"a": 1})
ok(
    "spec_image_remote_url",
    "spec",
    "try { image('https://example.com/a.png'); return 'ok' } catch (e) { return e.name }",
    "TypeError",
)
ok(
    "spec_image_garbage",
    "spec",
    "try { image('data:image/png;base64,@@@'); return 'ok' } catch (e) { return e.name }",
    "TypeError",
)
ok("spec_options_line_huge_timeout", "spec", '// @options: {"timeout_ms": 99999999}\nreturn 1', 1)
fail("spec_options_line_garbage", "spec", "// @options: {not json\nreturn 1", "invalid_input", "pragma")
fail("spec_syntax_error", "spec", "return (", "invalid_input")
# Sloppy-mode syntax runs as a JavaScript engine runs a script; strict mode is the cell's to ask for.
ok("spec_with_statement", "spec", "with ({a: 1}) { return a }", 1)
fail("spec_with_statement_strict", "spec", "'use strict'; with ({}) {}", "invalid_input")
ok("spec_html_comment", "spec", "<!-- x\nreturn 1", 1)
ok("spec_top_level_await_for", "spec", "let s = 0; for await (const x of [1, 2]) s += x; return s", 3)
fail("spec_throw_non_error", "spec", "throw {toString() { throw new Error('x') }}", None, "Error: {}")
fail("spec_throw_huge_message", "spec", "throw new Error('m'.repeat(1e6))", None)
fail("spec_throw_proxy", "spec", "throw new Proxy({}, {get() { throw 1 }})", None, "could not be read")
fail("spec_throw_null", "spec", "throw null", None)
ok("spec_reject_unhandled_then_return", "spec", "Promise.reject(new Error('unhandled')); return 1", 1)

# ---- lone surrogates on every other host-bound path ---------------------------------------------
fail("throw_lone_surrogate_message", "protocol", "throw new Error('\\ud800')", None, "could not be read")
fail(
    "throw_lone_surrogate_name",
    "protocol",
    "const e = new Error('m'); e.name = '\\udc00'; throw e",
    None,
    "could not be read",
)
fail("throw_lone_surrogate_string", "protocol", "throw '\\ud800'", None, "could not be read")
CORPUS.append(
    Cell(
        name="yield_control_lone_surrogate_reason",
        tags=("protocol", "spec"),
        code="await yield_control('\\ud800'); return 1",
        expect_status="waiting",
        expect_code=None,
    )
)
ok(
    "tool_id_lone_surrogate",
    "protocol",
    "try { await tools.callValue('\\ud800', {}) } catch (e) { return e.name }",
    "TypeError",
)
ok(
    "search_lone_surrogate",
    "protocol",
    "try { await tools.search('\\ud800'); return 's' } catch (e) { return e.name }",
    "TypeError",
)
ok(
    "describe_lone_surrogate",
    "protocol",
    "try { await tools.describe('\\udfff') } catch (e) { return e.name }",
    "TypeError",
)
# A store() key holding a lone surrogate is committed as U+FFFD (it used to make exec raise in the host).
ok("guest_store_key_lone_surrogate", "protocol spec", "store('\\ud800', 1); return 1", 1)
