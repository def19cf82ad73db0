// libFuzzer target over everything a request goes through: protobuf
// decoding, the raw (zero-copy) Normalize path with its hand-written wire
// reader over arbitrarily split slices, validation, the kernels and the
// model store. The first byte picks the RPC and how the bytes are split
// (0xf0 and above: ImportModel, MergeModel, ExportModel; 0xe0-0xef: the
// Open Inference Protocol's ModelMetadata and ModelInfer through its
// translation); the rest is the serialized request. Any crash, sanitizer report
// or inconsistency between the raw and protobuf paths is a bug.
#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "normd/v1/normalizer.pb.h"
#include "server/service/oip_models.h"
#include "tests/fuzz/service_fixture.h"

namespace {

using Fixture = normd::fuzzing::ServiceFixture;

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
    if (!request.ParseFromString(bytes)) return 0;
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
    if (raw.code() != proto.code()) std::abort();
    if (raw.ok()) {
      std::vector<grpc::Slice> slices;
      (void)raw_response.Dump(&slices);
      std::string raw_bytes;
      for (const auto& s : slices) {
        raw_bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
      inference::ModelInferResponse parsed;
      if (!parsed.ParseFromString(raw_bytes) ||
          parsed.SerializeAsString() != reference.SerializeAsString()) {
        std::abort();
      }
    }
    return 0;
  }
  if (selector >= 0xf0) {  // The model-state RPCs.
    normd::v1::ModelState response;
    switch (selector & 3) {
      case 0: {  // ImportModel, then ExportModel of what it stored.
        normd::v1::ImportModelRequest request;
        if (!request.ParseFromString(bytes)) break;
        if (!service.DoImportModel(request, response).ok()) break;
        normd::v1::ExportModelRequest get;
        get.set_name(response.name());
        if (!service.DoExportModel(get, response).ok()) std::abort();
        break;
      }
      case 1: {  // MergeModel into a model that a Fit made.
        normd::v1::MergeModelRequest request;
        if (!request.ParseFromString(bytes)) break;
        (void)service.DoMergeModel(request, response);
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
      if (!request.ParseFromString(bytes)) break;
      // Training changes the model: compare on a copy of the request only
      // when it is stateless.
      if (request.mode() == normd::v1::BATCH_NORM && request.training()) break;
      normd::v1::NormalizeResponse reference;
      const absl::Status proto = service.DoNormalize(request, reference);
      if (raw.code() != proto.code()) std::abort();
      if (raw.ok()) {
        std::vector<grpc::Slice> slices;
        (void)response.Dump(&slices);
        std::string raw_bytes;
        for (const auto& s : slices) {
          raw_bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
        }
        normd::v1::NormalizeResponse parsed;
        if (!parsed.ParseFromString(raw_bytes) ||
            parsed.output().data() != reference.output().data() ||
            parsed.output().values_size() != reference.output().values_size()) {
          std::abort();
        }
      }
      break;
    }
    case 1: {  // Fit.
      normd::v1::FitRequest request;
      if (!request.ParseFromString(bytes)) break;
      normd::v1::FitResponse response;
      (void)service.DoFit(request, response);
      break;
    }
    case 2: {  // CreateModel, then Get / Reset / Delete of that name.
      normd::v1::CreateModelRequest request;
      if (!request.ParseFromString(bytes)) break;
      normd::v1::ModelState state;
      (void)service.DoCreateModel(request, state);
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
    case 3: {  // A training Normalize (changes models).
      normd::v1::NormalizeRequest request;
      if (!request.ParseFromString(bytes)) break;
      normd::v1::NormalizeResponse response;
      (void)service.DoNormalize(request, response);
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
