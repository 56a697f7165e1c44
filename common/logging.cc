#include "common/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace paramd {
namespace {

std::atomic<LogLevel> g_level{LogLevel::kInfo};

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(level); }
LogLevel GetLogLevel() { return g_level.load(std::memory_order_relaxed); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  if (text == "debug")
    *level = LogLevel::kDebug;
  else if (text == "info")
    *level = LogLevel::kInfo;
  else if (text == "warning")
    *level = LogLevel::kWarning;
  else if (text == "error")
    *level = LogLevel::kError;
  else
    return false;
  return true;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  using std::chrono::system_clock;
  const auto now = system_clock::now();
  const std::time_t secs = system_clock::to_time_t(now);
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm utc;
  gmtime_r(&secs, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  static constexpr char kLetters[] = "DIWEF";
  stream_ << kLetters[static_cast<int>(level)] << ' ' << stamp << '.' << millis / 100
          << (millis / 10) % 10 << millis % 10 << "Z " << Basename(file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  std::fwrite(line.data(), 1, line.size(), stderr);
  if (level_ == LogLevel::kFatal) {
    std::fflush(stderr);
    std::abort();
  }
}

}  // namespace paramd
