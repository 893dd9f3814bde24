// Trusted prelude: builds the guest API inside a fresh QuickJS context.
//
// Evaluated once per runtime before any guest code runs; its completion value is `install`,
// which Rust calls with the host hooks. The hooks are captured in this closure and never
// reach `globalThis`. Every intrinsic the API relies on is captured here too, so a guest
// that later replaces `JSON.stringify`, `Array.prototype.map` or `Set.prototype.add` cannot
// change what the bridge does.
(function install(host) {
  "use strict";
  const G = globalThis;
  const bridgeCall = host.call;
  const hostLastCall = host.lastCall;
  const hostEmit = host.emit;
  const hostNow = host.now;
  const hostCheckDepth = host.checkDepth;
  const hostStored = host.stored;
  const MAX_VALUE_DEPTH = host.maxValueDepth;

  const ReflectApply = Reflect.apply;
  const ReflectConstruct = Reflect.construct;
  const ObjectKeys = Object.keys;
  const ObjectFreeze = Object.freeze;
  const ObjectDefineProperty = Object.defineProperty;
  const ObjectCreate = Object.create;
  const ObjectHasOwn = Object.hasOwn;
  const ArrayIsArray = Array.isArray;
  const ArrayPush = Array.prototype.push;
  const ArrayJoin = Array.prototype.join;
  const JsonStringify = JSON.stringify;
  const JsonParse = JSON.parse;
  const NumberIsFinite = Number.isFinite;
  const StringCtor = String;
  const StringSlice = String.prototype.slice;
  const StringCharCodeAt = String.prototype.charCodeAt;
  const SymbolToString = Symbol.prototype.toString;
  const SetCtor = Set;
  const SetHas = Set.prototype.has;
  const SetAdd = Set.prototype.add;
  const SetDelete = Set.prototype.delete;
  const ErrorCtor = Error;
  const TypeErrorCtor = TypeError;
  const RangeErrorCtor = RangeError;
  const RegExpExec = RegExp.prototype.exec;
  const PromiseCtor = Promise;
  const PromiseReject = Promise.reject;
  const RealDate = Date;
  const MAX_DEPTH = 64;
  // The bridge's internal tool ids (engine.rs `YIELD_TOOL`...: the one copy). Catalog tool ids
  // are validated by the host and none can contain a NUL, so these cannot collide with one.
  const YIELD_TOOL = host.yieldTool;
  const MCP_TOOL = host.mcpTool;
  const NAMESPACE_TOOL = host.namespaceTool;
  const OUTPUT_TOOL = host.outputTool;
  const MODELS_TOOL = host.modelsTool;
  const AGENTS_TOOL = host.agentsTool;
  const MAX_ERROR_CHARS = 4096;

  function push(array, value) {
    ReflectApply(ArrayPush, array, [value]);
  }

  // ---- forgotten awaits ----------------------------------------------------------------------
  // Every promise a bridge call returns is remembered with what made it (`call_3 tools.double`),
  // by identity, in a WeakMap only this closure holds: a guest object can pass for a Promise but
  // never for one of these, and nothing the guest replaces later changes the lookup. Where one is
  // serialized or used as a primitive, its text names the call, and a notice (output kind 7) says
  // where it was found: once per call, at most MAX_NOTICES a run. Nothing here reads a promise's
  // state, awaits it or calls its `then`.
  const NOTICE = 7;
  const MAX_NOTICES = 5;
  const MAX_LABEL_TOOL = 80;
  // Bound at install: a call neither looks anything up nor allocates (a `Reflect.apply` with
  // its argument array costs ~8x as much, and the lookup runs for every object that leaves).
  const bridgePromises = new WeakMap();
  const recordIn = ReflectApply(Function.prototype.bind, WeakMap.prototype.get, [bridgePromises]);
  const rememberIn = ReflectApply(Function.prototype.bind, WeakMap.prototype.set, [bridgePromises]);
  let remembered = 0; // none yet: serializing skips the lookup
  let noticesLeft = MAX_NOTICES;
  // Noticed records not yet emitted, oldest first, linked through `next`: never held in an array,
  // whose element writes would reach a setter the guest put on `Array.prototype`.
  let queueHead = null;
  let queueTail = null;
  let serializing = 0; // toJson calls under way (a guest toJSON can nest them)
  // What the value being serialized is (a phrase, or the record of the call whose input it is).
  const LEAVING = "a value leaving the cell";
  const AS_PRIMITIVE = "\u0000primitive";
  let site = LEAVING;

  /// What made a bridge promise: `fn` is the guest expression (`tools.double`), `tool` the id it
  /// named (`tools.callValue("t:x")`) or "", `id` the engine's call id (0: none, or refused);
  /// once noticed, `where` it was found. No prototype: no read of it can reach guest code.
  function callRecord(fn, tool) {
    return { __proto__: null, id: 0, fn, tool, noticed: false, where: LEAVING, next: null };
  }
  function remember(promise, record) {
    rememberIn(promise, record);
    remembered++;
  }
  function recordOf(value) {
    return remembered === 0 ? undefined : recordIn(value);
  }
  function quoted(tool) {
    const clipped = tool.length > MAX_LABEL_TOOL ? ReflectApply(StringSlice, tool, [0, MAX_LABEL_TOOL]) + "…" : tool;
    return JsonStringify(clipped);
  }
  function callLabel(record) {
    const expression = record.tool === "" ? record.fn : record.fn + "(" + quoted(record.tool) + ")";
    return record.id === 0 ? expression : "call_" + record.id + " " + expression;
  }
  function awaitHint(record) {
    const args = record.tool === "" ? "..." : quoted(record.tool) + ", ...";
    return "write `await " + record.fn + "(" + args + ")`";
  }
  function namedMarker(record) {
    return "[Promise of " + callLabel(record) + ": not awaited; use await]";
  }

  /// The text a remembered promise becomes where `site` is being serialized.
  function namedPromise(record) {
    note(record, site);
    return namedMarker(record);
  }
  function note(record, where) {
    if (record.noticed || noticesLeft === 0) return;
    record.noticed = true;
    record.where = where;
    noticesLeft--;
    if (queueTail === null) queueHead = record;
    else queueTail.next = record;
    queueTail = record;
  }
  function noticeText(record, where) {
    const found =
      where === AS_PRIMITIVE
        ? "its Promise was used as a string or number"
        : (typeof where === "string" ? where : "the input of " + callLabel(where)) + " holds its Promise";
    return callLabel(record) + ": " + found + ", not its result; " + awaitHint(record);
  }
  /// Emits the queued notices, after the output or call they were found in.
  function flushNotices() {
    if (serializing !== 0) return;
    while (queueHead !== null) {
      const record = queueHead;
      queueHead = record.next;
      if (queueHead === null) queueTail = null;
      hostEmit(NOTICE, noticeText(record, record.where));
    }
  }

  /// Starts a bridge call and remembers its promise with `record` (named after `via` if none).
  /// A call the engine refused (id 0: too many in flight, say) is not remembered: its promise
  /// has already rejected saying why, and a cell may make thousands of them.
  function hostCall(tool, inputJson, via, record) {
    const promise = bridgeCall(tool, inputJson, via);
    const id = hostLastCall();
    if (id !== 0) {
      const made = record === undefined ? callRecord(via, "") : record;
      made.id = id;
      remember(promise, made);
    }
    flushNotices();
    return promise;
  }
  /// `promise` settles as the call of `record` does (an envelope): it is named as that call.
  function alias(promise, record) {
    remember(promise, record);
    return promise;
  }
  /// `fn`, whose promises are named `label` (one record: they have no call id to tell apart).
  function labeled(label, fn) {
    const record = callRecord(label, "");
    const wrapped = (...args) => alias(ReflectApply(fn, undefined, args), record);
    ObjectDefineProperty(wrapped, "name", { value: fn.name });
    return wrapped;
  }

  // `${promise}` and `promise + 1` read the marker too. Any other promise converts as it always
  // did (OrdinaryToPrimitive: its own `valueOf`/`toString`).
  const TO_STRING_FIRST = ObjectFreeze(["toString", "valueOf"]);
  const VALUE_OF_FIRST = ObjectFreeze(["valueOf", "toString"]);
  function promiseToPrimitive(hint) {
    const record = recordOf(this);
    if (record === undefined) return ordinaryToPrimitive(this, hint);
    note(record, AS_PRIMITIVE);
    flushNotices();
    return namedMarker(record);
  }
  function ordinaryToPrimitive(object, hint) {
    const names = hint === "string" ? TO_STRING_FIRST : VALUE_OF_FIRST;
    for (let i = 0; i < 2; i++) {
      const method = object[names[i]];
      if (typeof method === "function") {
        const result = ReflectApply(method, object, []);
        if (typeof result !== "function" && (typeof result !== "object" || result === null)) return result;
      }
    }
    throw new TypeErrorCtor("Cannot convert object to primitive value");
  }
  ObjectDefineProperty(PromiseCtor.prototype, Symbol.toPrimitive, { value: promiseToPrimitive });

  // ---- JSON-safe adapter -------------------------------------------------------------------
  // Values leaving the VM become JSON text. The fast path is the engine's own stringify; the
  // slow path handles what JSON cannot: cycles, BigInt, functions, symbols, undefined at the
  // top level. Guest getters, toJSON and Proxy traps run here, under the interrupt budget.
  function safe(value, seen, depth) {
    switch (typeof value) {
      case "string":
      case "boolean":
        return value;
      case "number":
        return NumberIsFinite(value) ? value : null;
      case "bigint":
        return StringCtor(value);
      case "undefined":
        return undefined;
      case "symbol":
        return ReflectApply(SymbolToString, value, []);
      case "function":
        return "[Function: " + (typeof value.name === "string" && value.name ? value.name : "anonymous") + "]";
    }
    if (value === null) return null;
    if (depth >= MAX_DEPTH) return "[MaxDepth]";
    if (ReflectApply(SetHas, seen, [value])) return "[Circular]";
    const record = recordOf(value);
    if (record !== undefined) return namedPromise(record);
    if (value instanceof PromiseCtor) return NOT_AWAITED;
    if (typeof value.toJSON === "function") {
      return safe(value.toJSON(), seen, depth + 1);
    }
    if (value instanceof ErrorCtor) return errorJson(value);
    ReflectApply(SetAdd, seen, [value]);
    let out;
    if (ArrayIsArray(value)) {
      out = [];
      const n = value.length;
      for (let i = 0; i < n; i++) {
        const item = safe(value[i], seen, depth + 1);
        push(out, item === undefined ? null : item);
      }
    } else {
      out = {};
      const keys = ObjectKeys(value);
      for (let i = 0; i < keys.length; i++) {
        const key = keys[i];
        const item = safe(value[key], seen, depth + 1);
        if (item !== undefined) ObjectDefineProperty(out, key, { value: item, enumerable: true, writable: true, configurable: true });
      }
    }
    ReflectApply(SetDelete, seen, [value]);
    return out;
  }

  // What JSON.stringify would write as `{}`, said instead: an Error's name and message, and a
  // Promise (its state is never read and nothing is awaited or invoked: a forgotten `await`),
  // named after its call when a bridge call made it.
  const NOT_AWAITED = "[Promise: not awaited; use await]";
  function errorJson(error) {
    return { name: readable(error, "name"), message: readable(error, "message") };
  }
  function readable(error, key) {
    try {
      return StringCtor(error[key]);
    } catch (_) {
      return "[unreadable]"; // a getter that throws must not fail the value it sits in
    }
  }
  function replacer(_key, value) {
    if (typeof value === "object" && value !== null) {
      const record = recordOf(value);
      if (record !== undefined) return namedPromise(record);
      if (value instanceof PromiseCtor) return NOT_AWAITED;
      if (value instanceof ErrorCtor) return errorJson(value);
    }
    return value;
  }

  /// JSON text for any guest value; `undefined` and functions at the top level do not vanish.
  /// `where` is what the value is, for a notice about a bridge promise inside it (the caller
  /// flushes the notices once the value has left).
  function toJson(value, where) {
    const outer = site;
    site = where === undefined ? LEAVING : where;
    serializing++;
    try {
      return serialize(value);
    } finally {
      serializing--;
      site = outer;
    }
  }
  const STACK_EXCEEDED = "Maximum call stack size exceeded";
  function overflowed(error) {
    try {
      return error instanceof RangeErrorCtor && error.message === STACK_EXCEEDED;
    } catch (_) {
      return false; // a guest's error whose getters throw: not the engine's overflow
    }
  }
  let tooDeep = "";
  function tooDeepJson() {
    if (tooDeep === "") {
      for (let i = 0; i <= MAX_VALUE_DEPTH; i++) tooDeep = "[" + tooDeep + "]";
    }
    return tooDeep;
  }
  function serialize(value) {
    if (value === undefined) return "null";
    if (typeof value !== "function" && typeof value !== "symbol") {
      try {
        const text = JsonStringify(value, replacer);
        if (text !== undefined) return text;
      } catch (e) {
        // The engine's stringify ran out of C stack (thousands of levels: how many depends on
        // the compiler): the value is far deeper than may leave. JSON one level past the limit
        // says so where the way out checks it, never the walker's cut copy.
        if (overflowed(e)) return tooDeepJson();
        // cycles and BigInt: fall through to the walker
      }
    }
    const text = JsonStringify(safe(value, new SetCtor(), 0));
    return text === undefined ? "null" : text;
  }

  function display(value, where) {
    return typeof value === "string" ? value : toJson(value, where);
  }

  // ---- output --------------------------------------------------------------------------------
  function text(value) {
    hostEmit(0, display(value, "a text() output"));
    flushNotices();
  }
  function json(value) {
    hostEmit(1, toJson(value, "a json() output"));
    flushNotices();
  }
  function logger(kind, name) {
    const where = "a " + name + "() output";
    return function (...args) {
      const parts = [];
      for (let i = 0; i < args.length; i++) push(parts, display(args[i], where));
      hostEmit(kind, ReflectApply(ArrayJoin, parts, [" "]));
      flushNotices();
    };
  }
  const console = ObjectFreeze({
    log: logger(2, "console.log"),
    info: logger(3, "console.info"),
    debug: logger(2, "console.debug"),
    warn: logger(4, "console.warn"),
    error: logger(5, "console.error"),
  });

  // ---- tools ---------------------------------------------------------------------------------
  // The catalog lives in Rust, shared by every run of the worker; nothing of it is copied into
  // this VM until the cell asks (`ALL_TOOLS`, `tools.search`, `tools.<name>`).
  const hostAll = host.all;
  const hostNames = host.names;
  const hostResolve = host.resolve;
  const hostSearch = host.search;
  const hostDescribe = host.describe;

  // The bridge method each call names, as `CallMethod` in engine.rs spells them (the host shows
  // them in `pendingToolCalls`; a test pins the one each guest path sends).
  const VIA_CALL_VALUE = "callValue";
  const VIA_CALL = "call";
  const VIA_NAMESPACE = "namespace";
  const VIA_MCP = "mcp";
  const VIA_YIELD = "yield_control";
  const VIA_OUTPUT = "readOutput";
  const VIA_MODELS = "models";
  const VIA_AGENTS = "agents.run";

  function rejected(error) {
    return ReflectApply(PromiseReject, PromiseCtor, [error]);
  }

  // `id` is a catalog id or an exact, unambiguous tool name (the host resolves it). `record`
  // names the call (`tools.<helper>("<id>")` unless given).
  function callTool(helper, via, id, input, record) {
    if (typeof id !== "string") {
      return rejected(new ErrorCtor("tools." + helper + "(id, input): id must be a string"));
    }
    if (id.length > 0 && ReflectApply(StringCharCodeAt, id, [0]) === 0) {
      // The bridge's internal ids (yield, namespaces, MCP) are not tools.
      return rejected(new ErrorCtor("unknown tool: " + id));
    }
    const made = record === undefined ? callRecord("tools." + helper, id) : record;
    return hostCall(id, toJson(input === undefined ? {} : input, made), via, made);
  }
  function callValue(id, input) {
    return callTool("callValue", VIA_CALL_VALUE, id, input);
  }
  // The envelope's promise is the one the cell holds: it is named as the call inside it.
  function call(id, input) {
    const record = callRecord("tools.call", typeof id === "string" ? id : "");
    return alias(envelope(id, input, record), record);
  }
  async function envelope(id, input, record) {
    const result = await callTool("call", VIA_CALL, id, input, record);
    return { tool: id, result };
  }

  function deepFreeze(value) {
    if (value !== null && typeof value === "object") {
      const keys = ObjectKeys(value);
      for (let i = 0; i < keys.length; i++) deepFreeze(value[keys[i]]);
      ObjectFreeze(value);
    }
    return value;
  }

  async function search(query, options) {
    const limit = options !== null && typeof options === "object" && typeof options.limit === "number" ? options.limit : undefined;
    return deepFreeze(JsonParse(hostSearch(StringCtor(query === undefined ? "" : query), limit, undefined)));
  }

  async function describe(id) {
    const found = hostDescribe(StringCtor(id));
    if (found === null || found === undefined) throw new ErrorCtor("unknown tool: " + StringCtor(id));
    return deepFreeze(JsonParse(found));
  }

  // The same helpers under their Codemode-spec names: `searchTools(query, {limit, namespace})`
  // may be narrowed to one namespace (a tool's owner); `describeTool(name)` takes an id, a name
  // or a script identifier (`get_sum` for `get-sum`) and gives the declaration or undefined.
  async function searchTools(query, options) {
    const given = options !== null && typeof options === "object";
    const limit = given && typeof options.limit === "number" ? options.limit : undefined;
    const namespace = given && options.namespace !== undefined ? StringCtor(options.namespace) : undefined;
    return deepFreeze(JsonParse(hostSearch(StringCtor(query === undefined ? "" : query), limit, namespace)));
  }
  async function describeTool(name) {
    const key = StringCtor(name);
    let found = hostDescribe(key);
    if (found === null || found === undefined) {
      const id = hostResolve(key);
      if (id !== null && id !== undefined) found = hostDescribe(id);
    }
    return found === null || found === undefined ? undefined : deepFreeze(JsonParse(found));
  }

  const searchNamed = labeled("tools.search", search);
  const describeNamed = labeled("tools.describe", describe);
  const helpers = ObjectFreeze({ search: searchNamed, describe: describeNamed, call, callValue });
  const bound = ObjectCreate(null);
  function convenience(name) {
    if (typeof name !== "string") return undefined;
    if (ObjectHasOwn(helpers, name)) return helpers[name];
    if (ObjectHasOwn(bound, name)) return bound[name];
    const id = hostResolve(name);
    if (id === null || id === undefined) return undefined;
    const label = "tools." + name;
    const fn = (input) => callTool("callValue", VIA_CALL_VALUE, id, input, callRecord(label, ""));
    bound[name] = fn;
    return fn;
  }
  // `tools` is a read-only view: the helpers, plus `tools.<name>` for every unambiguous tool,
  // resolved on first use. Writes are refused so a cell cannot shadow a helper for itself.
  const tools = new Proxy(ObjectCreate(null), {
    get: (_, name) => convenience(name),
    has: (_, name) => convenience(name) !== undefined,
    ownKeys: () => [...ObjectKeys(helpers), ...JsonParse(hostNames())],
    getOwnPropertyDescriptor: (_, name) => {
      const value = convenience(name);
      return value === undefined ? undefined : { value, writable: false, enumerable: true, configurable: true };
    },
    set: () => false,
    defineProperty: () => false,
    deleteProperty: () => false,
    setPrototypeOf: () => false,
  });
  let allTools;
  ObjectDefineProperty(G, "ALL_TOOLS", {
    get: () => (allTools === undefined ? (allTools = deepFreeze(JsonParse(hostAll()))) : allTools),
    enumerable: false,
  });
  ObjectDefineProperty(G, "tools", { value: tools, enumerable: false });
  ObjectDefineProperty(G, "searchTools", { value: labeled("searchTools", searchTools), enumerable: false });
  ObjectDefineProperty(G, "describeTool", { value: labeled("describeTool", describeTool), enumerable: false });

  // ---- MCP and API --------------------------------------------------------------------------
  // `MCP.<server>.<tool>(input)` is the only way a cell reaches MCP tools; it resolves to the exact
  // catalog id and goes through the host's normal call path. `API` serves the declaration files
  // from the worker's catalog: reading them is never a tool call.
  const hostMcp = host.mcp;
  const hostApiList = host.apiList;
  const hostApiRead = host.apiRead;
  const hostMcpApi = host.mcpApi;

  // Every member of an unavailable server rejects with the reason, except `then` and `toJSON`:
  // a thenable would make `await MCP.down` hang on a promise nobody settles.
  function unavailableServer(info) {
    const fail = () => PromiseCtor.reject(new ErrorCtor(info.unavailable));
    const group = ObjectFreeze({ list: fail, read: fail, get: fail });
    const member = (name) => (name === "resources" || name === "prompts" ? group : name === "then" || name === "toJSON" ? undefined : fail);
    return new Proxy(ObjectCreate(null), {
      get: (_, name) => (typeof name === "string" ? member(name) : undefined),
      set: () => false,
      defineProperty: () => false,
      deleteProperty: () => false,
    });
  }

  function mcpCall(request, record) {
    return hostCall(MCP_TOOL, toJson(request, record), VIA_MCP, record);
  }

  function mcpServer(ident, info) {
    if (typeof info.unavailable === "string") return unavailableServer(info);
    const server = ObjectCreate(null);
    const toolIdents = ObjectKeys(info.tools);
    const prefix = "MCP." + ident + ".";
    for (let i = 0; i < toolIdents.length; i++) {
      const id = info.tools[toolIdents[i]];
      const label = prefix + toolIdents[i];
      server[toolIdents[i]] = (input) => mcpCall({ id, input: input === undefined ? {} : input }, callRecord(label, ""));
    }
    const op = (name) => {
      const label = prefix + name;
      return (input) => mcpCall({ server: info.server, op: name, input: input === undefined ? {} : input }, callRecord(label, ""));
    };
    server.$api = async (toolName, options) => {
      const schema = options !== null && typeof options === "object" && options.schema === true;
      return deepFreeze(JsonParse(hostMcpApi(ident, toolName === undefined ? undefined : StringCtor(toolName), schema)));
    };
    server.resources = ObjectFreeze({ list: op("resources.list"), read: op("resources.read") });
    server.prompts = ObjectFreeze({ list: op("prompts.list"), get: op("prompts.get") });
    return ObjectFreeze(server);
  }

  // `MCP.$api()`: the visible servers (a non-enumerable member: `Object.keys(MCP)` lists servers;
  // no server identifier starts with `$`) and the index declaration.
  function rootApi(servers) {
    const list = [];
    const idents = ObjectKeys(servers);
    for (let i = 0; i < idents.length; i++) {
      const info = servers[idents[i]];
      const item = { identifier: idents[i], serverName: info.server, toolCount: info.tools === undefined ? 0 : ObjectKeys(info.tools).length };
      if (typeof info.unavailable === "string") item.unavailable = info.unavailable;
      push(list, item);
    }
    return async () => {
      let declaration = "";
      if (list.length > 0) declaration = hostApiRead("mcp/index.d.ts");
      return deepFreeze({ declaration, servers: list });
    };
  }

  let mcpView;
  ObjectDefineProperty(G, "MCP", {
    get: () => {
      if (mcpView === undefined) {
        const servers = JsonParse(hostMcp());
        const view = ObjectCreate(null);
        const idents = ObjectKeys(servers);
        for (let i = 0; i < idents.length; i++) view[idents[i]] = mcpServer(idents[i], servers[idents[i]]);
        ObjectDefineProperty(view, "$api", { value: rootApi(servers), enumerable: false });
        mcpView = ObjectFreeze(view);
      }
      return mcpView;
    },
    enumerable: false,
  });

  const API = ObjectFreeze({
    list: async (prefix) => deepFreeze(JsonParse(hostApiList(prefix === undefined ? "" : StringCtor(prefix)))),
    read: async (path) => hostApiRead(StringCtor(path)),
  });
  ObjectDefineProperty(G, "API", { value: API, enumerable: false });

  // ---- namespaces ----------------------------------------------------------------------------
  // Plugin domain APIs (`Issues.list(...)`): plain data plus call markers, built per run by the
  // host. A marker becomes a function whose call goes through the catalog tool path in the host.
  const namespaceInfo = ObjectCreate(null);
  const namespacesView = ObjectCreate(null);

  // `where` is the scope's path as the cell writes it (`Issues.list`): it names the calls.
  function buildScope(value, ns, where) {
    if (value === null || typeof value !== "object") return value;
    if (ArrayIsArray(value)) {
      const out = [];
      for (let i = 0; i < value.length; i++) push(out, buildScope(value[i], ns, where + "[" + i + "]"));
      return ObjectFreeze(out);
    }
    if (typeof value.$call === "string") {
      const path = value.$call;
      return function (...args) {
        const record = callRecord(where, "");
        return hostCall(NAMESPACE_TOOL, toJson({ ns, path, args }, record), VIA_NAMESPACE, record);
      };
    }
    const out = ObjectCreate(null);
    const keys = ObjectKeys(value);
    for (let i = 0; i < keys.length; i++) out[keys[i]] = buildScope(value[keys[i]], ns, where + "." + keys[i]);
    return ObjectFreeze(out);
  }

  function installNamespaces(list) {
    for (let i = 0; i < list.length; i++) {
      const item = list[i];
      const scope = buildScope(item.scope, item.id, item.globalName);
      namespacesView[item.globalName] = scope;
      namespaceInfo[item.globalName] = deepFreeze({
        name: item.globalName,
        id: item.id,
        description: item.description,
        prompt: item.prompt,
        tools: item.tools,
      });
      ObjectDefineProperty(G, item.globalName, { value: scope, enumerable: false });
    }
    ObjectFreeze(namespacesView);
  }

  async function describeNamespace(name) {
    const info = namespaceInfo[StringCtor(name)];
    return info === undefined ? undefined : info;
  }

  ObjectDefineProperty(G, "namespaces", { value: namespacesView, enumerable: false });
  ObjectDefineProperty(G, "describeNamespace", { value: describeNamespace, enumerable: false });

  // ---- store / load (seed 002) ----------------------------------------------------------------
  // The session branch's committed values arrive with the run; writes stay here until the cell
  // completes, when the host commits them (and drops them on error, cancel or timeout).
  const MAX_STORE_VALUE = 262144;
  const MAX_STORE_TOTAL = 1048576;
  let committed = ObjectCreate(null);
  const pending = ObjectCreate(null);
  let wrote = false;
  let storeTotal = 0;

  function storeSize(key, text) {
    return text === null || text === undefined ? 0 : key.length + text.length;
  }
  function currentText(key) {
    if (ObjectHasOwn(pending, key)) return pending[key];
    return ObjectHasOwn(committed, key) ? committed[key] : null;
  }
  function storeKey(key) {
    if (typeof key !== "string" || key.length === 0 || key.length > 1024) {
      throw new TypeErrorCtor("store/load keys are non-empty strings of at most 1,024 characters");
    }
    return key;
  }
  function store(key, value) {
    key = storeKey(key);
    let text = null;
    if (value !== undefined) {
      try {
        text = JsonStringify(value);
      } catch (e) {
        if (!overflowed(e)) throw e;
        text = tooDeepJson(); // (refused just below, naming the limit)
      }
      if (text === undefined) throw new TypeErrorCtor("store(key, value): value is not JSON-serializable");
      if (text.length > MAX_STORE_VALUE) throw new RangeErrorCtor("store(key, value): a value may hold at most 262,144 characters of JSON");
      hostCheckDepth("store(key, value): the value", text);
    }
    const next = storeTotal - storeSize(key, currentText(key)) + storeSize(key, text);
    if (next > MAX_STORE_TOTAL) throw new RangeErrorCtor("store: keys and values may hold at most 1,048,576 characters in total");
    storeTotal = next;
    if (!wrote) {
      wrote = true;
      hostStored(); // (so the host asks for the writes of a cell that made some, only)
    }
    pending[key] = text;
  }
  function load(key) {
    const text = currentText(storeKey(key));
    return text === null ? undefined : JsonParse(text);
  }
  function storeWrites() {
    return JsonStringify(pending);
  }

  // ---- exit, image (seed 002) ------------------------------------------------------------------
  const hostExit = host.exit;
  function exit() {
    hostExit();
  }
  const IMAGE = /^data:image\/(png|jpeg|gif|webp);base64,([A-Za-z0-9+/]+={0,2})$/;
  function image(source) {
    let mime, data;
    if (typeof source === "string") {
      const m = ReflectApply(RegExpExec, IMAGE, [source]);
      if (m === null) throw new TypeErrorCtor("image() takes a base64 data URL of a PNG, JPEG, GIF or WebP image; remote URLs are not allowed");
      mime = "image/" + m[1];
      data = m[2];
    } else if (source !== null && typeof source === "object" && source.type === "image") {
      mime = StringCtor(source.mimeType);
      data = StringCtor(source.data);
      if (ReflectApply(RegExpExec, IMAGE, ["data:" + mime + ";base64," + data]) === null) throw new TypeErrorCtor("image(): only base64 PNG, JPEG, GIF or WebP blocks");
    } else {
      throw new TypeErrorCtor("image() takes a data URL or an {type: 'image', mimeType, data} block");
    }
    hostEmit(6, mime + ";" + data);
  }

  // ---- models (seed 002), installed only when the host has model providers -------------------
  // Every operation is a bridge call the host answers from its providers. A model is named by
  // its catalog provider and id alone: nothing else of the object leaves (no endpoint, no key).
  // Arguments are checked here, before any provider is asked; at most MAX_MODEL_OPS classify and
  // image operations run at once, the rest queue in this closure (linked, never in an array a
  // guest setter on `Array.prototype` could reach), so a replay makes the same calls in order.
  const MODEL_TYPES = ObjectFreeze({ __proto__: null, chat: true, image: true, classifier: true });
  const QUESTION_TYPES = ObjectFreeze({ __proto__: null, choice: true, score: true, bool: true });
  const MODEL_FIELDS = ObjectFreeze({ __proto__: null, provider: true, id: true, type: true, name: true });
  const MAX_MODEL_OPS = 4;
  const MAX_QUESTIONS = 64;
  const MAX_CRITERIA = 64;
  const MAX_PARTS = 64;
  let modelOps = 0;
  let modelHead = null;
  let modelTail = null;

  function isRecord(value) {
    return value !== null && typeof value === "object" && !ArrayIsArray(value);
  }
  function modelType(fn, type) {
    if (typeof type !== "string" || !ObjectHasOwn(MODEL_TYPES, type)) {
      throw new TypeErrorCtor("models." + fn + ': type must be "chat", "image" or "classifier"');
    }
    return type;
  }
  function providerName(fn, provider) {
    if (provider !== undefined && typeof provider !== "string") throw new TypeErrorCtor("models." + fn + ": provider must be a string");
    return provider;
  }
  function modelsCall(fn, request) {
    const record = callRecord("models." + fn, "");
    return hostCall(MODELS_TOOL, toJson(request, record), VIA_MODELS, record);
  }
  async function getModelsOfType(type, provider) {
    const fn = "getModelsOfType(type, provider?)";
    const request = { op: "list", type: modelType(fn, type), provider: providerName(fn, provider), available: false };
    return deepFreeze(await modelsCall("getModelsOfType", request));
  }
  async function getAvailableOfType(type, provider) {
    const fn = "getAvailableOfType(type, provider?)";
    const request = { op: "list", type: modelType(fn, type), provider: providerName(fn, provider), available: true };
    return deepFreeze(await modelsCall("getAvailableOfType", request));
  }
  async function getModelOfType(type, provider, id) {
    const fn = "getModelOfType(type, provider, id)";
    modelType(fn, type);
    if (typeof provider !== "string" || typeof id !== "string") {
      throw new TypeErrorCtor("models." + fn + ": provider and id are two separate strings");
    }
    const listed = await modelsCall("getModelOfType", { op: "list", type, provider, available: false });
    for (let i = 0; i < listed.length; i++) if (listed[i].id === id) return deepFreeze(listed[i]);
    return undefined;
  }

  /// The `{provider, id}` a model object names; what else it holds may only be what a listing gives.
  function modelRef(fn, model, type) {
    if (typeof model === "string") {
      throw new TypeErrorCtor("models." + fn + ': model is a model object from models.getAvailableOfType("' + type + '"), not a joined "provider/id" string');
    }
    // Each field is read once: a getter cannot pass the check with one value and send another.
    const provider = isRecord(model) ? model.provider : undefined;
    const id = isRecord(model) ? model.id : undefined;
    if (typeof provider !== "string" || typeof id !== "string") {
      throw new TypeErrorCtor("models." + fn + ": model must be a model object with the catalog's provider and id");
    }
    const keys = ObjectKeys(model);
    for (let i = 0; i < keys.length; i++) {
      if (!ObjectHasOwn(MODEL_FIELDS, keys[i])) {
        throw new TypeErrorCtor("models." + fn + ": a model is named by its provider and id only; " + JsonStringify(keys[i]) + " is not a model field (no custom endpoints)");
      }
    }
    const given = model.type;
    if (given !== undefined && given !== type) {
      throw new TypeErrorCtor("models." + fn + ": " + JsonStringify(id) + " is a " + StringCtor(given) + " model, not a " + type + " model");
    }
    return { provider, id };
  }
  function imageBlock(where, block) {
    const record = isRecord(block);
    const mimeType = record ? block.mimeType : undefined;
    const data = record ? block.data : undefined;
    if (!record || block.type !== "image" || typeof mimeType !== "string" || typeof data !== "string" ||
        ReflectApply(RegExpExec, IMAGE, ["data:" + mimeType + ";base64," + data]) === null) {
      throw new TypeErrorCtor(where + " must be a base64 image block {type: \"image\", mimeType, data} of a PNG, JPEG, GIF or WebP image");
    }
    return { type: "image", mimeType, data };
  }
  function criteriaText(where, value) {
    if (typeof value !== "string" || value.length === 0) throw new TypeErrorCtor(where + " must be a non-empty string");
    return value;
  }
  const CRITERIA_SHAPE = ObjectFreeze({
    __proto__: null,
    choice: "an object of labels and what each means",
    score: "the levels from low to high (an array of at least 2, or an object of level -> meaning)",
    bool: 'what "true" and "false" mean: {true: "...", false: "..."}',
  });
  function checkedCriteria(where, type, criteria) {
    const shape = where + ": criteria must be " + CRITERIA_SHAPE[type];
    if (type === "score" && ArrayIsArray(criteria)) {
      if (criteria.length < 2 || criteria.length > MAX_CRITERIA) throw new TypeErrorCtor(shape);
      const levels = [];
      for (let i = 0; i < criteria.length; i++) ObjectDefineProperty(levels, i, { value: criteriaText(where + ": level " + i, criteria[i]), enumerable: true, writable: true, configurable: true });
      return levels;
    }
    if (!isRecord(criteria)) throw new TypeErrorCtor(shape);
    const keys = ObjectKeys(criteria);
    const least = type === "choice" ? 1 : 2;
    if (keys.length < least || keys.length > MAX_CRITERIA) throw new TypeErrorCtor(shape);
    if (type === "bool" && (keys.length !== 2 || !ObjectHasOwn(criteria, "true") || !ObjectHasOwn(criteria, "false"))) throw new TypeErrorCtor(shape);
    const out = ObjectCreate(null);
    for (let i = 0; i < keys.length; i++) out[keys[i]] = criteriaText(where + ": criteria " + JsonStringify(keys[i]), criteria[keys[i]]);
    return out;
  }
  function checkedQuestions(fn, questions) {
    const keys = isRecord(questions) ? ObjectKeys(questions) : [];
    if (keys.length === 0 || keys.length > MAX_QUESTIONS) {
      throw new TypeErrorCtor("models." + fn + ": context.questions must be a non-empty object of questions (at most " + MAX_QUESTIONS + ")");
    }
    const out = ObjectCreate(null);
    for (let i = 0; i < keys.length; i++) {
      const where = "models." + fn + ": question " + JsonStringify(keys[i]);
      const question = questions[keys[i]];
      if (!isRecord(question)) throw new TypeErrorCtor(where + " must be an object {instructions, type, criteria}");
      const instructions = criteriaText(where + ": instructions", question.instructions);
      const type = question.type;
      if (typeof type !== "string" || !ObjectHasOwn(QUESTION_TYPES, type)) throw new TypeErrorCtor(where + ': type must be "choice", "score" or "bool"');
      out[keys[i]] = { instructions, type, criteria: checkedCriteria(where, type, question.criteria) };
    }
    return out;
  }
  function checkedImages(fn, images) {
    if (images === undefined) return [];
    if (!ArrayIsArray(images) || images.length > MAX_PARTS) throw new TypeErrorCtor("models." + fn + ": context.images must be an array of base64 image blocks");
    const out = [];
    for (let i = 0; i < images.length; i++) ObjectDefineProperty(out, i, { value: imageBlock("models." + fn + ": context.images[" + i + "]", images[i]), enumerable: true, writable: true, configurable: true });
    return out;
  }
  function classifyRequest(model, context) {
    const fn = "classify(model, context)";
    const ref = modelRef(fn, model, "classifier");
    if (!isRecord(context)) throw new TypeErrorCtor("models." + fn + ": context must be an object {state, questions, images?}");
    const state = context.state;
    if (!isRecord(state)) throw new TypeErrorCtor("models." + fn + ": context.state must be an object");
    const questions = checkedQuestions(fn, context.questions);
    const images = checkedImages(fn, context.images);
    return { op: "classify", provider: ref.provider, id: ref.id, context: { state, questions, images } };
  }
  function imagesRequest(model, context) {
    const fn = "generateImages(model, context)";
    const ref = modelRef(fn, model, "image");
    const input = isRecord(context) ? context.input : undefined;
    if (!ArrayIsArray(input) || input.length === 0 || input.length > MAX_PARTS) {
      throw new TypeErrorCtor("models." + fn + ': context must be {input: [{type: "text", text}, ...]} (base64 image blocks as references)');
    }
    const parts = [];
    let texts = 0;
    for (let i = 0; i < input.length; i++) {
      const part = input[i];
      const where = "models." + fn + ": input[" + i + "]";
      let item;
      if (isRecord(part) && part.type === "text") {
        item = { type: "text", text: criteriaText(where + ".text", part.text) };
        texts++;
      } else {
        item = imageBlock(where, part);
      }
      ObjectDefineProperty(parts, i, { value: item, enumerable: true, writable: true, configurable: true });
    }
    if (texts === 0) throw new TypeErrorCtor("models." + fn + ": input needs at least one {type: \"text\", text} part");
    return { op: "images", provider: ref.provider, id: ref.id, context: { input: parts } };
  }
  function queueModelOp(start) {
    const entry = { __proto__: null, start, next: null };
    if (modelTail === null) modelHead = entry;
    else modelTail.next = entry;
    modelTail = entry;
  }
  /// Runs one classify or image call once fewer than MAX_MODEL_OPS run (a finishing one hands its
  /// slot to the oldest queued).
  async function modelOp(fn, request) {
    if (modelOps >= MAX_MODEL_OPS) await new PromiseCtor(queueModelOp);
    else modelOps++;
    try {
      return await modelsCall(fn, request);
    } finally {
      const next = modelHead;
      if (next === null) {
        modelOps--;
      } else {
        modelHead = next.next;
        if (modelHead === null) modelTail = null;
        next.start();
      }
    }
  }
  async function classify(model, context) {
    return modelOp("classify", classifyRequest(model, context));
  }
  async function generateImages(model, context) {
    return modelOp("generateImages", imagesRequest(model, context));
  }
  function installModels() {
    const models = ObjectFreeze({
      getModelsOfType: labeled("models.getModelsOfType", getModelsOfType),
      getAvailableOfType: labeled("models.getAvailableOfType", getAvailableOfType),
      getModelOfType: labeled("models.getModelOfType", getModelOfType),
      classify: labeled("models.classify", classify),
      generateImages: labeled("models.generateImages", generateImages),
    });
    ObjectDefineProperty(G, "models", { value: models, enumerable: false });
  }

  // ---- Swarm: agents.run, phase, log (seed 000), installed only when the host runs sub-agents --
  // `agents.run` is a bridge call like a tool's (the host's gate, trace, maxPendingToolCalls,
  // suspend and `wait`, journal replay); `phase` and `log` are outputs the host shows as progress.
  const PHASE = 8;
  const PROGRESS = 9;
  function agentsRun(prompt, options) {
    if (typeof prompt !== "string" || prompt.length === 0) {
      return rejected(new TypeErrorCtor("agents.run(prompt, options?): prompt must be a non-empty string"));
    }
    if (options !== undefined && !isRecord(options)) {
      return rejected(new TypeErrorCtor("agents.run(prompt, options?): options must be an object"));
    }
    const record = callRecord("agents.run", "");
    return hostCall(AGENTS_TOOL, toJson(options === undefined ? { prompt } : { prompt, options }, record), VIA_AGENTS, record);
  }
  function phase(name) {
    if (typeof name !== "string" || name.length === 0) throw new TypeErrorCtor("phase(name): name must be a non-empty string");
    hostEmit(PHASE, name);
  }
  function installAgents() {
    ObjectDefineProperty(G, "agents", { value: ObjectFreeze({ run: agentsRun }), enumerable: false });
    ObjectDefineProperty(G, "phase", { value: phase, enumerable: false });
    ObjectDefineProperty(G, "log", { value: logger(PROGRESS, "log"), enumerable: false });
  }

  function installRun(json) {
    const run = JsonParse(json);
    if (run.namespaces) installNamespaces(run.namespaces);
    if (run.models === true) installModels();
    if (run.agents === true) installAgents();
    if (run.store) {
      committed = run.store;
      const keys = ObjectKeys(committed);
      for (let i = 0; i < keys.length; i++) storeTotal += storeSize(keys[i], committed[keys[i]]);
    }
  }

  ObjectDefineProperty(G, "store", { value: store, enumerable: false });
  ObjectDefineProperty(G, "load", { value: load, enumerable: false });
  ObjectDefineProperty(G, "exit", { value: exit, enumerable: false });
  ObjectDefineProperty(G, "image", { value: image, enumerable: false });
  // The tool-search-code surface's spelling of the catalog helpers.
  ObjectDefineProperty(G, "codemode", { value: ObjectFreeze({ tools: ObjectFreeze({ search: searchNamed, describe: describeNamed, call }) }), enumerable: false });

  // ---- determinism: seeded Math.random and a journaled clock ---------------------------------
  // The state is seeded by the host, which also runs sfc32's first 12 rounds (`startCell`).
  let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  // sfc32: small, fast, and good enough for guest code that wants variety, not secrets.
  function random() {
    const t = (((s0 + s1) | 0) + s3) | 0;
    s3 = (s3 + 1) | 0;
    s0 = s1 ^ (s1 >>> 9);
    s1 = (s2 + (s2 << 3)) | 0;
    s2 = (s2 << 21) | (s2 >>> 11);
    s2 = (s2 + t) | 0;
    return (t >>> 0) / 4294967296;
  }
  ObjectDefineProperty(Math, "random", { value: random, writable: true, configurable: true });

  // `new Date()` and `Date.now()` read the journaled host clock; everything else is the real Date.
  function GuestDate(...args) {
    if (new.target === undefined) return ReflectApply(RealDate.prototype.toString, new RealDate(hostNow()), []);
    return ReflectConstruct(RealDate, args.length === 0 ? [hostNow()] : args, new.target);
  }
  ObjectDefineProperty(GuestDate, "name", { value: "Date" });
  ObjectDefineProperty(GuestDate, "prototype", { value: RealDate.prototype });
  ObjectDefineProperty(RealDate.prototype, "constructor", { value: GuestDate, writable: true, configurable: true });
  GuestDate.now = function now() { return hostNow(); };
  GuestDate.parse = RealDate.parse;
  GuestDate.UTC = RealDate.UTC;
  ObjectDefineProperty(G, "Date", { value: GuestDate, writable: true, configurable: true });

  // V8-style stack hooks would hand a guest the prelude's own closures through
  // `CallSite.getFunction()`: pin them to "absent".
  ObjectDefineProperty(ErrorCtor, "prepareStackTrace", { value: undefined, writable: false, configurable: false });

  // ---- what is never present -----------------------------------------------------------------
  const absent = ["WeakRef", "FinalizationRegistry", "performance", "setTimeout", "setInterval", "require", "process"];
  for (let i = 0; i < absent.length; i++) delete G[absent[i]];

  // Hands control back to the model: the host answers it on the next `wait`, settling it with
  // that `wait`'s `answer` (JSON), or `null` for none, which resolves to undefined.
  function yield_control(reason) {
    const record = callRecord("yield_control", "");
    const text = reason === undefined ? null : StringCtor(reason);
    return alias(resumed(hostCall(YIELD_TOOL, toJson(text, record), VIA_YIELD, record)), record);
  }
  async function resumed(yielded) {
    const answer = await yielded;
    return answer === null ? undefined : answer;
  }

  // Reads back the full text of a cut output (the cut note names its handle), a piece at a time:
  // the host answers from what it kept for this session, like a tool result.
  function readOutput(handle, options) {
    const given = options !== null && typeof options === "object";
    return hostCall(OUTPUT_TOOL, toJson({ handle, offset: given ? options.offset : undefined, limit: given ? options.limit : undefined }), VIA_OUTPUT);
  }

  ObjectDefineProperty(G, "yield_control", { value: yield_control, enumerable: false });
  ObjectDefineProperty(G, "readOutput", { value: readOutput, enumerable: false });
  ObjectDefineProperty(G, "text", { value: text, enumerable: false });
  ObjectDefineProperty(G, "json", { value: json, enumerable: false });
  ObjectDefineProperty(G, "console", { value: console, enumerable: false, writable: true, configurable: true });

  // ---- internals handed back to Rust (never reachable from the guest) ------------------------
  // One call starts a cell: its seeded random state, its run's set-up (`installRun`; absent
  // when it has none), then the cell itself.
  function startCell(fn, a, b, c, d, run) {
    s0 = a; s1 = b; s2 = c; s3 = d;
    if (run !== undefined) installRun(run);
    return runCell(fn);
  }
  async function runCell(fn) {
    const value = await fn();
    const json = toJson(value, "the cell's value");
    flushNotices();
    return json;
  }

  function clip(s) {
    s = StringCtor(s);
    if (s.length <= MAX_ERROR_CHARS) return s;
    // Never between the halves of a surrogate pair.
    const high = ReflectApply(StringCharCodeAt, s, [MAX_ERROR_CHARS - 1]);
    const end = high >= 0xd800 && high < 0xdc00 ? MAX_ERROR_CHARS - 1 : MAX_ERROR_CHARS;
    return ReflectApply(StringSlice, s, [0, end]) + "…";
  }

  function describeError(error) {
    let name = "Error", message = "", stack = "";
    try {
      if (error instanceof ErrorCtor) {
        name = clip(error.name);
        message = clip(error.message);
        stack = typeof error.stack === "string" ? clip(error.stack) : "";
      } else {
        message = clip(display(error, "the error the cell threw"));
        flushNotices();
      }
    } catch (_) {
      message = "uncaught exception (its value could not be read)";
    }
    return [name, message, stack];
  }

  function makeError(message) {
    return new ErrorCtor(StringCtor(message));
  }

  return { startCell, describeError, makeError, storeWrites };
})
