// Web APIs for guest code: TextEncoder/TextDecoder (UTF-8), atob/btoa, URL/URLSearchParams,
// structuredClone and DOMException, as the WHATWG/HTML specs define them. Pure and
// deterministic: no I/O, no timers, no clock.
//
// Compiled once per process and read into a run only when the guest first touches one of the
// globals (web_lazy.js defines them as lazy getters). `intrinsics` holds what web_lazy.js
// captured before any guest code ran; `web` the host functions (web.rs: UTF-8, base64, the
// `url` crate's WHATWG parser, forms, class ids). Nothing here reads a global or a built-in
// prototype at call time, so a guest that replaced `Array.prototype.push`, `Map` or a getter
// of `ArrayBuffer.prototype` before its first `new URL(...)` changes nothing here. Habits that
// follow: internal arrays have no prototype (an assignment cannot reach a setter a guest put on
// `Array.prototype`), descriptors are null-prototype, no `for...of` or spread over internal
// values, state lives in private fields.
(function installWeb(intrinsics, web) {
  "use strict";
  // web_lazy.js's list, bound to these parameters in its order: Reflect.apply reads an
  // array-like by index, through no iterator a guest could have replaced.
  return intrinsics[0](buildWebApis, undefined, intrinsics);

  function buildWebApis(
    ReflectApply, ReflectOwnKeys, ReflectGetOwnPropertyDescriptor, ObjectCreate, ObjectDefineProperty,
    ObjectKeys, ObjectHasOwn, ObjectSetPrototypeOf, ObjectCtor, ObjectPrototype, ArrayCtor, ArrayPrototype,
    ArraySort, StringToWellFormed, StringCharCodeAt, StringSlice, StringToLowerCase, SymbolIterator,
    SymbolToStringTag, SymbolToString, ErrorCtor, TypeErrorCtor, RangeErrorCtor, ErrorCtors, MapCtor, MapGet,
    MapSet, MapForEach, SetCtor, SetAdd, SetForEach, BooleanCtor, BooleanValueOf, NumberCtor, NumberValueOf,
    StringCtor, StringValueOf, BigIntValueOf, SymbolCtor, DateCtor, DateGetTime, RegExpCtor, RegExpExec,
    RegExpSource, RegExpFlagGetters, ArrayBufferCtor, ArrayBufferByteLength, ArrayBufferMaxByteLength,
    ArrayBufferResizable, ArrayBufferDetached, ArrayBufferImmutable, ArrayBufferTransferToImmutable,
    SharedArrayBufferCtor, SharedArrayBufferByteLength, DataViewCtor, DataViewBuffer, DataViewByteOffset,
    DataViewByteLength, TypedArrayBuffer, TypedArrayByteOffset, TypedArrayByteLength, TypedArrayLength,
    TypedArraySet, TypedArrayCtors, Uint8ArrayCtor, IteratorPrototype, PromiseCtor, WeakMapCtor, WeakSetCtor,
    ProxyCtor,
  ) {
    const classId = web.classId;

    // ---- conversions and shared helpers ------------------------------------------------------
    function isObject(v) {
      return (typeof v === "object" && v !== null) || typeof v === "function";
    }
    /// A list no prototype can intercept: `list[list.length] = x` defines an own element.
    function list() {
      return ObjectSetPrototypeOf([], null);
    }
    function add(to, value) {
      to[to.length] = value;
    }
    /// A finished list handed to the guest becomes an ordinary array.
    function guestArray(items) {
      return ObjectSetPrototypeOf(items, ArrayPrototype);
    }
    function defineData(target, key, value) {
      ObjectDefineProperty(target, key, { __proto__: null, value, writable: true, enumerable: true, configurable: true });
    }
    function call(fn, self) {
      return ReflectApply(fn, self, []);
    }
    /// WebIDL DOMString: ToString (a Symbol throws a TypeError).
    function domString(v) {
      return `${v}`;
    }
    /// WebIDL USVString: ToString, then each lone surrogate becomes U+FFFD.
    function usv(v) {
      return ReflectApply(StringToWellFormed, `${v}`, []);
    }
    function needArgs(count, needed, what) {
      if (count < needed) {
        throw new TypeErrorCtor(`${what}: ${needed} argument${needed === 1 ? "" : "s"} required, but only ${count} present.`);
      }
    }
    function illegal(what, iface) {
      return new TypeErrorCtor(`${what}: 'this' is not a ${iface}.`);
    }
    /// A short, bounded quotation of guest text for an error message.
    function quote(s) {
      return s.length > 200 ? `${ReflectApply(StringSlice, s, [0, 200])}…` : s;
    }
    function tag(cls, name) {
      ObjectDefineProperty(cls.prototype, SymbolToStringTag, { __proto__: null, value: name, configurable: true });
    }
    function dictionary(options, what) {
      if (options !== undefined && options !== null && !isObject(options)) {
        throw new TypeErrorCtor(`${what}: the options argument is not an object.`);
      }
      return options === undefined || options === null ? undefined : options;
    }

    /// WebIDL sequence conversion through the iterator protocol; `method` is the value's @@iterator.
    function sequence(value, method, what) {
      const iterator = ReflectApply(method, value, []);
      if (!isObject(iterator)) throw new TypeErrorCtor(`${what}: the iterator is not an object.`);
      const next = iterator.next;
      const out = list();
      for (;;) {
        const step = ReflectApply(next, iterator, []);
        if (!isObject(step)) throw new TypeErrorCtor(`${what}: the iterator result is not an object.`);
        if (step.done) return out;
        add(out, step.value);
      }
    }
    function iteratorMethod(value, what) {
      const method = value[SymbolIterator];
      if (method === undefined || method === null) return undefined;
      if (typeof method !== "function") throw new TypeErrorCtor(`${what}: its Symbol.iterator is not a function.`);
      return method;
    }

    // ---- class ids: what a value really is --------------------------------------------------
    // A brand no getter, Symbol.hasInstance or Proxy can fake: QuickJS's class of the object.
    const KIND = new MapCtor();
    function kind(name, sample) {
      ReflectApply(MapSet, KIND, [classId(sample), name]);
    }
    kind("Object", {});
    kind("Array", []);
    kind("Boolean", new BooleanCtor(false));
    kind("Number", new NumberCtor(0));
    kind("String", new StringCtor(""));
    kind("BigInt", ObjectCtor(0n));
    kind("Symbol", ObjectCtor(SymbolCtor()));
    kind("Date", new DateCtor(0));
    kind("RegExp", new RegExpCtor(""));
    kind("Map", new MapCtor());
    kind("Set", new SetCtor());
    kind("Error", new ErrorCtor());
    kind("ArrayBuffer", new ArrayBufferCtor(0));
    kind("SharedArrayBuffer", new SharedArrayBufferCtor(0));
    kind("DataView", new DataViewCtor(new ArrayBufferCtor(0)));
    const TYPED = new MapCtor();
    // TypedArrayCtors' order (Float16Array last, where the engine has it).
    const TYPED_NAMES = ["Int8Array", "Uint8Array", "Uint8ClampedArray", "Int16Array", "Uint16Array", "Int32Array",
      "Uint32Array", "Float32Array", "Float64Array", "BigInt64Array", "BigUint64Array", "Float16Array"];
    for (let i = 0; i < TypedArrayCtors.length; i++) {
      const Ctor = TypedArrayCtors[i];
      kind(TYPED_NAMES[i], new Ctor(0));
      ReflectApply(MapSet, TYPED, [TYPED_NAMES[i], Ctor]);
    }
    kind("Promise", new PromiseCtor(() => {}));
    kind("WeakMap", new WeakMapCtor());
    kind("WeakSet", new WeakSetCtor());
    kind("Proxy", new ProxyCtor({}, {}));

    function kindOf(v) {
      return isObject(v) ? ReflectApply(MapGet, KIND, [classId(v)]) : undefined;
    }
    function isTyped(k) {
      return k !== undefined && ReflectApply(MapGet, TYPED, [k]) !== undefined;
    }

    /// [buffer, byteOffset, byteLength] of a WebIDL BufferSource (shared buffers allowed); a
    /// detached or out-of-bounds view is empty.
    function bufferSource(v, what) {
      const k = kindOf(v);
      if (k === "ArrayBuffer") return [v, 0, call(ArrayBufferByteLength, v)];
      if (k === "SharedArrayBuffer") return [v, 0, call(SharedArrayBufferByteLength, v)];
      if (isTyped(k)) return [call(TypedArrayBuffer, v), call(TypedArrayByteOffset, v), call(TypedArrayByteLength, v)];
      if (k === "DataView") {
        const buffer = call(DataViewBuffer, v);
        try {
          return [buffer, call(DataViewByteOffset, v), call(DataViewByteLength, v)];
        } catch (_) {
          return [buffer, 0, 0]; // its buffer is detached
        }
      }
      throw new TypeErrorCtor(`${what}: the argument is not an ArrayBuffer, a typed array or a DataView.`);
    }

    // ---- DOMException ---------------------------------------------------------------------------
    const LEGACY_CODES = {
      __proto__: null, IndexSizeError: 1, HierarchyRequestError: 3, WrongDocumentError: 4, InvalidCharacterError: 5,
      NoModificationAllowedError: 7, NotFoundError: 8, NotSupportedError: 9, InvalidStateError: 11, SyntaxError: 12,
      InvalidModificationError: 13, NamespaceError: 14, InvalidAccessError: 15, TypeMismatchError: 17,
      SecurityError: 18, NetworkError: 19, AbortError: 20, URLMismatchError: 21, QuotaExceededError: 22,
      TimeoutError: 23, InvalidNodeTypeError: 24, DataCloneError: 25,
    };
    let isDOMException;
    class DOMException extends ErrorCtor {
      #message;
      #name;
      constructor(message = "", name = "Error") {
        super();
        this.#message = domString(message);
        this.#name = domString(name);
      }
      static {
        isDOMException = (o) => isObject(o) && #name in o;
      }
      get name() {
        if (!isDOMException(this)) throw illegal("DOMException.name", "DOMException");
        return this.#name;
      }
      get message() {
        if (!isDOMException(this)) throw illegal("DOMException.message", "DOMException");
        return this.#message;
      }
      get code() {
        if (!isDOMException(this)) throw illegal("DOMException.code", "DOMException");
        return ObjectHasOwn(LEGACY_CODES, this.#name) ? LEGACY_CODES[this.#name] : 0;
      }
    }
    tag(DOMException, "DOMException");

    // ---- TextEncoder / TextDecoder ---------------------------------------------------------------
    let isTextEncoder;
    class TextEncoder {
      #utf8 = true;
      static {
        isTextEncoder = (o) => isObject(o) && #utf8 in o;
      }
      get encoding() {
        if (!isTextEncoder(this)) throw illegal("TextEncoder.encoding", "TextEncoder");
        return "utf-8";
      }
      encode(input = "") {
        if (!isTextEncoder(this)) throw illegal("TextEncoder.encode", "TextEncoder");
        return web.encode(usv(input));
      }
      encodeInto(source, destination) {
        if (!isTextEncoder(this)) throw illegal("TextEncoder.encodeInto", "TextEncoder");
        needArgs(arguments.length, 2, "TextEncoder.encodeInto");
        const text = usv(source);
        if (kindOf(destination) !== "Uint8Array") {
          throw new TypeErrorCtor("TextEncoder.encodeInto: the destination is not a Uint8Array.");
        }
        const buffer = call(TypedArrayBuffer, destination);
        if (kindOf(buffer) === "ArrayBuffer" && call(ArrayBufferImmutable, buffer)) {
          throw new TypeErrorCtor("TextEncoder.encodeInto: the destination's ArrayBuffer is immutable.");
        }
        const done = web.encodeInto(text, buffer, call(TypedArrayByteOffset, destination), call(TypedArrayByteLength, destination));
        return { read: done[0], written: done[1] };
      }
    }
    tag(TextEncoder, "TextEncoder");

    const UTF8_LABELS = ["unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "utf-8", "utf8", "x-unicode20utf8"];
    const ASCII_TRIM = /^[\t\n\f\r ]*([^]*?)[\t\n\f\r ]*$/;
    function isUtf8Label(label) {
      const m = ReflectApply(RegExpExec, ASCII_TRIM, [label]);
      const name = ReflectApply(StringToLowerCase, m[1], []);
      for (let i = 0; i < UTF8_LABELS.length; i++) if (UTF8_LABELS[i] === name) return true;
      return false;
    }
    const EMPTY_LIST = ObjectSetPrototypeOf([], null);

    let isTextDecoder;
    class TextDecoder {
      #fatal;
      #ignoreBOM;
      // What a streaming decode kept: the first bytes of an unfinished character (at most 3).
      #pending = EMPTY_LIST;
      #bomSeen = false;
      constructor(label = "utf-8", options = undefined) {
        const name = domString(label);
        const opts = dictionary(options, "TextDecoder");
        const fatal = opts === undefined ? false : !!opts.fatal;
        const ignoreBOM = opts === undefined ? false : !!opts.ignoreBOM;
        if (!isUtf8Label(name)) {
          throw new RangeErrorCtor(`TextDecoder: the encoding label provided ('${quote(name)}') is invalid or unsupported: only UTF-8 is available.`);
        }
        this.#fatal = fatal;
        this.#ignoreBOM = ignoreBOM;
      }
      static {
        isTextDecoder = (o) => isObject(o) && #fatal in o;
      }
      get encoding() {
        if (!isTextDecoder(this)) throw illegal("TextDecoder.encoding", "TextDecoder");
        return "utf-8";
      }
      get fatal() {
        if (!isTextDecoder(this)) throw illegal("TextDecoder.fatal", "TextDecoder");
        return this.#fatal;
      }
      get ignoreBOM() {
        if (!isTextDecoder(this)) throw illegal("TextDecoder.ignoreBOM", "TextDecoder");
        return this.#ignoreBOM;
      }
      decode(input = undefined, options = undefined) {
        if (!isTextDecoder(this)) throw illegal("TextDecoder.decode", "TextDecoder");
        const opts = dictionary(options, "TextDecoder.decode");
        const stream = opts === undefined ? false : !!opts.stream;
        // Offsets are read after the options' getters ran: one of them may resize the buffer.
        const source = input === undefined ? undefined : bufferSource(input, "TextDecoder.decode");
        let done;
        try {
          done = source === undefined
            ? web.decode(this.#pending, undefined, 0, 0, this.#fatal, stream)
            : web.decode(this.#pending, source[0], source[1], source[2], this.#fatal, stream);
        } catch (error) {
          this.#pending = EMPTY_LIST;
          this.#bomSeen = false;
          throw error;
        }
        let text = done[0];
        if (!this.#ignoreBOM && !this.#bomSeen && text.length > 0) {
          this.#bomSeen = true;
          if (ReflectApply(StringCharCodeAt, text, [0]) === 0xfeff) text = ReflectApply(StringSlice, text, [1]);
        }
        if (stream) {
          this.#pending = done[1];
        } else {
          this.#pending = EMPTY_LIST;
          this.#bomSeen = false;
        }
        return text;
      }
    }
    tag(TextDecoder, "TextDecoder");

    // ---- atob / btoa ---------------------------------------------------------------------------
    function atob(data) {
      needArgs(arguments.length, 1, "atob");
      // A DOMString; a lone surrogate is outside the alphabet either way, as U+FFFD.
      const decoded = web.atob(usv(data));
      if (decoded === undefined) {
        throw new DOMException("atob: the string to be decoded is not correctly encoded.", "InvalidCharacterError");
      }
      return decoded;
    }
    function btoa(data) {
      needArgs(arguments.length, 1, "btoa");
      // A DOMString; a lone surrogate is above U+00FF either way, as U+FFFD.
      const encoded = web.btoa(usv(data));
      if (encoded === undefined) {
        throw new DOMException("btoa: the string to be encoded contains characters outside of the Latin1 range.", "InvalidCharacterError");
      }
      return encoded;
    }

    // ---- URLSearchParams -----------------------------------------------------------------------
    // Positions in the components array web.rs gives for a URL (and setter numbers for urlSet).
    const HREF = 0, ORIGIN = 1, PROTOCOL = 2, USERNAME = 3, PASSWORD = 4, HOST = 5, HOSTNAME = 6, PORT = 7,
      PATHNAME = 8, SEARCH = 9, HASH = 10, QUERY = 11;

    /// The name/value pairs of an application/x-www-form-urlencoded string.
    function parseForm(text) {
      const flat = web.formParse(text);
      const pairs = list();
      for (let i = 0; i + 1 < flat.length; i += 2) add(pairs, [flat[i], flat[i + 1]]);
      return pairs;
    }
    function byName(a, b) {
      return a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0;
    }

    let isParams, paramsList, linkParams, setUrlQuery;
    function checkParams(self, what) {
      if (!isParams(self)) throw illegal(`URLSearchParams.${what}`, "URLSearchParams");
    }
    class URLSearchParams {
      #list;
      #url = null;
      constructor(init = "") {
        if (isObject(init)) {
          const method = iteratorMethod(init, "URLSearchParams");
          this.#list = method !== undefined ? pairsFromSequence(init, method) : pairsFromRecord(init);
        } else {
          let text = usv(init);
          if (text.length > 0 && ReflectApply(StringCharCodeAt, text, [0]) === 0x3f) text = ReflectApply(StringSlice, text, [1]);
          this.#list = parseForm(text);
        }
      }
      static {
        isParams = (o) => isObject(o) && #list in o;
        paramsList = (o) => o.#list;
        // A URL's own searchParams: its list follows the URL's query from now on.
        linkParams = (params, url, query) => {
          params.#url = url;
          params.#list = parseForm(query);
        };
      }
      #update() {
        if (this.#url === null) return;
        const text = this.#serialize();
        setUrlQuery(this.#url, text === "" ? null : text);
      }
      #serialize() {
        const flat = list();
        const pairs = this.#list;
        for (let i = 0; i < pairs.length; i++) {
          add(flat, pairs[i][0]);
          add(flat, pairs[i][1]);
        }
        return web.formSerialize(flat);
      }
      get size() {
        if (!isParams(this)) throw illegal("URLSearchParams.size", "URLSearchParams");
        return this.#list.length;
      }
      append(name, value) {
        checkParams(this, "append");
        needArgs(arguments.length, 2, "URLSearchParams.append");
        add(this.#list, [usv(name), usv(value)]);
        this.#update();
      }
      delete(name, value = undefined) {
        checkParams(this, "delete");
        needArgs(arguments.length, 1, "URLSearchParams.delete");
        const key = usv(name);
        const only = value === undefined ? undefined : usv(value);
        const kept = list();
        const pairs = this.#list;
        for (let i = 0; i < pairs.length; i++) {
          if (pairs[i][0] !== key || (only !== undefined && pairs[i][1] !== only)) add(kept, pairs[i]);
        }
        this.#list = kept;
        this.#update();
      }
      get(name) {
        checkParams(this, "get");
        needArgs(arguments.length, 1, "URLSearchParams.get");
        const key = usv(name);
        const pairs = this.#list;
        for (let i = 0; i < pairs.length; i++) if (pairs[i][0] === key) return pairs[i][1];
        return null;
      }
      getAll(name) {
        checkParams(this, "getAll");
        needArgs(arguments.length, 1, "URLSearchParams.getAll");
        const key = usv(name);
        const out = list();
        const pairs = this.#list;
        for (let i = 0; i < pairs.length; i++) if (pairs[i][0] === key) add(out, pairs[i][1]);
        return guestArray(out);
      }
      has(name, value = undefined) {
        checkParams(this, "has");
        needArgs(arguments.length, 1, "URLSearchParams.has");
        const key = usv(name);
        const only = value === undefined ? undefined : usv(value);
        const pairs = this.#list;
        for (let i = 0; i < pairs.length; i++) {
          if (pairs[i][0] === key && (only === undefined || pairs[i][1] === only)) return true;
        }
        return false;
      }
      set(name, value) {
        checkParams(this, "set");
        needArgs(arguments.length, 2, "URLSearchParams.set");
        const key = usv(name);
        const text = usv(value);
        const kept = list();
        const pairs = this.#list;
        let found = false;
        for (let i = 0; i < pairs.length; i++) {
          if (pairs[i][0] !== key) add(kept, pairs[i]);
          else if (!found) {
            found = true;
            add(kept, [key, text]);
          }
        }
        if (!found) add(kept, [key, text]);
        this.#list = kept;
        this.#update();
      }
      sort() {
        checkParams(this, "sort");
        // Stable, by UTF-16 code units of the names, as the spec says.
        ReflectApply(ArraySort, this.#list, [byName]);
        this.#update();
      }
      toString() {
        checkParams(this, "toString");
        return this.#serialize();
      }
      forEach(callback, thisArg = undefined) {
        checkParams(this, "forEach");
        needArgs(arguments.length, 1, "URLSearchParams.forEach");
        if (typeof callback !== "function") throw new TypeErrorCtor("URLSearchParams.forEach: the callback is not a function.");
        // Live: the callback may change the list, and the walk sees it.
        for (let i = 0; i < this.#list.length; i++) {
          const pair = this.#list[i];
          ReflectApply(callback, thisArg, [pair[1], pair[0], this]);
        }
      }
      entries() {
        checkParams(this, "entries");
        return new ParamsIterator(this, 2);
      }
      keys() {
        checkParams(this, "keys");
        return new ParamsIterator(this, 0);
      }
      values() {
        checkParams(this, "values");
        return new ParamsIterator(this, 1);
      }
    }
    ObjectDefineProperty(URLSearchParams.prototype, SymbolIterator, {
      __proto__: null, value: URLSearchParams.prototype.entries, writable: true, configurable: true,
    });
    tag(URLSearchParams, "URLSearchParams");

    function pairsFromSequence(init, method) {
      const items = sequence(init, method, "URLSearchParams");
      const pairs = list();
      for (let i = 0; i < items.length; i++) {
        const item = items[i];
        const itemMethod = isObject(item) ? iteratorMethod(item, "URLSearchParams") : undefined;
        if (itemMethod === undefined) throw new TypeErrorCtor("URLSearchParams: each pair must be an iterable [name, value].");
        const pair = sequence(item, itemMethod, "URLSearchParams");
        if (pair.length !== 2) {
          throw new TypeErrorCtor(`URLSearchParams: each pair must hold exactly two items (name and value), not ${pair.length}.`);
        }
        add(pairs, [usv(pair[0]), usv(pair[1])]);
      }
      return pairs;
    }
    function pairsFromRecord(init) {
      const keys = ReflectOwnKeys(init);
      const pairs = list();
      const at = new MapCtor(); // a key's position, should two keys become one string
      for (let i = 0; i < keys.length; i++) {
        const desc = ReflectGetOwnPropertyDescriptor(init, keys[i]);
        if (desc === undefined || !desc.enumerable) continue;
        const name = usv(keys[i]);
        const value = usv(init[keys[i]]);
        const seen = ReflectApply(MapGet, at, [name]);
        if (seen !== undefined) {
          pairs[seen][1] = value;
        } else {
          ReflectApply(MapSet, at, [name, pairs.length]);
          add(pairs, [name, value]);
        }
      }
      return pairs;
    }

    // What a URLSearchParams iterator gives: 0 names, 1 values, 2 [name, value] pairs.
    let isParamsIterator;
    class ParamsIterator {
      #params;
      #kind;
      #index = 0;
      constructor(params, kind) {
        this.#params = params;
        this.#kind = kind;
      }
      static {
        isParamsIterator = (o) => isObject(o) && #kind in o;
      }
      next() {
        if (!isParamsIterator(this)) throw illegal("URLSearchParams Iterator.next", "URLSearchParams Iterator");
        const pairs = paramsList(this.#params);
        if (this.#index >= pairs.length) return { value: undefined, done: true };
        const pair = pairs[this.#index++];
        const value = this.#kind === 0 ? pair[0] : this.#kind === 1 ? pair[1] : [pair[0], pair[1]];
        return { value, done: false };
      }
    }
    ObjectSetPrototypeOf(ParamsIterator.prototype, IteratorPrototype);
    delete ParamsIterator.prototype.constructor;
    tag(ParamsIterator, "URLSearchParams Iterator");

    // ---- URL -----------------------------------------------------------------------------------
    /// The components of `url` parsed against `base`, or undefined when it does not parse.
    function parseUrl(url, base) {
      return web.urlParse(url, base);
    }

    let isURL, partOf, setPart;
    class URL {
      // web.rs's components: href, origin, protocol, username, password, host, hostname, port,
      // pathname, search, hash.
      #parts;
      #params = undefined;
      constructor(url, base = undefined) {
        needArgs(arguments.length, 1, "URL");
        const input = usv(url);
        const against = base === undefined ? undefined : usv(base);
        const parts = parseUrl(input, against);
        if (parts === undefined) {
          throw new TypeErrorCtor(against === undefined ? `Invalid URL: '${quote(input)}'` : `Invalid URL: '${quote(input)}' against base '${quote(against)}'`);
        }
        this.#parts = parts;
      }
      static {
        isURL = (o) => isObject(o) && #parts in o;
        partOf = (o, which, what) => {
          if (!isURL(o)) throw illegal(`URL.${what}`, "URL");
          return o.#parts[which];
        };
        setPart = (o, which, value, what) => {
          if (!isURL(o)) throw illegal(`URL.${what}`, "URL");
          const text = usv(value);
          const parts = web.urlSet(o.#parts[HREF], which, text);
          if (parts === undefined) throw new TypeErrorCtor(`Invalid URL: '${quote(text)}'`);
          o.#parts = parts;
          // The href and search setters replace the query: the searchParams list follows it.
          if ((which === HREF || which === SEARCH) && o.#params !== undefined) linkParams(o.#params, o, o.#queryText());
        };
        setUrlQuery = (url, query) => {
          url.#parts = web.urlSet(url.#parts[HREF], QUERY, query);
        };
      }
      static canParse(url, base = undefined) {
        needArgs(arguments.length, 1, "URL.canParse");
        return parseUrl(usv(url), base === undefined ? undefined : usv(base)) !== undefined;
      }
      static parse(url, base = undefined) {
        needArgs(arguments.length, 1, "URL.parse");
        const input = usv(url);
        const against = base === undefined ? undefined : usv(base);
        return parseUrl(input, against) === undefined ? null : new URL(input, against);
      }
      #queryText() {
        const search = this.#parts[SEARCH];
        return search.length > 0 ? ReflectApply(StringSlice, search, [1]) : "";
      }
      get href() { return partOf(this, HREF, "href"); }
      set href(v) { setPart(this, HREF, v, "href"); }
      get origin() { return partOf(this, ORIGIN, "origin"); }
      get protocol() { return partOf(this, PROTOCOL, "protocol"); }
      set protocol(v) { setPart(this, PROTOCOL, v, "protocol"); }
      get username() { return partOf(this, USERNAME, "username"); }
      set username(v) { setPart(this, USERNAME, v, "username"); }
      get password() { return partOf(this, PASSWORD, "password"); }
      set password(v) { setPart(this, PASSWORD, v, "password"); }
      get host() { return partOf(this, HOST, "host"); }
      set host(v) { setPart(this, HOST, v, "host"); }
      get hostname() { return partOf(this, HOSTNAME, "hostname"); }
      set hostname(v) { setPart(this, HOSTNAME, v, "hostname"); }
      get port() { return partOf(this, PORT, "port"); }
      set port(v) { setPart(this, PORT, v, "port"); }
      get pathname() { return partOf(this, PATHNAME, "pathname"); }
      set pathname(v) { setPart(this, PATHNAME, v, "pathname"); }
      get search() { return partOf(this, SEARCH, "search"); }
      set search(v) { setPart(this, SEARCH, v, "search"); }
      get hash() { return partOf(this, HASH, "hash"); }
      set hash(v) { setPart(this, HASH, v, "hash"); }
      get searchParams() {
        if (!isURL(this)) throw illegal("URL.searchParams", "URL");
        if (this.#params === undefined) {
          // Made on first use (the same object ever after), linked to this URL's query.
          const params = new URLSearchParams();
          linkParams(params, this, this.#queryText());
          this.#params = params;
        }
        return this.#params;
      }
      toString() { return partOf(this, HREF, "toString"); }
      toJSON() { return partOf(this, HREF, "toJSON"); }
    }
    tag(URL, "URL");

    // ---- structuredClone -------------------------------------------------------------------------
    function dataCloneError(what) {
      return new DOMException(`${what} could not be cloned.`, "DataCloneError");
    }
    function functionName(fn) {
      const desc = ReflectGetOwnPropertyDescriptor(fn, "name");
      return desc !== undefined && typeof desc.value === "string" && desc.value !== "" ? `The function ${quote(desc.value)}` : "An anonymous function";
    }
    function platformName(v) {
      if (isURL(v)) return "URL";
      if (isParams(v)) return "URLSearchParams";
      if (isTextEncoder(v)) return "TextEncoder";
      if (isTextDecoder(v)) return "TextDecoder";
      if (isParamsIterator(v)) return "URLSearchParams Iterator";
      return undefined;
    }

    const REGEXP_FLAGS = "dgimsuvy"; // RegExpFlagGetters' order, as `flags` spells them
    function regexpFlags(re) {
      let flags = "";
      for (let i = 0; i < REGEXP_FLAGS.length; i++) {
        if (call(RegExpFlagGetters[i], re)) flags += REGEXP_FLAGS[i];
      }
      return flags;
    }

    function cloneArrayBuffer(buffer) {
      if (call(ArrayBufferDetached, buffer)) throw dataCloneError("A detached ArrayBuffer");
      const length = call(ArrayBufferByteLength, buffer);
      const out = call(ArrayBufferResizable, buffer)
        ? new ArrayBufferCtor(length, { __proto__: null, maxByteLength: call(ArrayBufferMaxByteLength, buffer) })
        : new ArrayBufferCtor(length);
      ReflectApply(TypedArraySet, new Uint8ArrayCtor(out), [new Uint8ArrayCtor(buffer, 0, length)]);
      return call(ArrayBufferImmutable, buffer) ? call(ArrayBufferTransferToImmutable, out) : out;
    }

    const ERROR_NAMES = ["Error", "EvalError", "RangeError", "ReferenceError", "SyntaxError", "TypeError", "URIError"];
    const ERRORS = { __proto__: null }; // ErrorCtors by name (ERROR_NAMES is their order)
    for (let i = 0; i < ERROR_NAMES.length; i++) ERRORS[ERROR_NAMES[i]] = ErrorCtors[i];

    /// An Error by the HTML spec: its name if a standard one (else "Error"), its own message, and
    /// (as engines do) its stack.
    function cloneError(error) {
      if (isDOMException(error)) return new DOMException(error.message, error.name);
      const name = error.name;
      const Ctor = typeof name === "string" && ObjectHasOwn(ERRORS, name) ? ERRORS[name] : ErrorCtor;
      const message = ReflectGetOwnPropertyDescriptor(error, "message");
      const stack = ReflectGetOwnPropertyDescriptor(error, "stack");
      const out = new Ctor();
      if (message !== undefined && ObjectHasOwn(message, "value")) {
        ObjectDefineProperty(out, "message", { __proto__: null, value: domString(message.value), writable: true, configurable: true });
      }
      if (stack !== undefined && typeof stack.value === "string") {
        ObjectDefineProperty(out, "stack", { __proto__: null, value: stack.value, writable: true, configurable: true });
      }
      return out;
    }

    function copyOwnProperties(from, to, memory) {
      const keys = ObjectKeys(from);
      for (let i = 0; i < keys.length; i++) {
        // A getter earlier in the walk may have deleted a later property: it is skipped, as the spec says.
        if (ObjectHasOwn(from, keys[i])) defineData(to, keys[i], cloneValue(from[keys[i]], memory));
      }
    }

    function cloneValue(value, memory) {
      if (typeof value === "function") throw dataCloneError(functionName(value));
      if (typeof value === "symbol") throw dataCloneError(ReflectApply(SymbolToString, value, []));
      if (typeof value !== "object" || value === null) return value;
      const known = ReflectApply(MapGet, memory, [value]);
      if (known !== undefined) return known;
      const k = kindOf(value);
      let out;
      switch (k) {
        case "Object": {
          const platform = platformName(value);
          if (platform !== undefined) throw dataCloneError(`A ${platform} object`);
          out = ObjectCreate(ObjectPrototype);
          ReflectApply(MapSet, memory, [value, out]);
          copyOwnProperties(value, out, memory);
          return out;
        }
        case "Array":
          out = new ArrayCtor(value.length);
          ReflectApply(MapSet, memory, [value, out]);
          copyOwnProperties(value, out, memory);
          return out;
        case "Boolean": out = new BooleanCtor(call(BooleanValueOf, value)); break;
        case "Number": out = new NumberCtor(call(NumberValueOf, value)); break;
        case "String": out = new StringCtor(call(StringValueOf, value)); break;
        case "BigInt": out = ObjectCtor(call(BigIntValueOf, value)); break;
        case "Date": out = new DateCtor(call(DateGetTime, value)); break;
        case "RegExp": out = new RegExpCtor(call(RegExpSource, value), regexpFlags(value)); break;
        case "ArrayBuffer": out = cloneArrayBuffer(value); break;
        case "Error": out = cloneError(value); break;
        case "DataView": {
          const buffer = cloneValue(call(DataViewBuffer, value), memory);
          out = new DataViewCtor(buffer, call(DataViewByteOffset, value), call(DataViewByteLength, value));
          break;
        }
        case "Map": {
          out = new MapCtor();
          ReflectApply(MapSet, memory, [value, out]);
          // The entries as they are now; cloning a key or value may run a getter that changes the map.
          const entries = list();
          ReflectApply(MapForEach, value, [(v, key) => add(entries, [key, v])]);
          for (let i = 0; i < entries.length; i++) {
            ReflectApply(MapSet, out, [cloneValue(entries[i][0], memory), cloneValue(entries[i][1], memory)]);
          }
          return out;
        }
        case "Set": {
          out = new SetCtor();
          ReflectApply(MapSet, memory, [value, out]);
          const items = list();
          ReflectApply(SetForEach, value, [(v) => add(items, v)]);
          for (let i = 0; i < items.length; i++) ReflectApply(SetAdd, out, [cloneValue(items[i], memory)]);
          return out;
        }
        default: {
          // Promises, WeakMaps, Proxies, SharedArrayBuffers, generators, ...: not data.
          if (!isTyped(k)) throw dataCloneError(`#<${k === undefined ? "Object" : k}>`);
          const Ctor = ReflectApply(MapGet, TYPED, [k]);
          const buffer = cloneValue(call(TypedArrayBuffer, value), memory);
          out = new Ctor(buffer, call(TypedArrayByteOffset, value), call(TypedArrayLength, value));
        }
      }
      ReflectApply(MapSet, memory, [value, out]);
      return out;
    }

    function structuredClone(value, options = undefined) {
      needArgs(arguments.length, 1, "structuredClone");
      const opts = dictionary(options, "structuredClone");
      if (opts !== undefined && opts.transfer !== undefined) {
        const transfer = opts.transfer;
        const method = isObject(transfer) ? iteratorMethod(transfer, "structuredClone") : undefined;
        if (method === undefined) throw new TypeErrorCtor("structuredClone: options.transfer is not iterable.");
        if (sequence(transfer, method, "structuredClone").length > 0) {
          throw new DOMException("structuredClone: transferring objects is not supported in code mode.", "DataCloneError");
        }
      }
      return cloneValue(value, new MapCtor());
    }

    return { TextEncoder, TextDecoder, atob, btoa, URL, URLSearchParams, structuredClone, DOMException };
  }
})
