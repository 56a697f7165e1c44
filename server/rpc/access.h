// Who may call what: bearer tokens read from the daemon's token file (DaemonConfig.token_file).
// Without a token file every call is allowed, as on a daemon only its own user reaches (a Unix
// socket of mode 0600). With one, every call but the health service's carries
// `authorization: Bearer TOKEN`, and the token's line says what it may do:
//   trainer TOKEN JOB...   the jobs it names (a name ending in '*' names those it begins), all
//                          they do: Register, push, commit, pull, hyper-parameters, state export
//                          and import, checkpoints, delete
//   admin TOKEN            everything: drain, every job, listing them
//   peer TOKEN             the Peer service between the daemons of a sharded job
// No token or an unknown one is UNAUTHENTICATED; a token without the right is PERMISSION_DENIED;
// either way nothing changes. Tokens are compared in constant time. SIGHUP reads the file again.
#pragma once

#include <grpcpp/server_context.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace paramd {

// What a call's token allows (AccessControl::Identify).
class Caller {
 public:
  enum class Role { kAnyone, kTrainer, kAdmin, kPeer };  // kAnyone: no token file

  Caller() = default;
  Caller(Role role, std::vector<std::string> jobs) : role_(role), jobs_(std::move(jobs)) {}

  // Job `job`'s RPCs: admin, or a trainer token naming it.
  absl::Status MayUseJob(absl::string_view job) const;
  // A job's Status: as MayUseJob, and a peer token (the daemons of a sharded job read each other's
  // devices).
  absl::Status MayReadJob(absl::string_view job) const {
    return role_ == Role::kPeer ? absl::OkStatus() : MayUseJob(job);
  }
  // What spans jobs or the daemon (Drain, every job's status or checkpoint): admin.
  absl::Status MayRunDaemon(absl::string_view what) const;
  // The Peer service: peer or admin.
  absl::Status MayOffer() const;
  // An RPC that names no job and reads nothing of one (a transport's probe): any token.
  absl::Status MayProbe() const { return absl::OkStatus(); }

  Role role() const { return role_; }

 private:
  Role role_ = Role::kAnyone;
  std::vector<std::string> jobs_;  // a trainer's, as its line names them
};

class AccessControl {
 public:
  // Without `path` ("") every caller may do everything. INVALID_ARGUMENT for a file that is not
  // read (common/token_file.h's ReadTokenFile).
  static absl::StatusOr<std::unique_ptr<AccessControl>> Load(const std::string& path);

  // Reads the file again (SIGHUP); keeps the tokens it had where the file is not read.
  absl::Status Reload();

  // The caller whose token `context` carries; UNAUTHENTICATED without a token or with one the
  // file does not have.
  absl::StatusOr<Caller> Identify(const grpc::ServerContextBase& context) const;

  // How many tokens are loaded (0 without a file).
  size_t tokens() const;

 private:
  struct Token {
    std::string secret;
    Caller caller;
  };
  static absl::StatusOr<std::vector<Token>> Read(const std::string& path);

  std::string path_;
  mutable absl::Mutex mu_;
  std::vector<Token> tokens_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramd
