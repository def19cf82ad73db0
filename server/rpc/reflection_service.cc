#include "server/rpc/reflection_service.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "server/rpc/answering_stream.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_message.h"

namespace normd {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::DescriptorPool;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::FileDescriptor;
using ::grpc::reflection::v1alpha::ServerReflectionRequest;
using ::grpc::reflection::v1alpha::ServerReflectionResponse;

void SetError(grpc::StatusCode code, const std::string& message,
              ServerReflectionResponse& response) {
  response.mutable_error_response()->set_error_code(code);
  response.mutable_error_response()->set_error_message(message);
}

// One stream: answers each request in turn. Files already sent on the
// stream are not sent again (the protocol allows it; clients cache them).
class ReflectionReactor final : public AnsweringStream {
 public:
  ReflectionReactor(const std::vector<std::string>& services,
                    const grpc::CallbackServerContext& context,
                    const std::string& auth_token, StreamWatchdog& watchdog)
      : AnsweringStream(watchdog), services_(services) {
    if (absl::Status s = CheckBearerToken(AuthorizationOf(context), auth_token,
                                          kGrpcTokenCarrier);
        !s.ok()) {
      FinishOnce(s);
      return;
    }
    Start();
  }

 private:
  void Answer(const grpc::ByteBuffer& raw_request) override {
    ServerReflectionRequest request;
    ServerReflectionResponse response;
    if (absl::Status s = ParseMessage(raw_request, request); !s.ok()) {
      SetError(grpc::StatusCode::INVALID_ARGUMENT, std::string(s.message()),
               response);
    } else {
      Answer(request, response);
    }
    Reply(response);
  }

  void Answer(const ServerReflectionRequest& request,
              ServerReflectionResponse& response) {
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    const DescriptorPool& pool = *DescriptorPool::generated_pool();
    switch (request.message_request_case()) {
      case ServerReflectionRequest::kListServices:
        for (const std::string& name : services_) {
          response.mutable_list_services_response()->add_service()->set_name(
              name);
        }
        return;
      case ServerReflectionRequest::kFileByFilename:
        AddFile(pool.FindFileByName(request.file_by_filename()),
                "File not found.", response);
        return;
      case ServerReflectionRequest::kFileContainingSymbol:
        AddFile(pool.FindFileContainingSymbol(request.file_containing_symbol()),
                "Symbol not found.", response);
        return;
      case ServerReflectionRequest::kFileContainingExtension: {
        const Descriptor* type = pool.FindMessageTypeByName(
            request.file_containing_extension().containing_type());
        if (type == nullptr) {
          SetError(grpc::StatusCode::NOT_FOUND, "Type not found.", response);
          return;
        }
        const FieldDescriptor* extension = pool.FindExtensionByNumber(
            type, request.file_containing_extension().extension_number());
        AddFile(extension == nullptr ? nullptr : extension->file(),
                "Extension not found.", response);
        return;
      }
      case ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const Descriptor* type =
            pool.FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr) {
          SetError(grpc::StatusCode::NOT_FOUND, "Type not found.", response);
          return;
        }
        std::vector<const FieldDescriptor*> extensions;
        pool.FindAllExtensions(type, &extensions);
        auto* numbers = response.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(type->full_name());
        for (const FieldDescriptor* e : extensions) {
          numbers->add_extension_number(e->number());
        }
        return;
      }
      case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        break;
    }
    SetError(grpc::StatusCode::UNIMPLEMENTED,
             "set one of file_by_filename, file_containing_symbol, "
             "file_containing_extension, all_extension_numbers_of_type, "
             "list_services",
             response);
  }

  // `file` and every file it imports, transitively, that this stream has
  // not sent yet; the error `not_found` if `file` is null.
  void AddFile(const FileDescriptor* file, const std::string& not_found,
               ServerReflectionResponse& response) {
    if (file == nullptr) {
      SetError(grpc::StatusCode::NOT_FOUND, not_found, response);
      return;
    }
    auto* files = response.mutable_file_descriptor_response();
    std::vector<const FileDescriptor*> pending = {file};
    while (!pending.empty()) {
      const FileDescriptor* next = pending.back();
      pending.pop_back();
      if (!sent_.insert(next->name()).second) continue;
      google::protobuf::FileDescriptorProto proto;
      next->CopyTo(&proto);
      proto.SerializeToString(files->add_file_descriptor_proto());
      for (int i = 0; i < next->dependency_count(); ++i) {
        pending.push_back(next->dependency(i));
      }
    }
  }

  const std::vector<std::string>& services_;
  absl::flat_hash_set<std::string> sent_;
};

}  // namespace

ReflectionService::ReflectionService(std::vector<std::string> services,
                                     std::string auth_token,
                                     StreamWatchdog& watchdog)
    : services_(std::move(services)),
      auth_token_(std::move(auth_token)),
      watchdog_(watchdog) {}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ReflectionService::ServerReflectionInfo(grpc::CallbackServerContext* context) {
  return new ReflectionReactor(services_, *context, auth_token_, watchdog_);
}

}  // namespace normd
