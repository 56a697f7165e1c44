// The project's one logging header: `PARAMD_LOG(INFO) << ...` writes one line to stderr,
// "I 2026-11-30T10:00:00.123Z file.cc:42] message". Levels: DEBUG, INFO, WARNING, ERROR; the
// threshold is set once at start (SetLogLevel). PARAMD_CHECK crashes on a broken invariant.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace paramd {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warning", "error"; false when unknown.
bool ParseLogLevel(std::string_view text, LogLevel* level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows the stream when a message is below the threshold.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace paramd

#define PARAMD_LOG_LEVEL_DEBUG ::paramd::LogLevel::kDebug
#define PARAMD_LOG_LEVEL_INFO ::paramd::LogLevel::kInfo
#define PARAMD_LOG_LEVEL_WARNING ::paramd::LogLevel::kWarning
#define PARAMD_LOG_LEVEL_ERROR ::paramd::LogLevel::kError
#define PARAMD_LOG_LEVEL_FATAL ::paramd::LogLevel::kFatal

#define PARAMD_LOG(level)                              \
  (PARAMD_LOG_LEVEL_##level < ::paramd::GetLogLevel()) \
      ? (void)0                                        \
      : ::paramd::LogVoidify() &                       \
            ::paramd::LogMessage(PARAMD_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#define PARAMD_CHECK(cond)                                                                   \
  (cond) ? (void)0                                                                           \
         : ::paramd::LogVoidify() &                                                          \
               ::paramd::LogMessage(::paramd::LogLevel::kFatal, __FILE__, __LINE__).stream() \
                   << "Check failed: " #cond " "
