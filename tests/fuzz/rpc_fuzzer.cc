// libFuzzer target over everything a request goes through: protobuf
// decoding, the raw (zero-copy) Normalize path with its hand-written wire
// reader over arbitrarily split slices, validation, the kernels and the
// model store. The first byte picks the RPC and how the bytes are split
// (0xf0 and above: ImportModel, MergeModel, ExportModel; 0xe0-0xef: the
// Open Inference Protocol's ModelMetadata and ModelInfer through its
// translation); the rest is the serialized request. Any crash, sanitizer
// report or broken invariant aborts:
// - normd's own wire reader (the raw paths) agrees with protobuf: bytes
//   protobuf refuses are refused, and bytes it accepts get the same status
//   and the same response, byte for byte;
// - a call that fails leaves every model as it was (bit for bit, generation
//   included);
// - a call that succeeds leaves what it says: a Fit adds its samples and at
//   most one batch and the stored model is the one answered, a created model is
//   stored as answered, a merge adds the counts.
#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "normd/v1/normalizer.pb.h"
#include "server/service/oip_models.h"
#include "tests/fuzz/service_fixture.h"

namespace {

using Fixture = normd::fuzzing::ServiceFixture;

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "rpc_fuzzer: %s\n", what);
    std::abort();
  }
}

// Every model's complete state, serialized in name order: equal strings,
// equal stores.
std::string StoreFingerprint(normd::NormalizerService& service) {
  normd::v1::ListModelsResponse list;
  (void)service.DoListModels(normd::v1::ListModelsRequest(), list);
  std::string bytes;
  for (const normd::v1::ModelState& listed : list.models()) {
    normd::v1::ExportModelRequest get;
    get.set_name(listed.name());
    normd::v1::ModelState state;
    Check(service.DoExportModel(get, state).ok(), "a listed model vanished");
    bytes += state.SerializeAsString();
  }
  return bytes;
}

// The stored state of `name`, or an empty one if there is none.
normd::v1::ModelState Stored(normd::NormalizerService& service,
                             const std::string& name) {
  normd::v1::ExportModelRequest get;
  get.set_name(name);
  normd::v1::ModelState state;
  if (!service.DoExportModel(get, state).ok()) state.Clear();
  return state;
}

std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string bytes;
  for (const auto& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

// `bytes` as a ByteBuffer of slices of `piece` bytes (the last shorter).
grpc::ByteBuffer Split(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    slices.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
  }
  if (slices.empty()) slices.emplace_back("", 0);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture;
  if (size < 1) return 0;
  const uint8_t selector = data[0];
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  normd::NormalizerService& service = fixture->service;
  if (selector >= 0xe0 && selector < 0xf0) {  // The Open Inference Protocol.
    // The raw path (split slices) and the protobuf path must agree on the
    // stateless models (the others may change between the two calls).
    grpc::ByteBuffer raw_response;
    const absl::Status raw = fixture->oip.DoModelInferRaw(
        Split(bytes, 1 + (selector & 0xf) * 7), raw_response);
    inference::ModelInferRequest request;
    if (!request.ParseFromString(bytes)) {
      Check(!raw.ok(), "the raw OIP reader took bytes protobuf refuses");
      return 0;
    }
    inference::ModelMetadataRequest metadata;
    metadata.set_name(request.model_name());
    metadata.set_version(request.model_version());
    inference::ModelMetadataResponse described;
    (void)fixture->oip.DoModelMetadata(metadata, described);
    const bool stateless =
        normd::BuiltinOipModel(request.model_name()).has_value();
    inference::ModelInferResponse reference;
    const absl::Status proto = fixture->oip.DoModelInfer(request, reference);
    if (!stateless) return 0;
    Check(raw.code() == proto.code(), "OIP raw and protobuf statuses differ");
    if (raw.ok()) {
      inference::ModelInferResponse parsed;
      Check(parsed.ParseFromString(Bytes(raw_response)) &&
                parsed.SerializeAsString() == reference.SerializeAsString(),
            "OIP raw and protobuf responses differ");
    }
    return 0;
  }
  const std::string before = StoreFingerprint(service);
  if (selector >= 0xf0) {  // The model-state RPCs.
    normd::v1::ModelState response;
    switch (selector & 3) {
      case 0: {  // ImportModel, then ExportModel of what it stored.
        normd::v1::ImportModelRequest request;
        if (!request.ParseFromString(bytes)) break;
        if (!service.DoImportModel(request, response).ok()) {
          Check(StoreFingerprint(service) == before,
                "a failed ImportModel changed the store");
          break;
        }
        normd::v1::ExportModelRequest get;
        get.set_name(response.name());
        Check(service.DoExportModel(get, response).ok(),
              "an imported model cannot be exported");
        break;
      }
      case 1: {  // MergeModel into a model that a Fit made.
        normd::v1::MergeModelRequest request;
        if (!request.ParseFromString(bytes)) break;
        const normd::v1::ModelState into = Stored(service, request.name());
        if (!service.DoMergeModel(request, response).ok()) {
          Check(StoreFingerprint(service) == before,
                "a failed MergeModel changed the store");
          break;
        }
        const normd::v1::ModelState& source = request.source();
        Check(
            response.num_batches_tracked() ==
                    into.num_batches_tracked() + source.num_batches_tracked() &&
                response.sample_count() ==
                    into.sample_count() + source.sample_count(),
            "MergeModel did not add the counts");
        break;
      }
      default: {  // ExportModel.
        normd::v1::ExportModelRequest request;
        if (!request.ParseFromString(bytes)) break;
        (void)service.DoExportModel(request, response);
        break;
      }
    }
  }
  switch (selector >= 0xf0 ? -1 : selector % 4) {
    case 0: {  // Normalize: raw path vs protobuf path must agree.
      grpc::ByteBuffer response;
      const size_t piece = 1 + (selector >> 2) * 7;
      const absl::Status raw =
          service.DoNormalizeRaw(Split(bytes, piece), response);
      normd::v1::NormalizeRequest request;
      if (!request.ParseFromString(bytes)) {
        Check(!raw.ok(),
              "the raw Normalize reader took bytes protobuf "
              "refuses");
        break;
      }
      // Training changes the model: compare on a copy of the request only
      // when it is stateless.
      if (request.training()) break;
      normd::v1::NormalizeResponse reference;
      const absl::Status proto = service.DoNormalize(request, reference);
      Check(raw.code() == proto.code(),
            "Normalize raw and protobuf statuses differ");
      if (raw.ok()) {
        normd::v1::NormalizeResponse parsed;
        Check(parsed.ParseFromString(Bytes(response)) &&
                  parsed.SerializeAsString() == reference.SerializeAsString(),
              "Normalize raw and protobuf responses differ");
      }
      Check(StoreFingerprint(service) == before,
            "an eval or stateless Normalize changed the store");
      break;
    }
    case 1: {  // Fit: one more batch, stored as answered.
      normd::v1::FitRequest request;
      if (!request.ParseFromString(bytes)) break;
      const normd::v1::ModelState prior = Stored(service, request.model());
      normd::v1::FitResponse response;
      if (!service.DoFit(request, response).ok()) {
        Check(StoreFingerprint(service) == before,
              "a failed Fit changed the store");
        break;
      }
      const normd::v1::ModelState stored = Stored(service, request.model());
      // One batch more (none when it had one value per channel, which only
      // the pooled statistics take), more samples, stored as answered.
      const int64_t batches =
          stored.num_batches_tracked() - prior.num_batches_tracked();
      Check((batches == 0 || batches == 1) &&
                stored.sample_count() > prior.sample_count() &&
                stored.generation() > prior.generation() &&
                stored.generation() == response.model().generation() &&
                stored.num_batches_tracked() ==
                    response.model().num_batches_tracked(),
            "a Fit did not leave the stored model it answered");
      break;
    }
    case 2: {  // CreateModel, then Get / Reset / Delete of that name.
      normd::v1::CreateModelRequest request;
      if (!request.ParseFromString(bytes)) break;
      normd::v1::ModelState state;
      if (service.DoCreateModel(request, state).ok()) {
        const normd::v1::ModelState stored = Stored(service, request.name());
        Check(stored.num_features() == state.num_features() &&
                  stored.generation() == state.generation(),
              "a created model is not stored as answered");
      } else {
        Check(StoreFingerprint(service) == before,
              "a failed CreateModel changed the store");
      }
      normd::v1::GetModelRequest get;
      get.set_name(request.name());
      (void)service.DoGetModel(get, state);
      normd::v1::ResetModelRequest reset;
      reset.set_name(request.name());
      (void)service.DoResetModel(reset, state);
      if (selector & 0x80) {
        normd::v1::DeleteModelRequest remove;
        remove.set_name(request.name());
        normd::v1::DeleteModelResponse removed;
        (void)service.DoDeleteModel(remove, removed);
      }
      break;
    }
    case 3: {  // A training Normalize (changes models only if it succeeds).
      normd::v1::NormalizeRequest request;
      if (!request.ParseFromString(bytes)) break;
      normd::v1::NormalizeResponse response;
      if (!service.DoNormalize(request, response).ok()) {
        Check(StoreFingerprint(service) == before,
              "a failed Normalize changed the store");
      }
      break;
    }
  }
  // Keep the store small so that iterations stay fast.
  if (fixture->engine.store().size() > 32) {
    for (const auto& m : fixture->engine.store().List()) {
      (void)fixture->engine.store().Delete(m.name);
    }
  }
  return 0;
}
