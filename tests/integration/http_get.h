// HTTP for tests that read a daemon's /metrics page: a plain GET over loopback, a free port to
// give a daemon process, and one series' value from the page's text format.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace paramd::testing {

// The body of an HTTP GET of `path` from `address` ("127.0.0.1:port"), "" where it fails.
inline std::string HttpGet(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buffer[65536];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// A loopback port free when asked (the kernel's choice for port 0), for a daemon process that
// must be told its metrics port: "127.0.0.1:port", "" where none could be had.
inline std::string FreeLoopbackAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  socklen_t size = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size) == 0;
  close(fd);
  return ok ? absl::StrCat("127.0.0.1:", ntohs(addr.sin_port)) : "";
}

// The value of the series `series` (its name and labels exactly as the page spells them, e.g.
// `paramd_pushed_bytes_total{transport="shm"}`) on a text-format metrics page; 0 where the page
// has no such series (a counter not yet incremented).
inline double MetricValue(const std::string& page, const std::string& series) {
  const std::string line = "\n" + series + " ";
  const size_t at = ("\n" + page).find(line);
  if (at == std::string::npos) return 0;
  const size_t begin = at + line.size() - 1;  // in `page`: the "\n" added before it shifts by one
  const size_t end = page.find('\n', begin);
  double value = 0;
  return absl::SimpleAtod(page.substr(begin, end == std::string::npos ? end : end - begin), &value)
             ? value
             : 0;
}

}  // namespace paramd::testing
