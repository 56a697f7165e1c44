// Fuzzes the config file's path: ParseConfigText, WithDefaults, ValidateConfig (common/config.h).
// The bytes are read twice: as a config file's text, and as a serialized DaemonConfig, which
// reaches every field value quickly (the text parser is not instrumented, so the fuzzer sees
// little of its progress).
// Invariants: nothing crashes; every rejection is INVALID_ARGUMENT; defaults are a fixed point; a
// config that validates, printed as text and parsed again, is the same config and still valid.
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/logging.h"

namespace {

using google::protobuf::util::MessageDifferencer;

// Defaults, validation and the text round trip of a parsed config.
void CheckParsed(const paramd::v1::DaemonConfig& parsed) {
  const paramd::v1::DaemonConfig config = paramd::WithDefaults(parsed);
  PARAMD_CHECK(MessageDifferencer::Equals(paramd::WithDefaults(config), config))
      << "WithDefaults is not a fixed point: " << config.ShortDebugString();
  const absl::Status valid = paramd::ValidateConfig(config);
  if (!valid.ok()) {
    PARAMD_CHECK(absl::IsInvalidArgument(valid)) << valid;
    PARAMD_CHECK(valid.message().find("config field") != std::string::npos) << valid;
    return;
  }

  std::string printed;
  PARAMD_CHECK(google::protobuf::TextFormat::PrintToString(config, &printed));
  absl::StatusOr<paramd::v1::DaemonConfig> again = paramd::ParseConfigText(printed);
  PARAMD_CHECK(again.ok()) << again.status() << " for\n" << printed;
  PARAMD_CHECK(MessageDifferencer::Equals(*again, config)) << "round trip changed the config:\n"
                                                           << config.ShortDebugString() << "\n"
                                                           << again->ShortDebugString();
  const absl::Status still_valid = paramd::ValidateConfig(paramd::WithDefaults(*again));
  PARAMD_CHECK(still_valid.ok()) << still_valid;
}

}  // namespace

// protobuf logs every string field that is not UTF-8 as an error: noise here, the parse fails.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<paramd::v1::DaemonConfig> parsed = paramd::ParseConfigText(bytes);
  if (parsed.ok()) {
    CheckParsed(*parsed);
  } else {
    PARAMD_CHECK(absl::IsInvalidArgument(parsed.status())) << parsed.status();
  }
  paramd::v1::DaemonConfig decoded;
  if (decoded.ParseFromString(bytes)) {
    decoded.DiscardUnknownFields();  // a config file cannot carry them: the text parser refuses
    CheckParsed(decoded);
  }
  return 0;
}
