// How the services take a request and end a call. Every method is a raw one (it receives the
// request's bytes), so a request that does not parse is the caller's INVALID_ARGUMENT, with a
// message, and is counted like any failure rather than answered UNIMPLEMENTED by gRPC. A failed
// call is counted (paramd_rpc_errors_total{method, code}) and logged at debug level; a unary one
// is finished with the status as gRPC codes it.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>
#include <grpcpp/support/server_callback.h>

#include <string>

#include "absl/status/status.h"
#include "server/daemon.h"
#include "server/rpc/access.h"

namespace paramd {

void CountRpcError(Daemon* daemon, const char* method, const absl::Status& status);

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, Daemon* daemon,
                                      const char* method, const absl::Status& status);

// NOT_FOUND where the call's :authority routes to a backend of a daemon of several
// (common/owner_address.h) but reached `daemon`, another one: no backend of the daemon has it.
absl::Status CheckRoute(grpc::CallbackServerContext* context, const Daemon& daemon);

// INVALID_ARGUMENT naming the message type when `raw` is not one (garbage or truncated bytes, an
// unknown wire type, a string field that is not UTF-8).
absl::Status NotParsed(const std::string& type);

// Parses a request's bytes into `message` (the bytes are consumed).
template <typename Message>
absl::Status ParseMessage(const grpc::ByteBuffer* raw, Message* message) {
  if (!grpc::SerializationTraits<Message>::Deserialize(const_cast<grpc::ByteBuffer*>(raw), message)
           .ok()) {
    return NotParsed(Message::descriptor()->full_name());
  }
  return absl::OkStatus();
}

// Serializes `message` into `raw` (replacing what it held).
template <typename Message>
void SerializeMessage(const Message& message, grpc::ByteBuffer* raw) {
  bool own_buffer = false;
  grpc::ByteBuffer bytes;
  grpc::SerializationTraits<Message>::Serialize(message, &bytes, &own_buffer);
  raw->Swap(&bytes);
}

// A unary raw method with a typed handler: identifies the caller by its token (AccessControl),
// checks its route (CheckRoute), parses the request, asks `allow(caller, request)` whether the
// caller may make it, runs `handle(request, &response)`, serializes the response of a call that
// succeeded, and finishes the call.
template <typename Request, typename Response, typename Allow, typename Handler>
grpc::ServerUnaryReactor* ServeUnary(grpc::CallbackServerContext* context, Daemon* daemon,
                                     const AccessControl& access, const char* method,
                                     const grpc::ByteBuffer* raw_request,
                                     grpc::ByteBuffer* raw_response, Allow&& allow,
                                     Handler&& handle) {
  Request request;
  Response response;
  absl::StatusOr<Caller> caller = access.Identify(*context);
  absl::Status status = caller.status();
  if (status.ok()) status = CheckRoute(context, *daemon);
  if (status.ok()) status = ParseMessage(raw_request, &request);
  if (status.ok()) status = allow(*caller, request);
  if (status.ok()) status = handle(request, &response);
  if (status.ok()) SerializeMessage(response, raw_response);
  return FinishUnary(context, daemon, method, status);
}

}  // namespace paramd
