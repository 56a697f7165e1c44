// Bearer tokens on files (DESIGN: trust at the boundary). A daemon's token file has one token per
// line with what it may reach (server/rpc/access.h):
//   trainer TOKEN JOB...     admin TOKEN     peer TOKEN          ('#' starts a comment)
// A client's token file holds its token alone. Both must be their owner's alone (mode 0600 or
// 0400), or root's and readable by one group at most (0640 or 0440: a Kubernetes Secret mounted
// with an fsGroup, the rule PostgreSQL applies to its key files): a token others can read proves
// nothing.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace paramd {

struct TokenLine {
  enum class Role { kTrainer, kAdmin, kPeer };
  Role role = Role::kTrainer;
  std::string secret;             // at least 16 characters
  std::vector<std::string> jobs;  // a trainer's: names, or prefixes ending in '*'
};

// A daemon's token file. INVALID_ARGUMENT for a file that is not read: missing, readable by users
// other than its owner, a line that is not one of the three roles, a token shorter than 16
// characters or named twice, a trainer line naming no job, no token at all.
absl::StatusOr<std::vector<TokenLine>> ReadTokenFile(const std::string& path);

// The token a daemon of `path`'s tokens calls other daemons with (their Peer service, a job's
// Status): its first peer line's, else its first admin line's; "" without a file, or with neither.
absl::StatusOr<std::string> PeerToken(const std::string& path);

// $PARAMD_TOKEN_FILE, or "" where it is unset (ClientOptions::token_file's default).
std::string TokenFileFromEnvironment();

// A client's token file: its first line that is not blank or a comment, trimmed. The same
// refusals for its mode and a short token.
absl::StatusOr<std::string> ReadClientToken(const std::string& path);

}  // namespace paramd
