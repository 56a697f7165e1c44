#include "server/rpc/access.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/quoted.h"
#include "common/token_file.h"

namespace paramd {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

bool NamesJob(const std::string& pattern, absl::string_view job) {
  if (!pattern.empty() && pattern.back() == '*') {
    return absl::StartsWith(job, absl::string_view(pattern).substr(0, pattern.size() - 1));
  }
  return pattern == job;
}

// Equal in time that depends on the lengths only, not on where the bytes differ.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    differ |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return differ == 0;
}

absl::Status Denied(absl::string_view what, absl::string_view needs) {
  return absl::PermissionDeniedError(absl::StrCat("this token may not ", what, ": that takes ",
                                                  needs, " (see the daemon's token file)"));
}

}  // namespace

absl::Status Caller::MayUseJob(absl::string_view job) const {
  if (role_ == Role::kAnyone || role_ == Role::kAdmin) return absl::OkStatus();
  if (role_ == Role::kTrainer) {
    for (const std::string& pattern : jobs_) {
      if (NamesJob(pattern, job)) return absl::OkStatus();
    }
    return Denied(absl::StrCat("use job ", Quoted(std::string(job))),
                  "an admin token or a trainer token whose line names the job");
  }
  return Denied(absl::StrCat("use job ", Quoted(std::string(job))),
                "a trainer or admin token, not a peer token");
}

absl::Status Caller::MayRunDaemon(absl::string_view what) const {
  if (role_ == Role::kAnyone || role_ == Role::kAdmin) return absl::OkStatus();
  return Denied(what, "an admin token");
}

absl::Status Caller::MayOffer() const {
  if (role_ == Role::kAnyone || role_ == Role::kAdmin || role_ == Role::kPeer) {
    return absl::OkStatus();
  }
  return Denied("take part in the agreement between daemons", "a peer or admin token");
}

absl::StatusOr<std::vector<AccessControl::Token>> AccessControl::Read(const std::string& path) {
  absl::StatusOr<std::vector<TokenLine>> lines = ReadTokenFile(path);
  if (!lines.ok()) return lines.status();
  std::vector<Token> tokens;
  for (TokenLine& line : *lines) {
    const Caller::Role role = line.role == TokenLine::Role::kAdmin  ? Caller::Role::kAdmin
                              : line.role == TokenLine::Role::kPeer ? Caller::Role::kPeer
                                                                    : Caller::Role::kTrainer;
    tokens.push_back(Token{std::move(line.secret), Caller(role, std::move(line.jobs))});
  }
  return tokens;
}

absl::StatusOr<std::unique_ptr<AccessControl>> AccessControl::Load(const std::string& path) {
  auto access = std::unique_ptr<AccessControl>(new AccessControl());
  access->path_ = path;
  if (path.empty()) return access;
  absl::StatusOr<std::vector<Token>> tokens = Read(path);
  if (!tokens.ok()) return tokens.status();
  absl::MutexLock lock(&access->mu_);
  access->tokens_ = *std::move(tokens);
  return access;
}

absl::Status AccessControl::Reload() {
  if (path_.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<Token>> tokens = Read(path_);
  if (!tokens.ok()) return tokens.status();
  absl::MutexLock lock(&mu_);
  tokens_ = *std::move(tokens);
  return absl::OkStatus();
}

absl::StatusOr<Caller> AccessControl::Identify(const grpc::ServerContextBase& context) const {
  if (path_.empty()) return Caller();
  const auto& metadata = context.client_metadata();
  const auto header = metadata.find("authorization");
  if (header == metadata.end()) {
    return absl::UnauthenticatedError(
        "this daemon takes a token: send `authorization: Bearer TOKEN` (--token_file or "
        "PARAMD_TOKEN_FILE on the client)");
  }
  const absl::string_view value(header->second.data(), header->second.size());
  if (!absl::StartsWith(value, kBearer)) {
    return absl::UnauthenticatedError("the authorization header is not `Bearer TOKEN`");
  }
  const absl::string_view secret = value.substr(kBearer.size());
  absl::MutexLock lock(&mu_);
  const Caller* found = nullptr;
  for (const Token& token : tokens_) {  // every one compared: the time tells nothing
    if (SameSecret(token.secret, secret)) found = &token.caller;
  }
  if (found == nullptr) return absl::UnauthenticatedError("the token is not one of this daemon's");
  return *found;
}

size_t AccessControl::tokens() const {
  absl::MutexLock lock(&mu_);
  return tokens_.size();
}

}  // namespace paramd
