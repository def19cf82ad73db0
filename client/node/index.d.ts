// Types of the normd Node client (index.js).
import type { ChannelCredentials, status as grpcStatus } from "@grpc/grpc-js";

/** Float arrays, or bfloat16 / float16 bit patterns (with options.dtype). */
export type Floats = Float32Array | Float64Array | Uint16Array;
export type HalfDType = "BFLOAT16" | "FLOAT16";
export interface Tensor<T extends Floats = Floats> { data: T; shape: number[]; }

export type ReferenceSource = "running" | "pooled" | "explicit" | "checkpoint";
/** A model's drift reference; mean and var are empty in listModels. */
export interface Reference {
  source: ReferenceSource; setUnixNanos: number; mean: Float64Array; var: Float64Array;
}
/** Drift against the reference; the measures are null below --drift_min_samples. */
export interface DriftReport {
  referenceSource: ReferenceSource; referenceSetUnixNanos: number;
  windowSamples: number; windowSeconds: number;
  klMax: number | null; klMean: number | null; shiftMax: number | null;
  channelsDrifted: number | null;
  /** Per channel (getModel only). */
  kl: Float64Array; shift: Float64Array;
}

export interface ModelState {
  name: string; numFeatures: number; momentum: number | null; eps: number;
  usePooledStatistics: boolean; numBatchesTracked: number; sampleCount: number;
  runningMean: Float64Array; runningVar: Float64Array; mean: Float64Array;
  var: Float64Array; weight: Float64Array; bias: Float64Array; generation: number;
  /** Exact pooled sums of squared deviations; filled by exportModel only. */
  pooledM2: Float64Array;
  reference: Reference | null;
  /** getModel and listModels. */
  drift: DriftReport | null;
}

export interface ClientOptions {
  credentials?: ChannelCredentials; token?: string; timeoutMs?: number;
  channelOptions?: Record<string, unknown>;
}
export interface AffineOptions {
  weight?: Floats; bias?: Floats; eps?: number;
  /** Required when data is a Uint16Array of 16-bit bit patterns. */
  dtype?: HalfDType;
}

export class NormdError extends Error { code: number; details: string; }

export class Client {
  constructor(target: string, options?: ClientOptions);
  close(): void;
  layerNorm<T extends Floats>(data: T, shape: number[],
    options?: AffineOptions & { normalizedNdim?: number; style?: "pytorch" | "bert" }): Promise<Tensor<T>>;
  rmsNorm<T extends Floats>(data: T, shape: number[],
    options?: AffineOptions & { normalizedNdim?: number }): Promise<Tensor<T>>;
  l2Normalize<T extends Floats>(data: T, shape: number[],
    options?: { normalizedNdim?: number; eps?: number; dtype?: HalfDType }): Promise<Tensor<T>>;
  weightNorm<T extends Floats>(data: T, shape: number[],
    options?: { dim?: number; g?: Floats; dtype?: HalfDType }): Promise<Tensor<T>>;
  groupNorm<T extends Floats>(data: T, shape: number[], numGroups: number,
    options?: AffineOptions & { channelAxis?: number }): Promise<Tensor<T>>;
  instanceNorm<T extends Floats>(data: T, shape: number[],
    options?: AffineOptions & { channelAxis?: number; model?: string; training?: boolean }): Promise<Tensor<T>>;
  batchNorm<T extends Floats>(model: string, data: T, shape: number[],
    options?: AffineOptions & { training?: boolean; channelAxis?: number }): Promise<Tensor<T>>;
  fit(model: string, data: Floats, shape: number[],
    options?: { channelAxis?: number; dtype?: HalfDType }): Promise<ModelState>;
  createModel(name: string, numFeatures: number, options?: {
    momentum?: number | null; eps?: number; runningMean?: ArrayLike<number>;
    runningVar?: ArrayLike<number>; weight?: ArrayLike<number>; bias?: ArrayLike<number>;
    numBatchesTracked?: number; usePooledStatistics?: boolean; }): Promise<ModelState>;
  getModel(name: string): Promise<ModelState>;
  /** Every model, or only the models `group` and `group.*`. */
  listModels(group?: string): Promise<ModelState[]>;
  deleteModel(name: string): Promise<void>;
  resetModel(name: string): Promise<ModelState>;
  exportModel(name: string): Promise<ModelState>;
  importModel(state: ModelState, options?: { name?: string; createOnly?: boolean }):
    Promise<ModelState>;
  mergeModel(name: string, source: ModelState): Promise<ModelState>;
  setReference(name: string, source?: "running" | "pooled" | "explicit",
    options?: { mean?: ArrayLike<number>; var?: ArrayLike<number> }): Promise<ModelState>;
  clearReference(name: string): Promise<ModelState>;
  drift(name: string): Promise<DriftReport | null>;
  drift(): Promise<{ name: string; drift: DriftReport }[]>;
}

/** The number a bfloat16 / float16 bit pattern stands for. */
export function halfToNumber(bits: number, dtype: HalfDType): number;
/** A model's group, its name up to the first ".": what a sharding proxy routes by. */
export function modelGroup(name: string): string;
export const status: typeof grpcStatus;
export { credentials } from "@grpc/grpc-js";
