// The Node client against a real normd (NORMD_BINARY), checked against fp64
// arithmetic done here; the x-normd-model header against a recording
// grpc-js server. Run: NORMD_BINARY=build/normd node --test client/node/test/
"use strict";

const test = require("node:test");
const assert = require("node:assert/strict");
const { spawn } = require("node:child_process");
const grpc = require("@grpc/grpc-js");
const { Client, NormdError, halfToNumber, modelGroup, status } = require("..");

function startNormd() {
  const binary = process.env.NORMD_BINARY;
  assert.ok(binary, "set NORMD_BINARY to the normd to test");
  const proc = spawn(binary, ["--bind_address=127.0.0.1", "--port=0", "--metrics_port=0", "--http_port=0"],
    { stdio: ["ignore", "ignore", "pipe"] });
  return new Promise((resolve, reject) => {
    let log = "";
    proc.stderr.on("data", (chunk) => {
      log += chunk;
      const m = /serving gRPC on [^ ]*:(\d+)/.exec(log);
      if (m) resolve({ proc, target: `127.0.0.1:${m[1]}` });
    });
    proc.on("exit", (code) => reject(new Error(`normd exited ${code}: ${log}`)));
  });
}

// fp64 LayerNorm of each row of length n.
function layerNormRef(x, n, eps = 1e-5) {
  const y = new Float64Array(x.length);
  for (let r = 0; r < x.length; r += n) {
    let mean = 0;
    for (let i = 0; i < n; i++) mean += x[r + i];
    mean /= n;
    let v = 0;
    for (let i = 0; i < n; i++) v += (x[r + i] - mean) ** 2;
    v /= n;
    for (let i = 0; i < n; i++) y[r + i] = (x[r + i] - mean) / Math.sqrt(v + eps);
  }
  return y;
}

function maxError(got, want) {
  let e = 0;
  for (let i = 0; i < want.length; i++) e = Math.max(e, Math.abs(got[i] - want[i]));
  return e;
}

test("normd Node client", async (t) => {
  const { proc, target } = await startNormd();
  const client = new Client(target, { timeoutMs: 30000 });
  t.after(() => { client.close(); proc.kill("SIGTERM"); });

  await t.test("layerNorm keeps the type and matches fp64", async () => {
    const x = Float32Array.from({ length: 24 }, (_, i) => Math.sin(i) * 10 + 3);
    const { data, shape } = await client.layerNorm(x, [4, 6]);
    assert.ok(data instanceof Float32Array);
    assert.deepEqual(shape, [4, 6]);
    assert.ok(maxError(data, layerNormRef(Float64Array.from(x), 6)) < 2e-6);
    const x64 = Float64Array.from(x);
    const y64 = await client.layerNorm(x64, [4, 6]);
    assert.ok(y64.data instanceof Float64Array);
    assert.ok(maxError(y64.data, layerNormRef(x64, 6)) < 1e-12);
  });

  await t.test("groupNorm, instanceNorm, rmsNorm and the BERT style match fp64", async () => {
    // [2, 4, 3], 2 groups of 2 channels: group rows are 6 contiguous values.
    const x = Float64Array.from({ length: 24 }, (_, i) => Math.cos(i) * 5 + i / 3);
    const g = await client.groupNorm(x, [2, 4, 3], 2);
    assert.ok(maxError(g.data, layerNormRef(x, 6)) < 1e-12);
    const inst = await client.instanceNorm(x, [2, 4, 3]);
    assert.ok(maxError(inst.data, layerNormRef(x, 3)) < 1e-12);
    const rms = await client.rmsNorm(x, [8, 3]);
    const want = new Float64Array(24);
    for (let r = 0; r < 24; r += 3) {
      const ms = (x[r] ** 2 + x[r + 1] ** 2 + x[r + 2] ** 2) / 3;
      for (let i = 0; i < 3; i++) want[r + i] = x[r + i] / Math.sqrt(ms + 1e-5);
    }
    assert.ok(maxError(rms.data, want) < 1e-12);
    const bert = await client.layerNorm(Float64Array.from([1, 3]), [1, 2], { style: "bert" });
    // mean 2, unbiased std sqrt(2): (x - 2) / (sqrt(2) + 1e-6).
    assert.ok(maxError(bert.data, [-1 / (Math.SQRT2 + 1e-6), 1 / (Math.SQRT2 + 1e-6)]) < 1e-15);
    const tracked = await client.instanceNorm(x, [2, 4, 3], { model: "node-inst", training: true });
    assert.ok(maxError(tracked.data, layerNormRef(x, 3)) < 1e-12);
    const state = await client.getModel("node-inst");
    assert.equal(state.numBatchesTracked, 0);  // As PyTorch's InstanceNorm.
    assert.equal(state.sampleCount, 6);
  });

  await t.test("16-bit tensors travel as bit patterns", async () => {
    // bfloat16 1.0 = 0x3f80, 3.0 = 0x4040; LayerNorm gives -1 and 1 exactly.
    const bf = await client.layerNorm(Uint16Array.from([0x3f80, 0x4040]), [1, 2],
      { dtype: "BFLOAT16" });
    assert.ok(bf.data instanceof Uint16Array);
    assert.deepEqual(Array.from(bf.data, (b) => halfToNumber(b, "BFLOAT16")), [-1, 1]);
    // float16 1.0 = 0x3c00, 2.0 = 0x4000: RMSNorm = x / sqrt(2.5 + 1e-5).
    const h = await client.rmsNorm(Uint16Array.from([0x3c00, 0x4000]), [1, 2],
      { dtype: "FLOAT16" });
    const got = Array.from(h.data, (b) => halfToNumber(b, "FLOAT16"));
    const scale = 1 / Math.sqrt(2.5 + 1e-5);
    assert.ok(maxError(got, [scale, 2 * scale]) <= 2 * scale * 2 ** -11);
    await assert.rejects(client.layerNorm(Uint16Array.from([1]), [1]), TypeError);
  });

  await t.test("l2Normalize and weightNorm match fp64", async () => {
    // Rows {3, 4} and {0, 0}: 0.6, 0.8, and a zero row kept zero.
    const l2 = await client.l2Normalize(Float64Array.from([3, 4, 0, 0]), [2, 2]);
    assert.ok(maxError(l2.data, [0.6, 0.8, 0, 0]) < 1e-15);
    // Over two dims: the block {1, 2, 2, 4} has norm 5.
    const block = await client.l2Normalize(Float32Array.from([1, 2, 2, 4]), [1, 2, 2],
      { normalizedNdim: 2 });
    assert.ok(block.data instanceof Float32Array);
    assert.ok(maxError(block.data, [0.2, 0.4, 0.4, 0.8]) < 1e-7);
    // v = [[3, 4], [0, 5]]: dim 0 row norms 5 and 5, g = [2, 10].
    const v = Float64Array.from([3, 4, 0, 5]);
    const rows = await client.weightNorm(v, [2, 2], { g: Float64Array.from([2, 10]) });
    assert.ok(maxError(rows.data, [1.2, 1.6, 0, 10]) < 1e-15);
    // dim 1 (and -1): column norms 3 and sqrt(41); without g, w = v.
    for (const dim of [1, -1]) {
      const cols = await client.weightNorm(v, [2, 2], { dim, g: Float64Array.from([1, 1]) });
      const r = Math.sqrt(41);
      assert.ok(maxError(cols.data, [1, 4 / r, 0, 5 / r]) < 1e-15);
    }
    const same = await client.weightNorm(v, [2, 2], { dim: 1 });
    assert.deepEqual(Array.from(same.data), Array.from(v));
    await assert.rejects(client.weightNorm(v, [2, 2], { g: Float64Array.from([1, 1, 1]) }),
      (e) => e.code === 3 && e.details.startsWith("weight.shape"));
  });

  await t.test("layerNorm with weight and bias over two dims", async () => {
    const x = Float64Array.from({ length: 12 }, (_, i) => i * i);
    const w = Float64Array.from({ length: 6 }, (_, i) => 1 + i);
    const b = Float64Array.from({ length: 6 }, (_, i) => -i);
    const { data } = await client.layerNorm(x, [2, 2, 3],
      { normalizedNdim: 2, weight: w, bias: b, eps: 1e-3 });
    const ref = layerNormRef(x, 6, 1e-3).map((v, i) => v * w[i % 6] + b[i % 6]);
    assert.ok(maxError(data, ref) < 1e-12);
  });

  await t.test("fit pools exactly, batchNorm uses the model", async () => {
    // Two batches of [3 rows, 2 channels].
    const batches = [[1, 10, 2, 20, 3, 30], [4, 40, 5, 50, 6, 60]];
    let state;
    for (const b of batches) state = await client.fit("node-model", Float64Array.from(b), [3, 2]);
    assert.equal(state.numBatchesTracked, 2);
    assert.equal(state.sampleCount, 6);
    assert.ok(maxError(state.mean, [3.5, 35]) < 1e-12);
    assert.ok(maxError(state.var, [35 / 12, 3500 / 12]) < 1e-9);
    // Eval with the running statistics: PyTorch momentum 0.1 updates from
    // mean 0 / var 1, unbiased batch variance (n = 3: var 1 and 100).
    let rm = [0, 0], rv = [1, 1];
    for (const b of batches) {
      for (let c = 0; c < 2; c++) {
        const v = [b[c], b[2 + c], b[4 + c]];
        const mean = (v[0] + v[1] + v[2]) / 3;
        const unbiased = v.reduce((s, x) => s + (x - mean) ** 2, 0) / 2;
        rm[c] = 0.9 * rm[c] + 0.1 * mean;
        rv[c] = 0.9 * rv[c] + 0.1 * unbiased;
      }
    }
    const x = Float32Array.from([1, 2, 3, 4]);
    const { data } = await client.batchNorm("node-model", x, [2, 2]);
    const want = [0, 1, 2, 3].map((i) => (x[i] - rm[i % 2]) / Math.sqrt(rv[i % 2] + 1e-5));
    assert.ok(data instanceof Float32Array);
    assert.ok(maxError(data, want) < 1e-5);
  });

  await t.test("drift against an explicit reference matches fp64", async () => {
    await client.createModel("node-drift", 2);
    const state = await client.setReference("node-drift", "explicit",
      { mean: [0, 1], var: [1, 4] });
    assert.equal(state.reference.source, "explicit");
    // 1200 rows of 2 channels: a ramp in each.
    const rows = 1200;
    const x = new Float64Array(rows * 2);
    for (let r = 0; r < rows; r++) {
      x[2 * r] = r / rows;
      x[2 * r + 1] = 3 - (2 * r) / rows;
    }
    await client.batchNorm("node-drift", x, [rows, 2]);
    const report = await client.drift("node-drift");
    assert.equal(report.referenceSource, "explicit");
    assert.equal(report.windowSamples, rows);
    const eps = 1e-5;
    const want = [0, 1].map((c) => {
      let mean = 0;
      for (let r = 0; r < rows; r++) mean += x[2 * r + c];
      mean /= rows;
      let v = 0;
      for (let r = 0; r < rows; r++) v += (x[2 * r + c] - mean) ** 2;
      v /= rows;
      const a = v + eps, b = [1, 4][c] + eps, d = mean - [0, 1][c];
      return 0.5 * (a / b + b / a - 2) + 0.5 * d * d * (1 / a + 1 / b);
    });
    assert.ok(maxError(report.kl, want) < 1e-9 * Math.max(...want));
    assert.ok(Math.abs(report.klMax - Math.max(...want)) < 1e-9 * report.klMax);
    const ranked = await client.drift();
    assert.ok(ranked.some((m) => m.name === "node-drift"));
    const cleared = await client.clearReference("node-drift");
    assert.equal(cleared.reference, null);
    assert.equal(await client.drift("node-drift"), null);
    await assert.rejects(client.setReference("node-drift", "explicit", { mean: [0], var: [1] }),
      (e) => e.code === status.INVALID_ARGUMENT && /mean/.test(e.details));
  });

  await t.test("models: create, list, reset, delete", async () => {
    const created = await client.createModel("node-created", 2,
      { momentum: null, runningMean: [1, 2], runningVar: [3, 4] });
    assert.equal(created.momentum, null);
    assert.deepEqual(Array.from(created.runningVar), [3, 4]);
    const names = (await client.listModels()).map((m) => m.name);
    assert.ok(names.includes("node-created") && names.includes("node-model"));
    // export -> import under a new name: the same state, bit for bit; a
    // merge of it into the copy doubles the counts and keeps mean and var.
    const exported = await client.exportModel("node-model");
    assert.equal(exported.pooledM2.length, 2);
    assert.ok(maxError(exported.pooledM2, [35 / 2, 3500 / 2]) < 1e-9);
    const copy = await client.importModel(exported, { name: "node-copy" });
    assert.equal(copy.name, "node-copy");
    assert.deepEqual(Array.from(copy.runningVar), Array.from(exported.runningVar));
    assert.deepEqual(Array.from(copy.var), Array.from(exported.var));
    await assert.rejects(client.importModel(exported, { name: "node-copy", createOnly: true }),
      (e) => e.code === status.ALREADY_EXISTS);
    const merged = await client.mergeModel("node-copy", exported);
    assert.equal(merged.sampleCount, 12);
    assert.equal(merged.numBatchesTracked, 4);
    assert.ok(maxError(merged.mean, [3.5, 35]) < 1e-12);
    assert.ok(maxError(merged.var, [35 / 12, 3500 / 12]) < 1e-9);
    await client.deleteModel("node-copy");
    const reset = await client.resetModel("node-model");
    assert.equal(reset.numBatchesTracked, 0);
    await client.deleteModel("node-model");
    await assert.rejects(client.getModel("node-model"),
      (e) => e instanceof NormdError && e.code === status.NOT_FOUND && /node-model/.test(e.details));
  });

  await t.test("errors carry the gRPC code and name the field", async () => {
    await assert.rejects(
      client.layerNorm(Float32Array.from([1, 2]), [2], { normalizedNdim: 3 }),
      (e) => e.code === status.INVALID_ARGUMENT && /normalized_ndim/.test(e.details));
    await assert.rejects(
      client.createModel("node-created", 2),
      (e) => e.code === status.ALREADY_EXISTS);
    await assert.rejects(client.layerNorm([1, 2], [2]), TypeError);
    await assert.rejects(client.layerNorm(new Float32Array(3), [2]), RangeError);
  });
});

test("a model's group is its name up to the first dot", () => {
  assert.equal(modelGroup("resnet.layer1.0.bn1"), "resnet");
  assert.equal(modelGroup("m"), "m");
  assert.equal(modelGroup("a-b.c"), "a-b");
});

test("x-normd-model and its group go with every call that names a model", async (t) => {
  const seen = [];
  const groups = [];
  const server = new grpc.Server();
  const record = (method, reply) => (call, callback) => {
    seen.push([method, call.metadata.get("x-normd-model")[0] ?? null]);
    groups.push(call.metadata.get("x-normd-group")[0] ?? null);
    callback(null, reply);
  };
  const proto = require("@grpc/proto-loader");
  const path = require("node:path");
  const def = proto.loadSync("normd/v1/normalizer.proto",
    { keepCase: true, includeDirs: [path.join(__dirname, "..", "..", "..", "proto")] });
  const v1 = grpc.loadPackageDefinition(def).normd.v1;
  server.addService(v1.Normalizer.service, {
    Normalize: record("Normalize", { output: { dtype: "FLOAT32", shape: [0] } }),
    Fit: record("Fit", { model: {} }),
    GetModel: record("GetModel", {}),
    ListModels: record("ListModels", { models: [] }),
    ExportModel: record("ExportModel", { name: "m4" }),
    ImportModel: record("ImportModel", {}),
    MergeModel: record("MergeModel", {}),
  });
  const port = await new Promise((resolve, reject) => server.bindAsync(
    "127.0.0.1:0", grpc.ServerCredentials.createInsecure(),
    (err, p) => (err ? reject(err) : resolve(p))));
  t.after(() => server.forceShutdown());
  const client = new Client(`127.0.0.1:${port}`);
  await client.batchNorm("m1", new Float32Array(0), [0, 1]);
  await client.fit("ck.layer1.bn", new Float32Array(0), [0, 1]);
  await client.getModel("m3");
  await client.layerNorm(new Float32Array(0), [0]);
  await client.listModels();
  await client.listModels("ck");
  const state = await client.exportModel("m4");
  await client.importModel(state);
  await client.importModel(state, { name: "ck.m5" });
  await client.mergeModel("m6", state);
  client.close();
  assert.deepEqual(seen, [["Normalize", "m1"], ["Fit", "ck.layer1.bn"], ["GetModel", "m3"],
    ["Normalize", null], ["ListModels", null], ["ListModels", null], ["ExportModel", "m4"],
    ["ImportModel", "m4"], ["ImportModel", "ck.m5"], ["MergeModel", "m6"]]);
  // The group: the name up to the first '.'; ListModels' from its filter.
  assert.deepEqual(groups, ["m1", "ck", "m3", null, null, "ck", "m4", "m4", "ck", "m6"]);
});

test("the Node block of docs/clients.md runs as written", async () => {
  const fs = require("node:fs");
  const path = require("node:path");
  const { execFile } = require("node:child_process");
  const page = fs.readFileSync(path.join(__dirname, "..", "..", "..", "docs", "clients.md"), "utf8");
  const section = page.slice(page.indexOf("## Node"), page.indexOf("## C++"));
  const code = /```js\n([\s\S]*?)```/.exec(section)[1];
  const { proc, target } = await startNormd();
  try {
    const program = code.replace("localhost:50051", target)
      .replace('require("normd")', `require(${JSON.stringify(path.join(__dirname, ".."))})`);
    // Twice: the example cleans up after itself.
    for (let run = 0; run < 2; run++) {
      const out = await new Promise((resolve, reject) => execFile(
        process.execPath, ["-e", program], (err, stdout, stderr) =>
          (err ? reject(new Error(stderr)) : resolve(stdout))));
      assert.equal(out, "Float32Array [ 2, 3 ] 1 [ 3, 4 ]\ntrue\n", `run ${run + 1}`);
    }
  } finally {
    proc.kill("SIGTERM");
  }
});
