// Fuzzes the data path of one small job: the bytes are a spec choice and then a sequence of
// operations (Register a rank, PushChunk of gradients or initial weights, Commit) applied to a Job
// the way the services apply them, with the step run when the last commit hands it over.
// Invariants (docs/protocol.md, "Bad input gets a specific status and changes nothing"):
//   - nothing crashes (ASan, UBSan);
//   - every error is one of the documented codes of its call;
//   - a rejected call changes nothing: the job's status and every served byte are as before;
//   - an accepted call repeated at once (a client's retry) is accepted and changes nothing more;
//   - replaying only the accepted calls on a fresh job accepts each of them again with the same
//     outcome and ends in the same status and served bytes.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/backend/cpu_backend.h"
#include "server/registration.h"
#include "server/registry.h"

namespace paramd {
namespace {

constexpr int kMaxOps = 128;
constexpr int64_t kMaxChunkBytes = 4096;
constexpr char kUnknownTensor[] = "nope";

// The job: three small tensors (one of 129 rows, so the cpu backend's panel path runs too) in one
// of four setups of world size, state policy and serve formats.
v1::RegisterRequest Spec(uint8_t choice) {
  v1::RegisterRequest spec;
  spec.set_job("fuzz");
  struct Def {
    const char* name;
    int64_t rows, cols;
    v1::ElementType type;
  };
  for (const Def& d : {Def{"w", 3, 5, v1::ELEMENT_TYPE_FP32}, Def{"b", 1, 7, v1::ELEMENT_TYPE_BF16},
                       Def{"p", 129, 2, v1::ELEMENT_TYPE_FP32}}) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(d.name);
    t->set_rows(d.rows);
    t->set_cols(d.cols);
    t->set_grad_type(d.type);
  }
  v1::AdamwHyperparams* h = spec.mutable_hyperparams();
  h->set_lr(1e-3);
  h->set_beta1(0.9);
  h->set_beta2(0.999);
  h->set_eps(1e-8);
  h->set_weight_decay(0.01);
  spec.set_seed(7);
  auto serve = [&spec](v1::Recipe recipe, v1::Direction direction) {
    v1::ServeFormat* f = spec.add_serve();
    f->set_recipe(recipe);
    f->set_direction(direction);
    return f;
  };
  v1::StatePolicy* policy = spec.mutable_state_policy();
  switch (choice % 4) {
    case 0:
      spec.set_world_size(2);
      serve(v1::RECIPE_BF16, v1::DIRECTION_ROWWISE);
      break;
    case 1:
      spec.set_world_size(2);
      policy->set_exp_avg(v1::MOMENT_TYPE_BF16);
      policy->set_exp_avg_sq(v1::MOMENT_TYPE_FP8);
      serve(v1::RECIPE_FP8_TENSOR, v1::DIRECTION_ROWWISE);
      serve(v1::RECIPE_FP8_BLOCK, v1::DIRECTION_COLUMNWISE);
      serve(v1::RECIPE_MXFP8, v1::DIRECTION_ROWWISE);
      serve(v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE);
      spec.set_max_grad_norm(0.5);
      break;
    case 2:
      spec.set_world_size(1);
      policy->set_master(v1::MASTER_TYPE_FP16);
      serve(v1::RECIPE_FP16, v1::DIRECTION_ROWWISE);
      serve(v1::RECIPE_FP8_DELAYED, v1::DIRECTION_ROWWISE)->set_amax_history(4);
      break;
    default:
      spec.set_world_size(3);
      policy->set_master(v1::MASTER_TYPE_BF16_REMAINDER);
      policy->set_exp_avg(v1::MOMENT_TYPE_FP16);
      policy->set_exp_avg_rounding(v1::ROUNDING_STOCHASTIC);
      serve(v1::RECIPE_BF16, v1::DIRECTION_COLUMNWISE);
      serve(v1::RECIPE_FP8_BLOCK, v1::DIRECTION_ROWWISE);
      break;
  }
  const absl::Status valid = ValidateRegistration(spec);
  PARAMD_CHECK(valid.ok()) << valid;
  return spec;
}

// The fuzz bytes, read front to back; past the end every read is zero.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  template <typename T>
  T Raw() {
    uint8_t bytes[sizeof(T)] = {};
    for (uint8_t& b : bytes) b = Byte();
    T value;
    std::memcpy(&value, bytes, sizeof(T));
    return value;
  }
  std::string Bytes(size_t n) {
    std::string out(n, '\0');
    for (char& c : out) c = static_cast<char>(Byte());
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

enum class OpKind { kPushGradient, kPushWeights, kCommit, kRegister };

struct Op {
  OpKind kind = OpKind::kRegister;
  int32_t rank = 0;
  int64_t step = 0;
  std::string tensor;
  int64_t offset = 0;
  std::string data;
  std::optional<double> lr;
  std::optional<double> grad_scale;
};

// The bytes a well-behaved trainer would send for [offset, offset + length) of a tensor: small
// finite values that depend on the element, step, rank and a variant byte (two variants of one
// place conflict). Element types: fp32, or bf16 (the upper half of an exactly representable fp32).
std::string CanonicalPayload(int64_t offset, int64_t length, int64_t element_bytes, int64_t step,
                             int32_t rank, uint8_t variant) {
  std::string out(static_cast<size_t>(length), '\0');
  for (int64_t i = 0; i < length; ++i) {
    const uint64_t position = static_cast<uint64_t>(offset) + static_cast<uint64_t>(i);
    const uint64_t element = position / static_cast<uint64_t>(element_bytes);
    const uint64_t mix = element * 7 + static_cast<uint64_t>(step) * 3 +
                         static_cast<uint64_t>(static_cast<uint32_t>(rank)) * 5 + variant;
    const float value = (static_cast<float>(mix % 17) - 8.0f) * 0.125f;
    const uint32_t bits = std::bit_cast<uint32_t>(value);
    const uint32_t encoded = element_bytes == 4 ? bits : bits >> 16;
    const uint64_t byte = position % static_cast<uint64_t>(element_bytes);
    out[static_cast<size_t>(i)] = static_cast<char>((encoded >> (8 * byte)) & 0xff);
  }
  return out;
}

// One operation. The first byte picks the call (low 2 bits) and which of rank, step, offset and
// payload are taken raw from the input (bits 2 to 5) instead of from small plausible ranges.
Op ReadOp(Reader& in, const v1::RegisterRequest& spec) {
  const uint8_t head = in.Byte();
  Op op;
  op.kind = static_cast<OpKind>(head & 3);
  op.rank = (head & 4) ? in.Raw<int32_t>() : static_cast<int32_t>(in.Byte() % 4) - 1;
  if (op.kind == OpKind::kRegister) return op;
  op.step = (head & 8) ? in.Raw<int64_t>() : static_cast<int64_t>(in.Byte() % 8) - 1;
  if (op.kind == OpKind::kCommit) {
    constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    constexpr double kInf = std::numeric_limits<double>::infinity();
    const std::optional<double> lrs[] = {std::nullopt, std::nullopt, 1e-3, 2e-3, kNaN, -1, 0, kInf};
    const std::optional<double> scales[] = {std::nullopt, std::nullopt, 0.5, 1, 0, -1, kInf, kNaN};
    op.lr = lrs[in.Byte() % 8];
    op.grad_scale = scales[in.Byte() % 8];
    return op;
  }
  const int index = in.Byte() % (spec.tensors_size() + 1);
  const bool known = index < spec.tensors_size();
  op.tensor = known ? spec.tensors(index).name() : kUnknownTensor;
  const bool weights = op.kind == OpKind::kPushWeights;
  const int64_t element = weights || !known ? 4 : ElementBytes(spec.tensors(index).grad_type());
  const int64_t total =
      known ? spec.tensors(index).rows() * spec.tensors(index).cols() * element : 16;
  op.offset = (head & 16) ? in.Raw<int64_t>() : int64_t{in.Byte()} * 2;
  // 0 means "to the tensor's end" (a whole tensor, or its tail, in one chunk).
  const int64_t length_byte = in.Byte();
  int64_t length = length_byte * 2;
  if (length_byte == 0 && op.offset >= 0 && op.offset < total) length = total - op.offset;
  length = std::min(length, kMaxChunkBytes);
  op.data = (head & 32) ? in.Bytes(static_cast<size_t>(length))
                        : CanonicalPayload(op.offset, length, element, op.step, op.rank, in.Byte());
  return op;
}

std::string OpText(const Op& op) {
  const char* names[] = {"PushGradient", "PushWeights", "Commit", "Register"};
  return absl::StrCat(names[static_cast<int>(op.kind)], " rank ", op.rank, " step ", op.step,
                      " tensor \"", op.tensor, "\" offset ", op.offset, " bytes ", op.data.size(),
                      " lr ", op.lr ? absl::StrCat(*op.lr) : "-", " grad_scale ",
                      op.grad_scale ? absl::StrCat(*op.grad_scale) : "-");
}

// The documented codes of each call (docs/protocol.md, data.proto; a registry validates the rank).
bool Documented(OpKind kind, absl::StatusCode code) {
  switch (kind) {
    case OpKind::kPushGradient:
    case OpKind::kPushWeights:
      return code == absl::StatusCode::kNotFound || code == absl::StatusCode::kInvalidArgument ||
             code == absl::StatusCode::kFailedPrecondition;
    case OpKind::kCommit:
      return code == absl::StatusCode::kInvalidArgument ||
             code == absl::StatusCode::kFailedPrecondition;
    case OpKind::kRegister:
      return code == absl::StatusCode::kInvalidArgument;
  }
  return false;
}

// A registry holding the one job, rank 0 registered, driven as the services drive it.
class Harness {
 public:
  explicit Harness(const v1::RegisterRequest& spec)
      : spec_(spec), registry_(SharedBackend(), Limits()) {
    absl::StatusOr<v1::RegisterResponse> registered = registry_.Register(spec_);
    PARAMD_CHECK(registered.ok()) << registered.status();
    job_ = *registry_.Find(spec_.job());
  }

  // Applies `op`; `outcome` describes what an accepted call did.
  absl::Status Apply(const Op& op, std::string* outcome) {
    switch (op.kind) {
      case OpKind::kRegister: {
        v1::RegisterRequest request = spec_;
        request.set_rank(op.rank);
        absl::StatusOr<v1::RegisterResponse> response = registry_.Register(request);
        if (!response.ok()) return response.status();
        *outcome = response->ShortDebugString();
        return absl::OkStatus();
      }
      case OpKind::kPushGradient:
      case OpKind::kPushWeights: {
        v1::PushChunk chunk;
        chunk.set_job(spec_.job());
        chunk.set_rank(op.rank);
        chunk.set_step(op.step);
        chunk.set_tensor(op.tensor);
        chunk.set_kind(op.kind == OpKind::kPushWeights ? v1::PUSH_KIND_INITIAL_WEIGHTS
                                                       : v1::PUSH_KIND_GRADIENT);
        chunk.set_offset(op.offset);
        chunk.set_data(op.data);
        absl::StatusOr<ChunkBuffer::Stored> stored = job_->Push(chunk);
        if (!stored.ok()) return stored.status();
        *outcome = *stored == ChunkBuffer::Stored::kNew ? "new" : "duplicate";
        return absl::OkStatus();
      }
      case OpKind::kCommit: {
        v1::CommitRequest request;
        request.set_job(spec_.job());
        request.set_rank(op.rank);
        request.set_step(op.step);
        if (op.lr) request.set_lr(*op.lr);
        if (op.grad_scale) request.set_grad_scale(*op.grad_scale);
        absl::StatusOr<CommitOutcome> committed = job_->Commit(request);
        if (!committed.ok()) return committed.status();
        *outcome = absl::StrCat("committed ", committed->committed_ranks, " started ",
                                committed->step_started);
        if (committed->work) {
          // As the daemon's step executor runs it; no export holds it back here.
          const std::vector<StepReport> reports = job_->RunOrHoldStep(*committed->work);
          PARAMD_CHECK(reports.size() == 1)
              << "step " << committed->work->step << " ran " << reports.size() << " steps";
          const StepReport& report = reports[0];
          absl::StrAppend(outcome, " ran step ", report.step, " skipped ", report.skipped, " clip ",
                          report.clip);
        }
        return absl::OkStatus();
      }
    }
    return absl::InternalError("unknown op");
  }

  // The job's status (less the step's wall time) and every served byte of every tensor.
  std::string Fingerprint() const {
    v1::JobStatus status = job_->Status();
    status.clear_last_step_seconds();
    std::string out = status.SerializeAsString();
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      std::shared_ptr<const ServedTensor> served =
          job_->Served(i, std::numeric_limits<int64_t>::min());
      if (served == nullptr) {
        out += "|none";
        continue;
      }
      absl::StrAppend(&out, "|v", served->version, " s", served->skipped.load());
      for (const ServedFormat& f : served->formats) {
        absl::StrAppend(&out, "|", FormatName(f.key), ":");
        out.append(reinterpret_cast<const char*>(f.bytes.data()),
                   static_cast<size_t>(f.bytes.size()));
      }
    }
    return out;
  }

 private:
  static Backend* SharedBackend() {
    static CpuBackend* const backend = new CpuBackend(1);
    return backend;
  }
  static RegistryLimits Limits() {
    RegistryLimits limits;
    limits.max_chunk_bytes = kMaxChunkBytes;
    return limits;
  }

  const v1::RegisterRequest spec_;
  JobRegistry registry_;
  std::shared_ptr<Job> job_;
};

void Fuzz(const uint8_t* data, size_t size) {
  Reader in(data, size);
  const v1::RegisterRequest spec = Spec(in.Byte());
  Harness job(spec);
  std::vector<Op> accepted;
  std::vector<std::string> outcomes;
  for (int n = 0; n < kMaxOps && !in.done(); ++n) {
    const Op op = ReadOp(in, spec);
    const std::string before = job.Fingerprint();
    std::string outcome;
    const absl::Status status = job.Apply(op, &outcome);
    if (!status.ok()) {
      PARAMD_CHECK(Documented(op.kind, status.code()))
          << "undocumented code: " << status << " for " << OpText(op);
      PARAMD_CHECK(job.Fingerprint() == before)
          << "a rejected call changed the job: " << status << " for " << OpText(op);
      continue;
    }
    accepted.push_back(op);
    outcomes.push_back(outcome);
    // A client's retry of the call that just landed.
    const std::string after = job.Fingerprint();
    std::string retried;
    const absl::Status retry = job.Apply(op, &retried);
    PARAMD_CHECK(retry.ok()) << "a retry of an accepted call failed: " << retry << " for "
                             << OpText(op) << " (first: " << outcome << ")";
    if (op.kind == OpKind::kPushGradient || op.kind == OpKind::kPushWeights) {
      PARAMD_CHECK(retried == "duplicate") << retried << " for " << OpText(op);
    }
    PARAMD_CHECK(job.Fingerprint() == after) << "a retry changed the job: " << OpText(op);
  }

  Harness replay(spec);
  for (size_t i = 0; i < accepted.size(); ++i) {
    std::string outcome;
    const absl::Status status = replay.Apply(accepted[i], &outcome);
    PARAMD_CHECK(status.ok()) << "replay of accepted call " << i << " failed: " << status << " for "
                              << OpText(accepted[i]);
    PARAMD_CHECK(outcome == outcomes[i]) << "replay of accepted call " << i << ": " << outcome
                                         << " vs " << outcomes[i] << " for " << OpText(accepted[i]);
  }
  PARAMD_CHECK(replay.Fingerprint() == job.Fingerprint())
      << "rejected calls changed the job: the replay of the " << accepted.size()
      << " accepted calls ends elsewhere";
}

}  // namespace
}  // namespace paramd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  paramd::Fuzz(data, size);
  return 0;
}
