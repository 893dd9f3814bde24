// Peer harness: QuickJS (quickjs-wasi, QuickJS-NG compiled to WASI) driven the way the reference
// design drives it: the VM runs in a Node worker thread off the main event loop; every exec (and
// every resume) gets a fresh VM, registers its host callback by a stable name and evaluates the
// prelude that builds `tools`; tool calls go to the main thread (the host) and back; a run that
// suspends is snapshotted, its VM disposed, and `wait` restores the snapshot into a new VM.
//
//   node harness.mjs '{"pauseMs": 2, "coldPauseMs": 200, "warmup": 10, "rounds": {"trivial": 300, ...},
//                      "cells": {"trivial": "return 1 + 1", ...}}'
//
// Prints one JSON object: {"node": version, "samples": {workload: [seconds, ...]}, "results": {...}}.
// Every sample is timed in the main thread with performance.now(): from posting the request to the
// worker until its answer arrives (both phases for suspend/resume; worker start for cold).

import { readFileSync } from 'node:fs';
import { Worker, isMainThread, parentPort } from 'node:worker_threads';

const TIMEOUT_MS = 10_000;
const MEMORY_LIMIT = 64 * 1024 * 1024;

// The trusted prelude, evaluated in every new VM. Host hooks are captured and deleted from the
// global; pending calls live in the guest heap, so a snapshot carries them to the restored VM.
const PRELUDE = `(() => {
  const host = globalThis.__host;
  delete globalThis.__host;
  const pending = new Map();
  let next = 0;
  const request = (kind, name, payload) => new Promise((resolve, reject) => {
    const id = ++next;
    pending.set(id, { resolve, reject });
    host(kind, name, JSON.stringify(payload === undefined ? null : payload), id);
  });
  Object.defineProperty(globalThis, '__settle', { value: (id, ok, text) => {
    const p = pending.get(id);
    pending.delete(id);
    if (ok) p.resolve(JSON.parse(text)); else p.reject(new Error(text));
  } });
  Object.defineProperty(globalThis, '__finish', { value: (promise) => promise.then(
    (v) => host('done', '', JSON.stringify(v === undefined ? null : v), 0),
    (e) => host('failed', '', String(e), 0),
  ) });
  globalThis.tools = Object.freeze(new Proxy({}, { get: (_, name) => (input) => request('tool', String(name), input) }));
  globalThis.yield_control = (reason) => request('yield', '', reason);
})();`;

const wrapCell = (code) => `__finish((async () => {\n${code}\n})());`;

// ---------------------------------------------------------------------------------------------
// Worker thread: owns the VMs.
// ---------------------------------------------------------------------------------------------

async function worker() {
  const { QuickJS } = await import('quickjs-wasi');
  const wasm = await WebAssembly.compile(readFileSync(new URL(import.meta.resolve('quickjs-wasi/quickjs.wasm'))));
  const snapshots = new Map();
  let run = null; // the one live run: {id, vm, deadline, inflight, yieldId, outcome}
  let nextRun = 0;

  const options = (r) => ({
    wasm,
    memoryLimit: MEMORY_LIMIT,
    interruptHandler: () => Date.now() > r.deadline,
  });

  function hostCall(kind, name, payload, id) {
    const r = run;
    const args = [kind, name, payload, id].map((h) => (h.isString ? h.toString() : h.toNumber()));
    if (args[0] === 'tool') {
      r.inflight += 1;
      parentPort.postMessage({ type: 'tool', runId: r.id, id: args[3], name: args[1], input: args[2] });
    } else if (args[0] === 'yield') {
      r.yieldId = args[3];
    } else {
      r.outcome = args[0] === 'done' ? { status: 'completed', value: args[2] } : { status: 'failed', error: args[2] };
    }
    return r.vm.undefined;
  }

  function settle(r, id, ok, text) {
    const fn = r.vm.global.getProp('__settle');
    const args = [r.vm.newNumber(id), ok ? r.vm.true : r.vm.false, r.vm.newString(text)];
    r.vm.callFunction(fn, r.vm.undefined, ...args).dispose();
    fn.dispose();
    args[0].dispose();
    args[2].dispose();
  }

  // Drain the VM's jobs, then answer: completed/failed (VM freed), waiting (snapshot, VM freed),
  // or nothing yet (tool calls in flight: their results arrive as messages).
  function advance(r) {
    try {
      r.vm.executePendingJobs();
    } catch (err) {
      r.outcome = { status: 'failed', error: String(err) };
    }
    if (r.outcome) {
      r.vm.dispose();
      run = null;
      parentPort.postMessage({ type: 'result', runId: r.id, ...r.outcome });
    } else if (r.inflight === 0 && r.yieldId !== null) {
      const snapshot = r.vm.snapshot();
      snapshots.set(r.id, { snapshot, yieldId: r.yieldId });
      r.vm.dispose();
      run = null;
      parentPort.postMessage({
        type: 'result',
        runId: r.id,
        status: 'waiting',
        snapshotBytes: snapshot.memory.byteLength,
      });
    }
  }

  async function exec(code) {
    const r = { id: ++nextRun, vm: null, deadline: Date.now() + TIMEOUT_MS, inflight: 0, yieldId: null, outcome: null };
    r.vm = await QuickJS.create(options(r));
    run = r;
    const fn = r.vm.newFunction('__host', hostCall);
    r.vm.setProp(r.vm.global, '__host', fn);
    fn.dispose();
    try {
      r.vm.evalCode(PRELUDE).dispose();
      r.vm.evalCode(wrapCell(code)).dispose();
    } catch (err) {
      r.outcome = { status: 'failed', error: String(err) };
    }
    advance(r);
  }

  async function wait(runId, value) {
    const saved = snapshots.get(runId);
    snapshots.delete(runId);
    const r = { id: runId, vm: null, deadline: Date.now() + TIMEOUT_MS, inflight: 0, yieldId: null, outcome: null };
    r.vm = await QuickJS.restore(saved.snapshot, options(r));
    run = r;
    r.vm.registerHostCallback('__host', hostCall);
    settle(r, saved.yieldId, true, JSON.stringify(value));
    advance(r);
  }

  parentPort.on('message', (msg) => {
    if (msg.type === 'exec') {
      exec(msg.code);
    } else if (msg.type === 'wait') {
      wait(msg.runId, msg.value);
    } else if (msg.type === 'toolResult') {
      const r = run;
      r.inflight -= 1;
      settle(r, msg.id, msg.ok, msg.output);
      advance(r);
    }
  });
  parentPort.postMessage({ type: 'ready' });
}

// ---------------------------------------------------------------------------------------------
// Main thread: the host. Runs tools, times each request.
// ---------------------------------------------------------------------------------------------

const TOOLS = { double: ({ x }) => x * 2 };

class Host {
  constructor() {
    this.worker = new Worker(new URL(import.meta.url));
    this.waiting = null;
    this.ready = new Promise((resolve) => {
      this.onReady = resolve;
    });
    this.worker.on('message', (msg) => this.onMessage(msg));
    this.worker.on('error', (err) => {
      process.stderr.write(`harness worker error: ${err.stack ?? err}\n`);
      process.exit(1);
    });
  }

  onMessage(msg) {
    if (msg.type === 'ready') {
      this.onReady();
    } else if (msg.type === 'tool') {
      let reply;
      try {
        reply = { ok: true, output: JSON.stringify(TOOLS[msg.name](JSON.parse(msg.input))) };
      } catch (err) {
        reply = { ok: false, output: `tool ${msg.name} failed: ${err}` };
      }
      this.worker.postMessage({ type: 'toolResult', runId: msg.runId, id: msg.id, ...reply });
    } else if (msg.type === 'result') {
      const resolve = this.waiting;
      this.waiting = null;
      resolve(msg);
    }
  }

  request(msg) {
    return new Promise((resolve) => {
      this.waiting = resolve;
      this.worker.postMessage(msg);
    });
  }

  exec(code) {
    return this.request({ type: 'exec', code });
  }

  wait(runId, value) {
    return this.request({ type: 'wait', runId, value });
  }

  close() {
    return this.worker.terminate();
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function expectCompleted(res, workload) {
  if (res.status !== 'completed') {
    throw new Error(`${workload}: expected completed, got ${JSON.stringify(res)}`);
  }
  return JSON.parse(res.value);
}

async function main(config) {
  const pauseMs = config.pauseMs ?? 2;
  // Before each cold round: lets the previous worker's teardown finish off the clock.
  const coldPauseMs = config.coldPauseMs ?? 200;
  const warmup = config.warmup ?? 10;
  const rounds = config.rounds ?? {};
  const cells = config.cells;
  const samples = {};
  const results = {};

  // One timed round: resolves to [seconds, value].
  const once = {
    trivial: async (host) => {
      const t0 = performance.now();
      const res = await host.exec(cells.trivial);
      return [(performance.now() - t0) / 1e3, expectCompleted(res, 'trivial')];
    },
    toolcalls: async (host) => {
      const t0 = performance.now();
      const res = await host.exec(cells.toolcalls);
      return [(performance.now() - t0) / 1e3, expectCompleted(res, 'toolcalls')];
    },
    filter: async (host) => {
      const t0 = performance.now();
      const res = await host.exec(cells.filter);
      return [(performance.now() - t0) / 1e3, expectCompleted(res, 'filter')];
    },
    suspend: async (host) => {
      let t0 = performance.now();
      const waiting = await host.exec(cells.suspend);
      const first = performance.now() - t0;
      if (waiting.status !== 'waiting') throw new Error(`suspend: ${JSON.stringify(waiting)}`);
      results.snapshotBytes = waiting.snapshotBytes;
      await sleep(pauseMs);
      t0 = performance.now();
      const res = await host.wait(waiting.runId, 1);
      return [(first + performance.now() - t0) / 1e3, expectCompleted(res, 'suspend')];
    },
  };

  // Back to back: the trivial cell with no pause between rounds.
  once.b2b = once.trivial;

  const host = new Host();
  await host.ready;
  for (const workload of ['trivial', 'b2b', 'toolcalls', 'filter', 'suspend']) {
    if (!rounds[workload]) continue;
    for (let i = 0; i < warmup; i++) await once[workload](host);
    samples[workload] = [];
    for (let i = 0; i < rounds[workload]; i++) {
      if (workload !== 'b2b') await sleep(pauseMs);
      const [seconds, value] = await once[workload](host);
      samples[workload].push(seconds);
      results[workload] = value;
    }
  }
  await host.close();

  // Cold: a new worker thread (module compile, VM, prelude) until the first cell's result.
  if (rounds.cold) {
    samples.cold = [];
    for (let i = 0; i < rounds.cold + 1; i++) {
      await sleep(coldPauseMs);
      const t0 = performance.now();
      const cold = new Host();
      const res = await cold.exec(cells.trivial);
      const seconds = (performance.now() - t0) / 1e3;
      results.cold = expectCompleted(res, 'cold');
      await cold.close();
      if (i === 0) results.coldFirstInProcess = seconds;
      else samples.cold.push(seconds);
    }
  }
  process.stdout.write(`${JSON.stringify({ node: process.version, samples, results })}\n`);
}

if (isMainThread) {
  await main(JSON.parse(process.argv[2] ?? '{}'));
} else {
  await worker();
}
