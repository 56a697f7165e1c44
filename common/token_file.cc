#include "common/token_file.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/quoted.h"

namespace paramd {
namespace {

constexpr size_t kMinTokenChars = 16;

// The file's lines, each cut at '#' and split on blanks, numbered; refused where others may read
// it or it cannot be read.
absl::StatusOr<std::vector<std::pair<int, std::vector<std::string>>>> Lines(
    const std::string& path, const std::string& what) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " cannot be read"));
  }
  const bool owners_alone = (info.st_mode & 077) == 0;
  const bool roots_and_a_group_may_read = info.st_uid == 0 && (info.st_mode & 037) == 0;
  if (!owners_alone && !roots_and_a_group_may_read) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", path,
                     " may be read or written by other users: chmod 600 it (or 640 owned by "
                     "root; a token others can read proves nothing)"));
  }
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " cannot be opened"));
  std::vector<std::pair<int, std::vector<std::string>>> lines;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view content = absl::string_view(line).substr(0, line.find('#'));
    std::vector<std::string> fields =
        absl::StrSplit(content, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (!fields.empty()) lines.emplace_back(number, std::move(fields));
  }
  return lines;
}

}  // namespace

absl::StatusOr<std::vector<TokenLine>> ReadTokenFile(const std::string& path) {
  const std::string what = "token file";
  auto lines = Lines(path, what);
  if (!lines.ok()) return lines.status();
  std::vector<TokenLine> tokens;
  std::set<std::string> seen;
  for (auto& [number, fields] : *lines) {
    const auto refused = [&, number = number](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " line ", number, ": ", why));
    };
    if (fields.size() < 2) return refused("a role (trainer, admin, peer) and a token, then jobs");
    TokenLine token;
    if (fields[0] == "trainer") {
      token.role = TokenLine::Role::kTrainer;
    } else if (fields[0] == "admin") {
      token.role = TokenLine::Role::kAdmin;
    } else if (fields[0] == "peer") {
      token.role = TokenLine::Role::kPeer;
    } else {
      return refused(absl::StrCat("the role is trainer, admin or peer, not ", Quoted(fields[0])));
    }
    if (fields[1].size() < kMinTokenChars) {
      return refused(absl::StrCat("a token has at least ", kMinTokenChars, " characters"));
    }
    if (!seen.insert(fields[1]).second) return refused("a token named twice");
    token.secret = std::move(fields[1]);
    token.jobs.assign(fields.begin() + 2, fields.end());
    if (token.role == TokenLine::Role::kTrainer && token.jobs.empty()) {
      return refused("a trainer token names its jobs (a name, or a prefix and *)");
    }
    if (token.role != TokenLine::Role::kTrainer && !token.jobs.empty()) {
      return refused("only a trainer token names jobs");
    }
    tokens.push_back(std::move(token));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " has no token"));
  }
  return tokens;
}

absl::StatusOr<std::string> PeerToken(const std::string& path) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::vector<TokenLine>> tokens = ReadTokenFile(path);
  if (!tokens.ok()) return tokens.status();
  for (TokenLine::Role role : {TokenLine::Role::kPeer, TokenLine::Role::kAdmin}) {
    for (const TokenLine& token : *tokens) {
      if (token.role == role) return token.secret;
    }
  }
  return std::string();
}

std::string TokenFileFromEnvironment() {
  const char* path = std::getenv("PARAMD_TOKEN_FILE");
  return path == nullptr ? std::string() : std::string(path);
}

absl::StatusOr<std::string> ReadClientToken(const std::string& path) {
  auto lines = Lines(path, "client token file");
  if (!lines.ok()) return lines.status();
  if (lines->empty() || lines->front().second.size() != 1 ||
      lines->front().second.front().size() < kMinTokenChars) {
    return absl::InvalidArgumentError(
        absl::StrCat("client token file ", path, " holds no token (one word of at least ",
                     kMinTokenChars, " characters on its first line)"));
  }
  return lines->front().second.front();
}

}  // namespace paramd
