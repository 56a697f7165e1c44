#include "server/registration.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"

namespace paramd {
namespace {

constexpr int kMaxWorldSize = 4096;
constexpr int64_t kMaxElements = int64_t{1} << 36;

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

}  // namespace

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
    return absl::InvalidArgumentError(
        absl::StrCat("job name \"", r.job(), "\" must be 1 to 128 characters of [A-Za-z0-9_.-]"));
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
          "tensor name \"", t.name(), "\" must be 1 to 256 characters of [A-Za-z0-9_.:/-]"));
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
  }
  if (absl::Status s = CheckHyper(r.hyperparams()); !s.ok()) return s;
  const v1::StatePolicy& p = r.state_policy();
  const bool fp32_policy =
      (p.master() == v1::MASTER_TYPE_UNSPECIFIED || p.master() == v1::MASTER_TYPE_FP32) &&
      (p.exp_avg() == v1::MOMENT_TYPE_UNSPECIFIED || p.exp_avg() == v1::MOMENT_TYPE_FP32) &&
      (p.exp_avg_sq() == v1::MOMENT_TYPE_UNSPECIFIED || p.exp_avg_sq() == v1::MOMENT_TYPE_FP32);
  if (!fp32_policy) {
    return absl::UnimplementedError(absl::StrCat(
        "state policy {", p.ShortDebugString(),
        "} is not supported by this daemon yet; use the fp32 policy (master, exp_avg and "
        "exp_avg_sq FP32)"));
  }
  for (const v1::ServeFormat& f : r.serve()) {
    if (f.recipe() != v1::RECIPE_FP32 && f.recipe() != v1::RECIPE_BF16) {
      return absl::UnimplementedError(absl::StrCat("serve recipe ", v1::Recipe_Name(f.recipe()),
                                                   " is not supported by this daemon yet; "
                                                   "supported: RECIPE_FP32, RECIPE_BF16"));
    }
    if (f.direction() == v1::DIRECTION_COLUMNWISE) {
      return absl::InvalidArgumentError(
          absl::StrCat("serve recipe ", v1::Recipe_Name(f.recipe()),
                       " has no columnwise direction; only block-scaled FP8 recipes have one"));
    }
  }
  if (r.push_mode() != v1::PUSH_MODE_UNSPECIFIED && r.push_mode() != v1::PUSH_MODE_FULL) {
    return absl::InvalidArgumentError(absl::StrCat("push_mode ", r.push_mode(), " is unknown"));
  }
  return absl::OkStatus();
}

v1::RegisterRequest NormalizedSpec(const v1::RegisterRequest& request) {
  v1::RegisterRequest spec = request;
  spec.clear_rank();
  v1::StatePolicy* p = spec.mutable_state_policy();
  if (p->master() == v1::MASTER_TYPE_UNSPECIFIED) p->set_master(v1::MASTER_TYPE_FP32);
  if (p->exp_avg() == v1::MOMENT_TYPE_UNSPECIFIED) p->set_exp_avg(v1::MOMENT_TYPE_FP32);
  if (p->exp_avg_sq() == v1::MOMENT_TYPE_UNSPECIFIED) p->set_exp_avg_sq(v1::MOMENT_TYPE_FP32);
  for (v1::ServeFormat& f : *spec.mutable_serve()) {
    if (f.direction() == v1::DIRECTION_UNSPECIFIED) f.set_direction(v1::DIRECTION_ROWWISE);
  }
  if (spec.push_mode() == v1::PUSH_MODE_UNSPECIFIED) spec.set_push_mode(v1::PUSH_MODE_FULL);
  return spec;
}

std::vector<FormatKey> ServedFormats(const v1::RegisterRequest& spec) {
  std::vector<FormatKey> formats = {FormatKey{v1::RECIPE_FP32, v1::DIRECTION_ROWWISE}};
  for (const v1::ServeFormat& f : spec.serve()) {
    FormatKey key{f.recipe(), f.direction() == v1::DIRECTION_UNSPECIFIED ? v1::DIRECTION_ROWWISE
                                                                         : f.direction()};
    bool seen = false;
    for (const FormatKey& k : formats) seen = seen || k == key;
    if (!seen) formats.push_back(key);
  }
  return formats;
}

}  // namespace paramd
