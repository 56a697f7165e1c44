#include "server/registration.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/owner_address.h"
#include "common/quoted.h"
#include "common/status_macros.h"

namespace paramd {
namespace {

constexpr int kMaxWorldSize = 4096;
constexpr int64_t kMaxElements = int64_t{1} << 36;
constexpr int kMaxDaemons = 4096;

// A daemon list shown in a message stops after about this many bytes, so that two lists fit a
// status a client accepts (its metadata limit, 8 KiB by default).
constexpr size_t kDaemonListTextBytes = 2048;

// "host:port" with a port in 1..65535 and a host of 1 to 255 bytes of a name's or an IP
// address's characters ([A-Za-z0-9.:_%-], brackets of IPv6), so messages show lists as they are;
// or that with "/BACKEND" (common/owner_address.h).
bool IsDaemonAddress(const std::string& owner) {
  // A backend of a daemon of several: "host:port/BACKEND".
  const OwnerAddress split = SplitOwnerAddress(owner);
  if (owner.find('/') != std::string::npos && !IsBackendName(split.backend)) return false;
  const std::string& address = split.daemon;
  const size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon < 1 || colon > 255 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return false;
  }
  for (char c : address.substr(0, colon)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || c == ':' || c == '%' || c == '[' ||
                    c == ']';
    if (!ok) return false;
  }
  return true;
}

// Sorted, so that every client and daemon of the job holds the same list whatever order its
// addresses were found in (a DNS answer, a node list): the shard map's owners come from it.
absl::Status ValidateDaemonList(const v1::RegisterRequest& r) {
  if (r.daemons_size() > kMaxDaemons) {
    return absl::InvalidArgumentError(absl::StrCat("daemons lists ", r.daemons_size(),
                                                   " addresses; a job has at most ", kMaxDaemons));
  }
  for (int i = 0; i < r.daemons_size(); ++i) {
    if (!IsDaemonAddress(r.daemons(i))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "daemons[", i, "] = ", Quoted(r.daemons(i)),
          " is not \"host:port\" with a port in 1..65535, or that with \"/BACKEND\" (cpu, "
          "cpu:K or cuda:N)"));
    }
    if (i == 0) continue;
    if (r.daemons(i) == r.daemons(i - 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("daemons lists ", Quoted(r.daemons(i)), " twice; each daemon once"));
    }
    if (r.daemons(i) < r.daemons(i - 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "daemons is not sorted: ", Quoted(r.daemons(i - 1)), " comes before ",
          Quoted(r.daemons(i)), "; the list must be sorted ascending (clients sort it)"));
    }
  }
  return absl::OkStatus();
}

bool ValidName(const std::string& name, size_t max_length, bool allow_path) {
  if (name.empty() || name.size() > max_length) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-' || (allow_path && (c == ':' || c == '/'));
    if (!ok) return false;
  }
  return true;
}

absl::Status CheckHyper(const v1::AdamwHyperparams& h) {
  auto bad = [](const char* field, double value, const char* rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("hyperparams.", field, " = ", value, " must be ", rule));
  };
  if (!std::isfinite(h.lr()) || h.lr() <= 0) return bad("lr", h.lr(), "finite and > 0");
  if (!(h.beta1() >= 0 && h.beta1() < 1)) return bad("beta1", h.beta1(), "in [0, 1)");
  if (!(h.beta2() >= 0 && h.beta2() < 1)) return bad("beta2", h.beta2(), "in [0, 1)");
  if (!std::isfinite(h.eps()) || h.eps() <= 0) return bad("eps", h.eps(), "finite and > 0");
  if (!std::isfinite(h.weight_decay()) || h.weight_decay() < 0) {
    return bad("weight_decay", h.weight_decay(), "finite and >= 0");
  }
  return absl::OkStatus();
}

absl::Status CheckPolicy(const v1::StatePolicy& p) {
  if (!v1::MasterType_IsValid(p.master())) {
    return absl::InvalidArgumentError(
        absl::StrCat("state_policy.master = ", p.master(), " is not a MasterType"));
  }
  struct Moment {
    const char* name;
    v1::MomentType type;
    v1::Rounding rounding;
  };
  for (const Moment& m : {Moment{"exp_avg", p.exp_avg(), p.exp_avg_rounding()},
                          Moment{"exp_avg_sq", p.exp_avg_sq(), p.exp_avg_sq_rounding()}}) {
    if (!v1::MomentType_IsValid(m.type)) {
      return absl::InvalidArgumentError(
          absl::StrCat("state_policy.", m.name, " = ", m.type, " is not a MomentType"));
    }
    if (!v1::Rounding_IsValid(m.rounding)) {
      return absl::InvalidArgumentError(
          absl::StrCat("state_policy.", m.name, "_rounding = ", m.rounding, " is not a Rounding"));
    }
    const bool fp32 = m.type == v1::MOMENT_TYPE_UNSPECIFIED || m.type == v1::MOMENT_TYPE_FP32;
    if (fp32 && m.rounding == v1::ROUNDING_STOCHASTIC) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state_policy.", m.name, "_rounding is ROUNDING_STOCHASTIC but ", m.name,
          " is FP32, which is not rounded; use a narrower moment type or nearest rounding"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckServeFormat(const v1::ServeFormat& f) {
  if (f.recipe() == v1::RECIPE_UNSPECIFIED || !v1::Recipe_IsValid(f.recipe())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "serve recipe ", f.recipe(), " is not a Recipe (RECIPE_FP32 ... RECIPE_MXFP8)"));
  }
  if (!v1::Direction_IsValid(f.direction())) {
    return absl::InvalidArgumentError(
        absl::StrCat("serve direction ", f.direction(), " is not a Direction"));
  }
  if (f.recipe() != v1::RECIPE_FP8_DELAYED && (f.amax_history() != 0 || f.margin() != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("serve ", v1::Recipe_Name(f.recipe()),
                     " takes no amax_history or margin; they belong to RECIPE_FP8_DELAYED"));
  }
  if (f.amax_history() < 0 || f.amax_history() > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("amax_history = ", f.amax_history(), " must be in [1, 1024] (0 = 16)"));
  }
  if (f.margin() < 0 || f.margin() > 32) {
    return absl::InvalidArgumentError(absl::StrCat("margin = ", f.margin(), " must be in [0, 32]"));
  }
  return absl::OkStatus();
}

kernels::MomentType KernelMoment(v1::MomentType type) {
  switch (type) {
    case v1::MOMENT_TYPE_BF16:
      return kernels::MomentType::kBf16;
    case v1::MOMENT_TYPE_FP16:
      return kernels::MomentType::kFp16;
    case v1::MOMENT_TYPE_FP8:
      return kernels::MomentType::kFp8;
    default:
      return kernels::MomentType::kFp32;
  }
}

kernels::Rounding KernelRounding(v1::Rounding rounding) {
  return rounding == v1::ROUNDING_STOCHASTIC ? kernels::Rounding::kStochastic
                                             : kernels::Rounding::kNearest;
}

}  // namespace

TensorInfo TensorInfoOf(const v1::RegisterRequest& spec, int i) {
  TensorInfo info;
  info.rows = spec.tensors(i).rows();
  info.cols = spec.tensors(i).cols();
  info.index =
      static_cast<uint32_t>(spec.tensors(i).has_job_index() ? spec.tensors(i).job_index() : i);
  info.row_offset = spec.tensors(i).row_offset();
  const v1::StatePolicy& p = spec.state_policy();
  info.policy.master = p.master() == v1::MASTER_TYPE_BF16_REMAINDER
                           ? kernels::MasterType::kBf16Remainder
                       : p.master() == v1::MASTER_TYPE_FP16 ? kernels::MasterType::kFp16
                                                            : kernels::MasterType::kFp32;
  info.policy.exp_avg = KernelMoment(p.exp_avg());
  info.policy.exp_avg_sq = KernelMoment(p.exp_avg_sq());
  info.policy.exp_avg_rounding = KernelRounding(p.exp_avg_rounding());
  info.policy.exp_avg_sq_rounding = KernelRounding(p.exp_avg_sq_rounding());
  for (const v1::ServeFormat& f : spec.serve()) {
    if (f.recipe() == v1::RECIPE_FP8_DELAYED) {
      info.delayed_history = f.amax_history();
      info.delayed_margin = f.margin();
    }
  }
  return info;
}

int64_t ElementBytes(v1::ElementType type) {
  switch (type) {
    case v1::ELEMENT_TYPE_FP32:
      return 4;
    case v1::ELEMENT_TYPE_BF16:
      return 2;
    default:
      return 0;
  }
}

absl::Status ValidateRegistration(const v1::RegisterRequest& r) {
  if (!ValidName(r.job(), 128, false)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job name ", Quoted(r.job()), " must be 1 to 128 characters of [A-Za-z0-9_.-]"));
  }
  if (r.world_size() < 1 || r.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size = ", r.world_size(), " must be in [1, ", kMaxWorldSize, "]"));
  }
  if (r.rank() < 0 || r.rank() >= r.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank = ", r.rank(), " must be in [0, world_size = ", r.world_size(), ")"));
  }
  if (r.tensors().empty()) {
    return absl::InvalidArgumentError("a job needs at least one tensor");
  }
  std::set<std::string> names;
  for (const v1::TensorSpec& t : r.tensors()) {
    if (!ValidName(t.name(), 256, true)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor name ", Quoted(t.name()), " must be 1 to 256 characters of [A-Za-z0-9_.:/-]"));
    }
    if (!names.insert(t.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\" is listed twice"));
    }
    if (t.rows() < 1 || t.cols() < 1 || t.rows() > kMaxElements / t.cols()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name(), "\" has shape [", t.rows(), ", ", t.cols(),
                       "]; both must be >= 1 with at most 2^36 elements"));
    }
    if (ElementBytes(t.grad_type()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", t.name(), "\" needs grad_type ELEMENT_TYPE_FP32 or ELEMENT_TYPE_BF16"));
    }
    if (t.has_job_index() || t.row_offset() != 0 || t.whole_rows() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", t.name(),
          "\" sets job_index, row_offset or whole_rows, which only daemons set (for the part of "
          "a job each daemon of several holds): register the whole tensor"));
    }
  }
  if (absl::Status s = CheckHyper(r.hyperparams()); !s.ok()) return s;
  if (absl::Status s = CheckPolicy(r.state_policy()); !s.ok()) return s;
  const v1::ServeFormat* delayed = nullptr;
  for (const v1::ServeFormat& f : r.serve()) {
    if (absl::Status s = CheckServeFormat(f); !s.ok()) return s;
    if (f.recipe() != v1::RECIPE_FP8_DELAYED) continue;
    // A tensor keeps one amax history, shared by every fp8_delayed direction.
    auto history = [](const v1::ServeFormat& g) {
      return g.amax_history() == 0 ? 16 : g.amax_history();
    };
    if (delayed != nullptr &&
        (history(f) != history(*delayed) || f.margin() != delayed->margin())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "serve RECIPE_FP8_DELAYED is listed with amax_history ", history(*delayed), " margin ",
          delayed->margin(), " and with amax_history ", history(f), " margin ", f.margin(),
          "; a tensor keeps one amax history for every fp8_delayed direction, so list the same "
          "amax_history and margin"));
    }
    delayed = &f;
  }
  if (!std::isfinite(r.max_grad_norm()) || r.max_grad_norm() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_grad_norm = ", r.max_grad_norm(),
                                                   " must be finite and >= 0 (0 = no clipping)"));
  }
  if (r.early_step() && r.max_grad_norm() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "early_step with max_grad_norm = ", r.max_grad_norm(),
        ": early steps need clipping off (max_grad_norm 0), since the clip depends on every "
        "tensor's gradient"));
  }
  if (!v1::PushMode_IsValid(r.push_mode())) {
    return absl::InvalidArgumentError(absl::StrCat("push_mode ", r.push_mode(), " is unknown"));
  }
  return ValidateDaemonList(r);
}

absl::Status CheckDaemonList(const v1::RegisterRequest& request, std::string_view advertised) {
  if (absl::Status s = ValidateDaemonList(request); !s.ok()) return s;
  const auto& daemons = request.daemons();
  if (daemons.empty() || std::binary_search(daemons.begin(), daemons.end(), advertised)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the daemon list of job ", Quoted(request.job()), ", ", DaemonListText(daemons),
      ", does not name this daemon, which advertises itself as ", Quoted(advertised),
      ": list the daemons by their advertise_address, or set this daemon's advertise_address "
      "(--advertise_address) to the name the list gives it"));
}

absl::Status CheckSameDaemons(const v1::RegisterRequest& registered,
                              const v1::RegisterRequest& request) {
  if (std::equal(registered.daemons().begin(), registered.daemons().end(),
                 request.daemons().begin(), request.daemons().end())) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", Quoted(request.job()), " is registered with daemons ",
      DaemonListText(registered.daemons()), "; this request lists daemons ",
      DaemonListText(request.daemons()),
      ": every rank must give the same daemon list, and a job restored from a checkpoint keeps "
      "the checkpoint's"));
}

std::string DaemonListText(const google::protobuf::RepeatedPtrField<std::string>& daemons) {
  if (daemons.empty()) return "[] (the daemon called alone)";
  std::string text = "[";
  for (int i = 0; i < daemons.size(); ++i) {
    if (text.size() > kDaemonListTextBytes) {
      absl::StrAppend(&text, "... ", daemons.size() - i, " more");
      break;
    }
    // A list nothing checked yet (a manifest's) may hold anything: quoted, as names from requests
    // are.
    const std::string& address = daemons[i];
    absl::StrAppend(&text, i == 0 ? "" : ", ",
                    IsDaemonAddress(address) ? address : Quoted(address));
  }
  return absl::StrCat(text, "]");
}

std::vector<std::string> JobDaemons(const v1::RegisterRequest& spec,
                                    const std::string& advertised) {
  if (spec.daemons().empty()) return {advertised};
  return {spec.daemons().begin(), spec.daemons().end()};
}

absl::StatusOr<ShardMap> JobShardMap(const v1::RegisterRequest& spec, const std::string& advertised,
                                     int device) {
  std::vector<Owner> owners;
  for (std::string& daemon : JobDaemons(spec, advertised)) {
    // A backend of a daemon of several says its device in its address.
    const absl::StatusOr<int> named = BackendDevice(SplitOwnerAddress(daemon).backend);
    owners.push_back(Owner{std::move(daemon), named.ok() ? *named : device});
  }
  return ComputeShardMap(JobTensorShapes(spec.tensors()), std::move(owners));
}

absl::StatusOr<v1::RegisterRequest> DaemonPart(const v1::RegisterRequest& spec,
                                               const std::string& advertised) {
  if (spec.daemons_size() < 2) return spec;
  PARAMD_ASSIGN_OR_RETURN(const ShardMap map, JobShardMap(spec, advertised, kCpuDevice));
  const auto self = std::find_if(map.owners.begin(), map.owners.end(),
                                 [&](const Owner& o) { return o.daemon == advertised; });
  if (self == map.owners.end()) {
    return absl::FailedPreconditionError(absl::StrCat("the daemon list of job ", Quoted(spec.job()),
                                                      " does not name this daemon (",
                                                      Quoted(advertised), ")"));
  }
  const int owner = static_cast<int>(self - map.owners.begin());
  v1::RegisterRequest part = spec;
  part.clear_tensors();
  for (int i = 0; i < spec.tensors_size(); ++i) {
    const std::vector<ShardPiece>& pieces = map.tensors[static_cast<size_t>(i)];
    for (const ShardPiece& piece : pieces) {
      if (piece.owner != owner) continue;
      v1::TensorSpec* t = part.add_tensors();
      *t = spec.tensors(i);
      t->set_job_index(i);
      if (pieces.size() > 1) {
        t->set_rows(piece.row_end - piece.row_begin);
        t->set_row_offset(piece.row_begin);
        t->set_whole_rows(spec.tensors(i).rows());
      }
    }
  }
  return part;
}

v1::RegisterRequest NormalizedSpec(const v1::RegisterRequest& request) {
  v1::RegisterRequest spec = request;
  spec.clear_rank();
  v1::StatePolicy* p = spec.mutable_state_policy();
  if (p->master() == v1::MASTER_TYPE_UNSPECIFIED) p->set_master(v1::MASTER_TYPE_FP32);
  if (p->exp_avg() == v1::MOMENT_TYPE_UNSPECIFIED) p->set_exp_avg(v1::MOMENT_TYPE_FP32);
  if (p->exp_avg_sq() == v1::MOMENT_TYPE_UNSPECIFIED) p->set_exp_avg_sq(v1::MOMENT_TYPE_FP32);
  // DESIGN.md §3's default rounding: stochastic for an fp8 exp_avg_sq, nearest elsewhere.
  if (p->exp_avg_rounding() == v1::ROUNDING_UNSPECIFIED) {
    p->set_exp_avg_rounding(v1::ROUNDING_NEAREST);
  }
  if (p->exp_avg_sq_rounding() == v1::ROUNDING_UNSPECIFIED) {
    p->set_exp_avg_sq_rounding(p->exp_avg_sq() == v1::MOMENT_TYPE_FP8 ? v1::ROUNDING_STOCHASTIC
                                                                      : v1::ROUNDING_NEAREST);
  }
  for (v1::ServeFormat& f : *spec.mutable_serve()) {
    if (f.direction() == v1::DIRECTION_UNSPECIFIED) f.set_direction(v1::DIRECTION_ROWWISE);
    if (f.recipe() == v1::RECIPE_FP8_DELAYED && f.amax_history() == 0) f.set_amax_history(16);
  }
  if (spec.push_mode() == v1::PUSH_MODE_UNSPECIFIED) spec.set_push_mode(v1::PUSH_MODE_FULL);
  return spec;
}

std::vector<FormatKey> ServedFormats(const v1::RegisterRequest& spec) {
  std::vector<FormatKey> formats;
  for (const v1::ServeFormat& f : spec.serve()) {
    const FormatKey key = FormatKeyOf(f);
    bool seen = false;
    for (const FormatKey& k : formats) seen = seen || k == key;
    if (!seen) formats.push_back(key);
  }
  // A job that names no format gets the FP32 weights; one that names formats pays for those only.
  if (formats.empty()) formats.push_back(FormatKey{v1::RECIPE_FP32, v1::DIRECTION_ROWWISE});
  return formats;
}

}  // namespace paramd
