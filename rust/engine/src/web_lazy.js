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
    defineWebGlobals(host.loadWeb);
    return install(host);
  };

  function defineWebGlobals(loadWeb) {
    const G = globalThis;
    const ReflectGetOwnPropertyDescriptor = Reflect.getOwnPropertyDescriptor;
    const ObjectDefineProperty = Object.defineProperty;
    const ObjectGetPrototypeOf = Object.getPrototypeOf;
    // C methods are built on first read (a capture costs one), getters already exist: reading one
    // through __lookupGetter__ makes no descriptor object.
    const ReflectApply = Reflect.apply;
    const lookupGetter = Object.prototype.__lookupGetter__;
    const getter = (target, name) => ReflectApply(lookupGetter, target, [name]);
    const TypedArray = ObjectGetPrototypeOf(Int8Array);
    // In web.js's TYPED_NAMES order.
    const TypedArrayCtors = [Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array, Int32Array,
      Uint32Array, Float32Array, Float64Array, BigInt64Array, BigUint64Array];
    if (typeof Float16Array === "function") TypedArrayCtors[TypedArrayCtors.length] = Float16Array;
    // In the order of buildWebApis's parameters in web.js (an array: no property names to
    // build a shape from on every run).
    const I = [
      ReflectApply, // ReflectApply
      Reflect.ownKeys, // ReflectOwnKeys
      ReflectGetOwnPropertyDescriptor, // ReflectGetOwnPropertyDescriptor
      Object.create, // ObjectCreate
      ObjectDefineProperty, // ObjectDefineProperty
      Object.keys, // ObjectKeys
      Object.hasOwn, // ObjectHasOwn
      Object.setPrototypeOf, // ObjectSetPrototypeOf
      Object, // ObjectCtor
      Object.prototype, // ObjectPrototype
      Array, // ArrayCtor
      Array.prototype, // ArrayPrototype
      Array.prototype.sort, // ArraySort
      String.prototype.toWellFormed, // StringToWellFormed
      String.prototype.charCodeAt, // StringCharCodeAt
      String.prototype.slice, // StringSlice
      String.prototype.toLowerCase, // StringToLowerCase
      Symbol.iterator, // SymbolIterator
      Symbol.toStringTag, // SymbolToStringTag
      Symbol.prototype.toString, // SymbolToString
      Error, // ErrorCtor
      TypeError, // TypeErrorCtor
      RangeError, // RangeErrorCtor
      [Error, EvalError, RangeError, ReferenceError, SyntaxError, TypeError, URIError], // ErrorCtors
      Map, // MapCtor
      Map.prototype.get, // MapGet
      Map.prototype.set, // MapSet
      Map.prototype.forEach, // MapForEach
      Set, // SetCtor
      Set.prototype.add, // SetAdd
      Set.prototype.forEach, // SetForEach
      Boolean, // BooleanCtor
      Boolean.prototype.valueOf, // BooleanValueOf
      Number, // NumberCtor
      Number.prototype.valueOf, // NumberValueOf
      String, // StringCtor
      String.prototype.valueOf, // StringValueOf
      BigInt.prototype.valueOf, // BigIntValueOf
      Symbol, // SymbolCtor
      Date, // DateCtor
      Date.prototype.getTime, // DateGetTime
      RegExp, // RegExpCtor
      RegExp.prototype.exec, // RegExpExec
      getter(RegExp.prototype, "source"), // RegExpSource
      [getter(RegExp.prototype, "hasIndices"), getter(RegExp.prototype, "global"), getter(RegExp.prototype, "ignoreCase"),
        getter(RegExp.prototype, "multiline"), getter(RegExp.prototype, "dotAll"), getter(RegExp.prototype, "unicode"),
        getter(RegExp.prototype, "unicodeSets"), getter(RegExp.prototype, "sticky")], // RegExpFlagGetters, "dgimsuvy"
      ArrayBuffer, // ArrayBufferCtor
      getter(ArrayBuffer.prototype, "byteLength"), // ArrayBufferByteLength
      getter(ArrayBuffer.prototype, "maxByteLength"), // ArrayBufferMaxByteLength
      getter(ArrayBuffer.prototype, "resizable"), // ArrayBufferResizable
      getter(ArrayBuffer.prototype, "detached"), // ArrayBufferDetached
      getter(ArrayBuffer.prototype, "immutable"), // ArrayBufferImmutable
      ArrayBuffer.prototype.transferToImmutable, // ArrayBufferTransferToImmutable
      SharedArrayBuffer, // SharedArrayBufferCtor
      getter(SharedArrayBuffer.prototype, "byteLength"), // SharedArrayBufferByteLength
      DataView, // DataViewCtor
      getter(DataView.prototype, "buffer"), // DataViewBuffer
      getter(DataView.prototype, "byteOffset"), // DataViewByteOffset
      getter(DataView.prototype, "byteLength"), // DataViewByteLength
      getter(TypedArray.prototype, "buffer"), // TypedArrayBuffer
      getter(TypedArray.prototype, "byteOffset"), // TypedArrayByteOffset
      getter(TypedArray.prototype, "byteLength"), // TypedArrayByteLength
      getter(TypedArray.prototype, "length"), // TypedArrayLength
      TypedArray.prototype.set, // TypedArraySet
      TypedArrayCtors, // TypedArrayCtors
      Uint8Array, // Uint8ArrayCtor
      ObjectGetPrototypeOf(ObjectGetPrototypeOf([][Symbol.iterator]())), // IteratorPrototype
      Promise, // PromiseCtor
      WeakMap, // WeakMapCtor
      WeakSet, // WeakSetCtor
      Proxy, // ProxyCtor
    ];

    const NAMES = ["TextEncoder", "TextDecoder", "atob", "btoa", "URL", "URLSearchParams", "structuredClone", "DOMException"];
    const getters = []; // NAMES[i]'s accessor getter
    let apis;
    function load() {
      if (apis === undefined) {
        const loaded = loadWeb(); // [installWeb, the host functions]
        const built = loaded[0](I, loaded[1]);
        for (let i = 0; i < NAMES.length; i++) {
          const name = NAMES[i];
          const now = ReflectGetOwnPropertyDescriptor(G, name);
          // Only what the guest has not replaced or deleted yet.
          if (now !== undefined && now.get === getters[i]) define(name, built[name]);
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
      getters[i] = get;
      ObjectDefineProperty(G, name, { __proto__: null, get, set: (value) => define(name, value), enumerable: false, configurable: true });
    }
  }
})
