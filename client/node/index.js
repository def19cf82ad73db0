// Node.js client for normd: typed arrays in, typed arrays out, over gRPC
// (@grpc/grpc-js, the .proto loaded at run time by @grpc/proto-loader).
//
//   const { Client } = require("normd");
//   const client = new Client("localhost:50051");
//   const { data, shape } = await client.layerNorm(new Float32Array([1, 2, 3]), [1, 3]);
//
// Every method returns a Promise; failures reject with a NormdError whose
// `code` is the gRPC status code (grpc.status) and `details` the server's
// message naming the field. Calls that name a model send it as the
// x-normd-model header and its group (modelGroup) as x-normd-group, for
// proxies that route by group.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

// The API definition: the copy packed with the module, else the repository's.
function protoRoot() {
  const candidates = [
    process.env.NORMD_PROTO_DIR,
    path.join(__dirname, "proto"),
    path.join(__dirname, "..", "..", "proto"),
  ].filter(Boolean);
  for (const dir of candidates) {
    if (fs.existsSync(path.join(dir, "normd", "v1", "normalizer.proto"))) {
      return dir;
    }
  }
  throw new Error(`normd: normalizer.proto not found in ${candidates}`);
}

const definition = protoLoader.loadSync("normd/v1/normalizer.proto", {
  keepCase: true, // field names as in the .proto (snake_case)
  includeDirs: [protoRoot()],
  longs: Number, // counts and generations fit in a double's 53 bits
  enums: String,
  defaults: true,
  oneofs: true,
});
const v1 = grpc.loadPackageDefinition(definition).normd.v1;

const DTYPES = {
  FLOAT32: { array: Float32Array, bytes: 4 },
  FLOAT64: { array: Float64Array, bytes: 8 },
  // 16-bit tensors travel as their bit patterns in a Uint16Array.
  BFLOAT16: { array: Uint16Array, bytes: 2 },
  FLOAT16: { array: Uint16Array, bytes: 2 },
};

/** A call normd (or gRPC) refused. */
class NormdError extends Error {
  constructor(code, details) {
    const name = Object.keys(grpc.status).find((k) => grpc.status[k] === code);
    super(`${name ?? code}: ${details}`);
    this.name = "NormdError";
    this.code = code;
    this.details = details;
  }
}

function dtypeOf(data, field, half) {
  if (data instanceof Float32Array) return "FLOAT32";
  if (data instanceof Float64Array) return "FLOAT64";
  if (data instanceof Uint16Array && (half === "BFLOAT16" || half === "FLOAT16")) {
    return half;
  }
  throw new TypeError(`${field}: expected a Float32Array, a Float64Array, or a ` +
                      `Uint16Array of bits with options.dtype "BFLOAT16" or "FLOAT16"`);
}

/** The number a bfloat16 / float16 bit pattern stands for. */
function halfToNumber(bits, dtype) {
  if (dtype === "BFLOAT16") {
    return new Float32Array(new Uint32Array([bits << 16]).buffer)[0];
  }
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 31;
  const mantissa = bits & 1023;
  if (exponent === 31) return mantissa ? NaN : sign * Infinity;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  return sign * (1024 + mantissa) * 2 ** (exponent - 25);
}

function toTensor(data, shape, field, half) {
  const dtype = dtypeOf(data, field, half);
  if (!Array.isArray(shape) || shape.some((d) => !Number.isInteger(d) || d < 0)) {
    throw new TypeError(`${field}: shape must be an array of non-negative integers`);
  }
  const count = shape.reduce((a, b) => a * b, 1);
  if (count !== data.length) {
    throw new RangeError(
      `${field}: shape [${shape}] has ${count} elements but the array has ${data.length}`);
  }
  // Typed arrays are little-endian on every platform Node runs on in practice;
  // the wire format is little-endian.
  const tensor = { dtype, shape };
  if (count > 0) tensor.data = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  return tensor;
}

function fromTensor(tensor) {
  const { array, bytes } = DTYPES[tensor.dtype] ?? DTYPES.FLOAT32;
  const shape = tensor.shape.map(Number);
  if (tensor.values && tensor.values.length) {
    return { data: array.from(tensor.values), shape };
  }
  const raw = tensor.data ?? Buffer.alloc(0);
  // Copy into an aligned buffer of its own.
  const data = new array(raw.length / bytes);
  new Uint8Array(data.buffer).set(raw);
  return { data, shape };
}

/**
 * A model's group: its name up to the first '.' (the whole name if none).
 * A sharding proxy routes by it, so that a checkpoint's models
 * `prefix.<layer>` share a replica.
 */
function modelGroup(name) {
  const dot = name.indexOf(".");
  return dot < 0 ? name : name.slice(0, dot);
}

const SOURCES = ["unspecified", "running", "pooled", "explicit", "checkpoint"];

// "REFERENCE_RUNNING" (the enum as a string) -> "running".
function sourceName(source) {
  return String(source).replace(/^REFERENCE_/, "").toLowerCase();
}

/** A drift reference (see the .proto's DriftReference), or null. */
function reference(r) {
  if (!r) return null;
  return {
    source: sourceName(r.source),
    setUnixNanos: Number(r.set_unix_nanos),
    mean: Float64Array.from(r.mean),
    var: Float64Array.from(r.var),
  };
}

// The measures are null while the window is below --drift_min_samples.
function driftReport(d) {
  if (!d) return null;
  const measured = d.kl_max !== undefined && d.kl_max !== null;
  return {
    referenceSource: sourceName(d.reference_source),
    referenceSetUnixNanos: Number(d.reference_set_unix_nanos),
    windowSamples: Number(d.window_samples),
    windowSeconds: Number(d.window_seconds),
    klMax: measured ? d.kl_max : null,
    klMean: measured ? d.kl_mean : null,
    shiftMax: measured ? d.shift_max : null,
    channelsDrifted: measured ? Number(d.channels_drifted) : null,
    kl: Float64Array.from(d.kl),
    shift: Float64Array.from(d.shift),
  };
}

/** A model's configuration and statistics (see the .proto's ModelState). */
function modelState(m) {
  return {
    name: m.name,
    numFeatures: Number(m.num_features),
    momentum: m.cumulative_average ? null : m.momentum,
    eps: m.eps,
    usePooledStatistics: m.use_pooled_statistics,
    numBatchesTracked: Number(m.num_batches_tracked),
    sampleCount: Number(m.sample_count),
    runningMean: Float64Array.from(m.running_mean),
    runningVar: Float64Array.from(m.running_var),
    mean: Float64Array.from(m.mean),
    var: Float64Array.from(m.var),
    weight: Float64Array.from(m.weight),
    bias: Float64Array.from(m.bias),
    generation: Number(m.generation),
    pooledM2: Float64Array.from(m.pooled_m2 ?? []),
    reference: reference(m.reference),
    drift: driftReport(m.drift),
  };
}

// A modelState() object back in the wire form (ImportModel, MergeModel).
function modelStateMessage(s) {
  return {
    name: s.name,
    num_features: s.numFeatures,
    momentum: s.momentum ?? 0,
    cumulative_average: s.momentum === null,
    eps: s.eps,
    use_pooled_statistics: s.usePooledStatistics,
    num_batches_tracked: s.numBatchesTracked,
    sample_count: s.sampleCount,
    running_mean: Array.from(s.runningMean),
    running_var: Array.from(s.runningVar),
    mean: Array.from(s.mean),
    var: Array.from(s.var),
    weight: Array.from(s.weight),
    bias: Array.from(s.bias),
    generation: s.generation,
    pooled_m2: Array.from(s.pooledM2 ?? []),
    reference: s.reference ? {
      source: SOURCES.indexOf(s.reference.source),
      set_unix_nanos: s.reference.setUnixNanos,
      mean: Array.from(s.reference.mean),
      var: Array.from(s.reference.var),
    } : null,
  };
}

/**
 * A connection to one normd server; safe to share between concurrent calls.
 * options: credentials (grpc.credentials.createSsl(...) for TLS; default
 * plaintext), token (bearer token for --auth_token_file), timeoutMs (per-call
 * deadline; default none), channelOptions (extra grpc-js channel options).
 */
class Client {
  constructor(target, options = {}) {
    const limit = 64 << 20;
    this._stub = new v1.Normalizer(
      target, options.credentials ?? grpc.credentials.createInsecure(), {
        "grpc.max_send_message_length": limit,
        "grpc.max_receive_message_length": limit,
        ...options.channelOptions,
      });
    this._token = options.token;
    this._timeoutMs = options.timeoutMs;
  }

  close() {
    this._stub.close();
  }

  // `model` sends x-normd-model and its group; `group` alone the group.
  _call(method, request, model, group) {
    const metadata = new grpc.Metadata();
    if (model) metadata.set("x-normd-model", model);
    const routedGroup = model ? modelGroup(model) : group;
    if (routedGroup) metadata.set("x-normd-group", routedGroup);
    if (this._token !== undefined) metadata.set("authorization", `Bearer ${this._token}`);
    const callOptions = {};
    if (this._timeoutMs !== undefined) {
      callOptions.deadline = new Date(Date.now() + this._timeoutMs);
    }
    return new Promise((resolve, reject) => {
      this._stub[method](request, metadata, callOptions, (err, response) => {
        if (err) reject(new NormdError(err.code, err.details ?? err.message));
        else resolve(response);
      });
    });
  }

  static _affine(request, options) {
    if (options.weight) {
      request.weight = toTensor(options.weight, [options.weight.length], "weight", options.dtype);
    }
    if (options.bias) {
      request.bias = toTensor(options.bias, [options.bias.length], "bias", options.dtype);
    }
    if (options.eps !== undefined) request.eps = options.eps;
    return request;
  }

  // Every normalization takes data as a Float32Array or Float64Array, or a
  // Uint16Array of bfloat16 / float16 bits with options.dtype "BFLOAT16" /
  // "FLOAT16", and resolves to { data, shape } of the same type (16-bit:
  // bits; decode with halfToNumber).

  /**
   * LayerNorm over the last `normalizedNdim` dims (default 1). options:
   * normalizedNdim, weight, bias (typed arrays over the normalized dims,
   * flattened), eps. Resolves to { data, shape } of the input's type.
   */
  async layerNorm(data, shape, options = {}) {
    if (options.style !== undefined && !["pytorch", "bert"].includes(options.style)) {
      throw new TypeError(`style: expected "pytorch" or "bert", got ${options.style}`);
    }
    return this._rows("LAYER_NORM", data, shape, options);
  }

  /**
   * RMSNorm over the last `normalizedNdim` dims: x / sqrt(mean(x^2) + eps)
   * * weight (+ bias). options as layerNorm (no style).
   */
  async rmsNorm(data, shape, options = {}) {
    return this._rows("RMS_NORM", data, shape, options);
  }

  /**
   * L2 normalization (torch.nn.functional.normalize, p = 2) over the last
   * `normalizedNdim` dims: x / max(||x||, eps), eps default 1e-12; a zero
   * row stays zero. options: normalizedNdim (default 1), eps, dtype.
   */
  async l2Normalize(data, shape, options = {}) {
    const request = {
      mode: "L2_NORM",
      input: toTensor(data, shape, "x", options.dtype),
      normalized_ndim: options.normalizedNdim ?? 1,
    };
    if (options.eps !== undefined) request.eps = options.eps;
    return fromTensor((await this._call("Normalize", request)).output);
  }

  /**
   * The weight torch.nn.utils.weight_norm computes: g * v / ||v||, the norm
   * over every dim but options.dim (PyTorch's dim, default 0; negative
   * counts from the end). options.g: one value per slice (a typed array of
   * v's type, or Float64Array); without it the result is v. A slice whose
   * norm is 0 gives NaN, as PyTorch. options.dtype as the other modes.
   */
  async weightNorm(data, shape, options = {}) {
    const request = Client._affine({
      mode: "WEIGHT_NORM",
      input: toTensor(data, shape, "v", options.dtype),
      channel_axis: options.dim ?? 0,
    }, { weight: options.g, dtype: options.dtype });
    return fromTensor((await this._call("Normalize", request)).output);
  }

  async _rows(mode, data, shape, options) {
    const k = options.normalizedNdim ?? 1;
    const request = Client._affine({
      mode,
      input: toTensor(data, shape, "x", options.dtype),
      normalized_ndim: k,
      layer_norm_style: options.style === "bert" ? "BERT_UNBIASED_STD" : "PYTORCH",
    }, options);
    if (options.weight) request.weight.shape = shape.slice(shape.length - k);
    if (options.bias) request.bias.shape = shape.slice(shape.length - k);
    return fromTensor((await this._call("Normalize", request)).output);
  }

  /**
   * GroupNorm: statistics per (sample, group of C / numGroups channels).
   * options: channelAxis (default 1; -1 = channels-last), weight, bias (C
   * values), eps, dtype.
   */
  async groupNorm(data, shape, numGroups, options = {}) {
    const request = Client._affine({
      mode: "GROUP_NORM",
      input: toTensor(data, shape, "x", options.dtype),
      num_groups: numGroups,
      channel_axis: options.channelAxis ?? 1,
    }, options);
    return fromTensor((await this._call("Normalize", request)).output);
  }

  /**
   * InstanceNorm: statistics per (sample, channel). With options.model, on
   * that model's running statistics (PyTorch track_running_stats=True):
   * options.training true normalizes with the instance statistics and
   * updates them, false uses them. Other options as groupNorm.
   */
  async instanceNorm(data, shape, options = {}) {
    const request = Client._affine({
      mode: "INSTANCE_NORM",
      model: options.model ?? "",
      input: toTensor(data, shape, "x", options.dtype),
      training: Boolean(options.training),
      channel_axis: options.channelAxis ?? 1,
    }, options);
    return fromTensor((await this._call("Normalize", request, options.model)).output);
  }

  /**
   * BatchNorm with model `model`'s statistics (training false, like eval()),
   * or with the batch's own, updating the model (training true). options:
   * training, channelAxis (default 1; -1 = channels-last), weight, bias, eps.
   */
  async batchNorm(model, data, shape, options = {}) {
    const request = Client._affine({
      mode: "BATCH_NORM",
      model,
      input: toTensor(data, shape, "x", options.dtype),
      training: Boolean(options.training),
      channel_axis: options.channelAxis ?? 1,
    }, options);
    return fromTensor((await this._call("Normalize", request, model)).output);
  }

  /** Folds a batch into model `model` (created if new); the model after. */
  async fit(model, data, shape, options = {}) {
    const response = await this._call("Fit", {
      model,
      input: toTensor(data, shape, "x", options.dtype),
      channel_axis: options.channelAxis ?? 1,
    }, model);
    return modelState(response.model);
  }

  /**
   * Creates a model. options: momentum (null = cumulative average; default
   * 0.1), eps, runningMean, runningVar, weight, bias (arrays of numFeatures
   * numbers), numBatchesTracked, usePooledStatistics.
   */
  async createModel(name, numFeatures, options = {}) {
    const request = {
      name,
      num_features: numFeatures,
      running_mean: Array.from(options.runningMean ?? []),
      running_var: Array.from(options.runningVar ?? []),
      weight: Array.from(options.weight ?? []),
      bias: Array.from(options.bias ?? []),
      num_batches_tracked: options.numBatchesTracked ?? 0,
      use_pooled_statistics: Boolean(options.usePooledStatistics),
    };
    if (options.momentum === null) request.cumulative_average = true;
    else if (options.momentum !== undefined) request.momentum = options.momentum;
    if (options.eps !== undefined) request.eps = options.eps;
    return modelState(await this._call("CreateModel", request, name));
  }

  async getModel(name) {
    return modelState(await this._call("GetModel", { name }, name));
  }

  /**
   * Every model, or with `group` only the models `group` and `group.*`
   * (routed to the replica that holds them behind a sharding proxy); without
   * the per-channel arrays.
   */
  async listModels(group) {
    return (await this._call("ListModels", { group: group ?? "" }, undefined, group))
      .models.map(modelState);
  }

  async deleteModel(name) {
    await this._call("DeleteModel", { name }, name);
  }

  async resetModel(name) {
    return modelState(await this._call("ResetModel", { name }, name));
  }

  /** The model's complete state (with pooledM2), for importModel / mergeModel. */
  async exportModel(name) {
    return modelState(await this._call("ExportModel", { name }, name));
  }

  /**
   * Creates or replaces a model from an exported state. options: name (import
   * under another name), createOnly (ALREADY_EXISTS instead of replacing).
   */
  async importModel(state, options = {}) {
    const request = {
      model: modelStateMessage(state),
      name: options.name ?? "",
      create_only: options.createOnly ?? false,
    };
    return modelState(await this._call("ImportModel", request, options.name || state.name));
  }

  /**
   * Sets model `name`'s drift reference: its running statistics as they are
   * now ("running"), its exact pooled ones ("pooled"), or options.mean and
   * options.var ("explicit"). Its inputs are then compared with it (drift()).
   */
  async setReference(name, source = "running", options = {}) {
    const index = ["running", "pooled", "explicit"].indexOf(source);
    if (index < 0) throw new RangeError(`source: ${source} is not running, pooled or explicit`);
    const request = { model: name, source: index + 1 };
    if (source === "explicit") {
      request.mean = Array.from(options.mean ?? []);
      request.var = Array.from(options.var ?? []);
    }
    return modelState(await this._call("SetReference", request, name));
  }

  /** Removes model `name`'s drift reference. */
  async clearReference(name) {
    return modelState(await this._call("ClearReference", { model: name }, name));
  }

  /**
   * Model `name`'s drift report (null without a reference); without a name,
   * [{ name, drift }] for every model with a reference, the largest klMax
   * first (those without measures last).
   */
  async drift(name) {
    if (name !== undefined) return (await this.getModel(name)).drift;
    const models = (await this.listModels()).filter((m) => m.drift !== null);
    models.sort((a, b) => (b.drift.klMax ?? -1) - (a.drift.klMax ?? -1));
    return models.map((m) => ({ name: m.name, drift: m.drift }));
  }

  /** Folds an exported state into model `name`. */
  async mergeModel(name, source) {
    const request = { name, source: modelStateMessage(source) };
    return modelState(await this._call("MergeModel", request, name));
  }
}

module.exports = {
  Client, NormdError, halfToNumber, modelGroup, status: grpc.status, credentials: grpc.credentials,
};
