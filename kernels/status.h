// The small status kernels return. kernels/ depends on nothing but the standard library and CUDA,
// so it carries its own; the server converts it to absl::Status in one place.
#pragma once

#include <string>
#include <utility>

namespace paramd::kernels {

enum class Code { kOk = 0, kInvalidArgument, kUnimplemented, kInternal };

class [[nodiscard]] KStatus {
 public:
  KStatus() = default;
  KStatus(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static KStatus Ok() { return {}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace paramd::kernels
