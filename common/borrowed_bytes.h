// A protobuf message on the wire whose last field is a `bytes` payload that is referenced, not
// copied: the serialized leading fields, then the payload's length-delimited field header, then a
// slice over memory the caller keeps alive and unchanged until the write completes. Both ends of
// the inline transport send large payloads this way (the client's pushes, the daemon's pulls).
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <string>

namespace paramd {

inline grpc::ByteBuffer WithBorrowedBytesField(std::string head, int field, const void* data,
                                               size_t size) {
  head.push_back(static_cast<char>((field << 3) | 2));  // wire type 2: length-delimited
  for (uint64_t v = size;; v >>= 7) {
    if (v < 0x80) {
      head.push_back(static_cast<char>(v));
      break;
    }
    head.push_back(static_cast<char>((v & 0x7F) | 0x80));
  }
  grpc::Slice slices[2] = {grpc::Slice(head), grpc::Slice(data, size, grpc::Slice::STATIC_SLICE)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace paramd
