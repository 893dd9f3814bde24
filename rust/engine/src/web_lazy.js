// The web APIs' globals (TextEncoder, TextDecoder, atob, btoa, URL, URLSearchParams,
// structuredClone, DOMException): defined on every run, built on first use.
//
// This file wraps the prelude: engine.rs compiles `<this file>(<prelude.js>)`, so the function
// Rust calls with the host hooks is `installWithWebApis`. Before the prelude installs (and so
// before any guest code), it captures every intrinsic web.js relies on and defines each global
// as an accessor. The first read of any of them has web.rs read web.js's bytecode into the run
// and replaces all of them with plain values; until then a run pays for a few accessors, not
// for the APIs. A guest may assign or delete any of them, as it may a browser's.
(function withWebApis(install) {
  "use strict";
  return function installWithWebApis(host) {
    defineWebGlobals(host.web);
    return install(host);
  };

  function defineWebGlobals(web) {
    const G = globalThis;
    const ReflectGetOwnPropertyDescriptor = Reflect.getOwnPropertyDescriptor;
    const ObjectDefineProperty = Object.defineProperty;
    const ObjectGetPrototypeOf = Object.getPrototypeOf;
    const getter = (target, name) => ReflectGetOwnPropertyDescriptor(target, name).get;
    const TypedArray = ObjectGetPrototypeOf(Int8Array);
    const TypedArrayCtors = { __proto__: null, Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array,
      Int32Array, Uint32Array, Float32Array, Float64Array, BigInt64Array, BigUint64Array };
    if (typeof Float16Array === "function") TypedArrayCtors.Float16Array = Float16Array;
    const I = {
      __proto__: null,
      ReflectApply: Reflect.apply,
      ReflectOwnKeys: Reflect.ownKeys,
      ReflectGetOwnPropertyDescriptor,
      ObjectCreate: Object.create,
      ObjectDefineProperty,
      ObjectKeys: Object.keys,
      ObjectHasOwn: Object.hasOwn,
      ObjectSetPrototypeOf: Object.setPrototypeOf,
      ObjectCtor: Object,
      ObjectPrototype: Object.prototype,
      ArrayCtor: Array,
      ArrayPrototype: Array.prototype,
      ArraySort: Array.prototype.sort,
      StringToWellFormed: String.prototype.toWellFormed,
      StringCharCodeAt: String.prototype.charCodeAt,
      StringSlice: String.prototype.slice,
      StringToLowerCase: String.prototype.toLowerCase,
      SymbolIterator: Symbol.iterator,
      SymbolToStringTag: Symbol.toStringTag,
      SymbolToString: Symbol.prototype.toString,
      ErrorCtor: Error,
      TypeErrorCtor: TypeError,
      RangeErrorCtor: RangeError,
      ErrorCtors: { __proto__: null, Error, EvalError, RangeError, ReferenceError, SyntaxError, TypeError, URIError },
      MapCtor: Map,
      MapGet: Map.prototype.get,
      MapSet: Map.prototype.set,
      MapForEach: Map.prototype.forEach,
      SetCtor: Set,
      SetAdd: Set.prototype.add,
      SetForEach: Set.prototype.forEach,
      BooleanCtor: Boolean,
      BooleanValueOf: Boolean.prototype.valueOf,
      NumberCtor: Number,
      NumberValueOf: Number.prototype.valueOf,
      StringCtor: String,
      StringValueOf: String.prototype.valueOf,
      BigIntValueOf: BigInt.prototype.valueOf,
      SymbolCtor: Symbol,
      DateCtor: Date,
      DateGetTime: Date.prototype.getTime,
      RegExpCtor: RegExp,
      RegExpExec: RegExp.prototype.exec,
      RegExpSource: getter(RegExp.prototype, "source"),
      // In the order `flags` spells them.
      RegExpFlagGetters: { __proto__: null, d: getter(RegExp.prototype, "hasIndices"), g: getter(RegExp.prototype, "global"),
        i: getter(RegExp.prototype, "ignoreCase"), m: getter(RegExp.prototype, "multiline"),
        s: getter(RegExp.prototype, "dotAll"), u: getter(RegExp.prototype, "unicode"),
        v: getter(RegExp.prototype, "unicodeSets"), y: getter(RegExp.prototype, "sticky") },
      ArrayBufferCtor: ArrayBuffer,
      ArrayBufferByteLength: getter(ArrayBuffer.prototype, "byteLength"),
      ArrayBufferMaxByteLength: getter(ArrayBuffer.prototype, "maxByteLength"),
      ArrayBufferResizable: getter(ArrayBuffer.prototype, "resizable"),
      ArrayBufferDetached: getter(ArrayBuffer.prototype, "detached"),
      ArrayBufferImmutable: getter(ArrayBuffer.prototype, "immutable"),
      ArrayBufferTransferToImmutable: ArrayBuffer.prototype.transferToImmutable,
      SharedArrayBufferCtor: SharedArrayBuffer,
      SharedArrayBufferByteLength: getter(SharedArrayBuffer.prototype, "byteLength"),
      DataViewCtor: DataView,
      DataViewBuffer: getter(DataView.prototype, "buffer"),
      DataViewByteOffset: getter(DataView.prototype, "byteOffset"),
      DataViewByteLength: getter(DataView.prototype, "byteLength"),
      TypedArrayBuffer: getter(TypedArray.prototype, "buffer"),
      TypedArrayByteOffset: getter(TypedArray.prototype, "byteOffset"),
      TypedArrayByteLength: getter(TypedArray.prototype, "byteLength"),
      TypedArrayLength: getter(TypedArray.prototype, "length"),
      TypedArraySet: TypedArray.prototype.set,
      TypedArrayCtors,
      Uint8ArrayCtor: Uint8Array,
      IteratorPrototype: ObjectGetPrototypeOf(ObjectGetPrototypeOf([][Symbol.iterator]())),
      // Samples whose class ids tell structuredClone what it must refuse.
      MapSample: new Map(),
      PromiseSample: Promise.resolve(),
      WeakMapSample: new WeakMap(),
      WeakSetSample: new WeakSet(),
      ProxySample: new Proxy({}, {}),
    };

    const NAMES = ["TextEncoder", "TextDecoder", "atob", "btoa", "URL", "URLSearchParams", "structuredClone", "DOMException"];
    const getters = { __proto__: null };
    let apis;
    function load() {
      if (apis === undefined) {
        const built = web.load()(I, web);
        for (let i = 0; i < NAMES.length; i++) {
          const name = NAMES[i];
          const now = ReflectGetOwnPropertyDescriptor(G, name);
          // Only what the guest has not replaced or deleted yet.
          if (now !== undefined && now.get === getters[name]) define(name, built[name]);
        }
        apis = built;
      }
      return apis;
    }
    function define(name, value) {
      ObjectDefineProperty(G, name, { __proto__: null, value, writable: true, enumerable: false, configurable: true });
    }
    for (let i = 0; i < NAMES.length; i++) {
      const name = NAMES[i];
      const get = () => load()[name];
      getters[name] = get;
      ObjectDefineProperty(G, name, { __proto__: null, get, set: (value) => define(name, value), enumerable: false, configurable: true });
    }
  }
})
