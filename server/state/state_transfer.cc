#include "server/state/state_transfer.h"

#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/element_type.h"
#include "common/status_macros.h"
#include "server/backend/initial_state.h"
#include "server/registration.h"

namespace paramd {
namespace {

std::string ShapeText(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string FieldText(const std::string& tensor, const std::string& field) {
  return absl::StrCat("field \"", field, "\" of tensor \"", tensor, "\"");
}

// The host bytes of a scalar field of a tensor (its TensorScalars).
std::span<const uint8_t> ScalarBytes(const TensorScalars& scalars, StateFieldKind kind) {
  switch (kind) {
    case StateFieldKind::kFp8TensorScale:
      return {reinterpret_cast<const uint8_t*>(&scalars.fp8_tensor_scale), sizeof(float)};
    case StateFieldKind::kFp8DelayedScale:
      return {reinterpret_cast<const uint8_t*>(&scalars.fp8_delayed_scale), sizeof(float)};
    case StateFieldKind::kFp8DelayedHistory:
      return {reinterpret_cast<const uint8_t*>(scalars.delayed_history.data()),
              scalars.delayed_history.size() * sizeof(float)};
    default:
      return {};
  }
}

bool PositiveFinite(float x) { return std::isfinite(x) && x > 0.0f; }

}  // namespace

// ---- Export ----

void StateExport::Begin(std::shared_ptr<ExportedJob> job, int64_t max_chunk_bytes, Ready ready) {
  ExportedJob* const j = job.get();
  j->BeginExport([job = std::move(job), max_chunk_bytes, ready = std::move(ready)](
                     absl::StatusOr<ExportedJob::Snapshot> snapshot) mutable {
    if (!snapshot.ok()) {
      ready(snapshot.status());
      return;
    }
    ready(std::unique_ptr<StateExport>(new StateExport(std::move(job), *std::move(snapshot),
                                                       std::max<int64_t>(1, max_chunk_bytes))));
  });
}

absl::StatusOr<std::unique_ptr<StateExport>> StateExport::BeginAndWait(
    std::shared_ptr<ExportedJob> job, int64_t max_chunk_bytes) {
  absl::Notification started;
  absl::StatusOr<std::unique_ptr<StateExport>> result;
  Begin(std::move(job), max_chunk_bytes, [&](absl::StatusOr<std::unique_ptr<StateExport>> e) {
    result = std::move(e);
    started.Notify();
  });
  started.WaitForNotification();
  return result;
}

StateExport::StateExport(std::shared_ptr<ExportedJob> job, ExportedJob::Snapshot snapshot,
                         int64_t max_chunk_bytes)
    : job_(std::move(job)), snapshot_(std::move(snapshot)), max_chunk_bytes_(max_chunk_bytes) {}

StateExport::~StateExport() { job_->EndExport(); }

absl::Status StateExport::LoadTensor() {
  const ExportedJob::Tensor& t = snapshot_.tensors[tensor_];
  fields_ = TensorStateFields(t.info, snapshot_.formats);
  PARAMD_ASSIGN_OR_RETURN(scalars_, snapshot_.backend->ReadStateScalars(*t.state));
  for (StateFieldSpec& f : fields_) {
    if (f.kind == StateFieldKind::kFp8DelayedHistory) {
      f.shape = {static_cast<int64_t>(scalars_.delayed_history.size())};
    }
  }
  field_ = 0;
  offset_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<bool> StateExport::Next(v1::StateChunk* chunk) {
  chunk->Clear();
  if (!header_sent_) {
    *chunk->mutable_header() = snapshot_.header;
    header_sent_ = true;
    return true;
  }
  while (tensor_ < snapshot_.tensors.size()) {
    if (fields_.empty()) PARAMD_RETURN_IF_ERROR(LoadTensor());
    if (field_ == fields_.size()) {
      ++tensor_;
      fields_.clear();
      continue;
    }
    const ExportedJob::Tensor& t = snapshot_.tensors[tensor_];
    const StateFieldSpec& f = fields_[field_];
    const int64_t total = f.bytes();
    if (offset_ == 0) {
      v1::StateField* field = chunk->mutable_field();
      field->set_tensor(t.name);
      field->set_field(f.name);
      field->set_type(f.type);
      for (int64_t d : f.shape) field->add_shape(d);
    }
    chunk->set_offset(offset_);
    const int64_t length = std::min(max_chunk_bytes_, total - offset_);
    std::string* data = chunk->mutable_data();
    data->resize(static_cast<size_t>(length));
    const std::span<uint8_t> out(reinterpret_cast<uint8_t*>(data->data()),
                                 static_cast<size_t>(length));
    if (f.array) {
      PARAMD_RETURN_IF_ERROR(snapshot_.backend->ReadStateArray(*t.state, *f.array, offset_, out));
    } else if (length > 0) {
      std::memcpy(out.data(), ScalarBytes(scalars_, f.kind).data() + offset_, out.size());
    }
    offset_ += length;
    if (offset_ >= total) {
      ++field_;
      offset_ = 0;
    }
    return true;
  }
  return false;
}

// ---- Import ----

StateImport::StateImport(const v1::RegisterRequest& spec, int64_t max_chunk_bytes, bool stage_ahead)
    : spec_(spec), max_chunk_bytes_(max_chunk_bytes) {
  const std::vector<FormatKey> formats = ServedFormats(spec);
  size_t fields = 0;
  for (int i = 0; i < spec.tensors_size(); ++i) {
    expected_.push_back(TensorStateFields(TensorInfoOf(spec, i), formats));
    seen_.emplace_back(expected_.back().size(), false);
    first_field_.push_back(fields);
    fields += expected_.back().size();
  }
  staged_.tensors.resize(static_cast<size_t>(spec.tensors_size()));
  if (stage_ahead) {
    ahead_ = std::thread([this] { StageAhead(); });
  } else {
    staged_ahead_ = fields;
  }
}

StateImport::~StateImport() { StopStagingAhead(); }

void StateImport::StageAhead() {
  for (size_t t = 0; t < expected_.size(); ++t) {
    for (const StateFieldSpec& f : expected_[t]) {
      {
        absl::MutexLock lock(&ahead_mu_);
        if (stop_ahead_) return;
      }
      // The scalars are the caller's to size (a history may be shorter than its capacity).
      if (f.array) {
        try {
          Stage(staged_.tensors[t], f, f.elements());
        } catch (const std::bad_alloc&) {
          absl::MutexLock lock(&ahead_mu_);  // its release wakes AwaitStagedAhead
          ahead_status_ = absl::ResourceExhaustedError(
              absl::StrCat("no host memory to stage ",
                           FieldText(spec_.tensors(static_cast<int>(t)).name(), f.name), " (",
                           f.bytes(), " bytes)"));
          return;
        }
      }
      absl::MutexLock lock(&ahead_mu_);
      ++staged_ahead_;
    }
  }
}

absl::Status StateImport::AwaitStagedAhead(int tensor, size_t field) {
  const size_t index = first_field_[static_cast<size_t>(tensor)] + field;
  absl::MutexLock lock(&ahead_mu_);
  const auto staged = [this, index]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ahead_mu_) {
    return staged_ahead_ > index || !ahead_status_.ok();
  };
  ahead_mu_.Await(absl::Condition(&staged));
  return ahead_status_;
}

void StateImport::StopStagingAhead() {
  if (!ahead_.joinable()) return;
  {
    absl::MutexLock lock(&ahead_mu_);
    stop_ahead_ = true;
  }
  ahead_.join();
}

absl::Status StateImport::CheckHeader(const v1::StateHeader& h) const {
  auto invalid = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("state for job \"", spec_.job(), "\": ", what));
  };
  if (h.job() != spec_.job()) {
    return invalid(absl::StrCat("the header names job \"", h.job(), "\""));
  }
  if (h.next_step() < 0 || h.applied_steps() < 0 || h.skipped_steps() < 0 ||
      h.applied_steps() > h.next_step() || h.skipped_steps() != h.next_step() - h.applied_steps()) {
    return invalid(absl::StrCat("next_step ", h.next_step(), ", applied_steps ", h.applied_steps(),
                                " and skipped_steps ", h.skipped_steps(),
                                " must be >= 0 with applied_steps + skipped_steps = next_step"));
  }
  if (h.seed() != spec_.seed()) {
    return invalid(absl::StrCat("seed ", h.seed(), " differs from the job's registered seed ",
                                spec_.seed(), " (stochastic rounding would draw other bits)"));
  }
  const v1::AdamwHyperparams& registered = spec_.hyperparams();
  const v1::AdamwHyperparams& hyper = h.hyperparams();
  if (hyper.beta1() != registered.beta1() || hyper.beta2() != registered.beta2() ||
      hyper.eps() != registered.eps()) {
    return invalid(absl::StrCat("hyperparams beta1 ", hyper.beta1(), ", beta2 ", hyper.beta2(),
                                ", eps ", hyper.eps(), " differ from the registered ",
                                registered.beta1(), ", ", registered.beta2(), ", ",
                                registered.eps()));
  }
  if (!(std::isfinite(hyper.lr()) && hyper.lr() > 0)) {
    return invalid(absl::StrCat("hyperparams lr = ", hyper.lr(), " must be finite and > 0"));
  }
  if (!(std::isfinite(hyper.weight_decay()) && hyper.weight_decay() >= 0)) {
    return invalid(absl::StrCat("hyperparams weight_decay = ", hyper.weight_decay(),
                                " must be finite and >= 0"));
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(h.state_policy(), spec_.state_policy())) {
    return invalid(absl::StrCat("state_policy {", h.state_policy().ShortDebugString(),
                                "} differs from the job's {",
                                spec_.state_policy().ShortDebugString(), "}"));
  }
  return absl::OkStatus();
}

uint8_t* StateImport::Stage(HostTensorState& state, const StateFieldSpec& spec, int64_t elements) {
  const size_t n = static_cast<size_t>(elements);
  const size_t bytes = static_cast<size_t>(elements * ElementTypeBytes(spec.type));
  switch (spec.kind) {
    // Zeroed here: staged ahead, this faults the field's pages in before its bytes arrive.
    case StateFieldKind::kMaster:
      ResizeZeroed(state.master, bytes);
      return state.master.data();
    case StateFieldKind::kMasterRemainder:
      ResizeZeroed(state.remainder, n);
      return reinterpret_cast<uint8_t*>(state.remainder.data());
    case StateFieldKind::kExpAvg:
      ResizeZeroed(state.exp_avg, bytes);
      return state.exp_avg.data();
    case StateFieldKind::kExpAvgScales:
      ResizeZeroed(state.exp_avg_scale_inv, n);
      return reinterpret_cast<uint8_t*>(state.exp_avg_scale_inv.data());
    case StateFieldKind::kExpAvgSq:
      ResizeZeroed(state.exp_avg_sq, bytes);
      return state.exp_avg_sq.data();
    case StateFieldKind::kExpAvgSqScales:
      ResizeZeroed(state.exp_avg_sq_scale_inv, n);
      return reinterpret_cast<uint8_t*>(state.exp_avg_sq_scale_inv.data());
    case StateFieldKind::kFp8TensorScale:
      return reinterpret_cast<uint8_t*>(&state.scalars.fp8_tensor_scale);
    case StateFieldKind::kFp8DelayedScale:
      return reinterpret_cast<uint8_t*>(&state.scalars.fp8_delayed_scale);
    case StateFieldKind::kFp8DelayedHistory:
      state.scalars.delayed_history.resize(n);
      return reinterpret_cast<uint8_t*>(state.scalars.delayed_history.data());
  }
  return nullptr;
}

absl::Status StateImport::StartField(const v1::StateField& field) {
  const std::string where = FieldText(field.tensor(), field.field());
  auto invalid = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
  };
  int tensor = -1;
  for (int i = 0; i < spec_.tensors_size(); ++i) {
    if (spec_.tensors(i).name() == field.tensor()) tensor = i;
  }
  if (tensor < 0) return invalid(absl::StrCat("job \"", spec_.job(), "\" has no such tensor"));
  const std::vector<StateFieldSpec>& fields = expected_[static_cast<size_t>(tensor)];
  size_t index = fields.size();
  std::vector<std::string> names;
  for (size_t f = 0; f < fields.size(); ++f) {
    names.push_back(fields[f].name);
    if (fields[f].name == field.field()) index = f;
  }
  if (index == fields.size()) {
    return invalid(
        absl::StrCat("the job keeps no such field under its state policy and serve "
                     "formats; its fields are ",
                     absl::StrJoin(names, ", ")));
  }
  if (seen_[static_cast<size_t>(tensor)][index]) return invalid("sent twice");
  const StateFieldSpec& expected = fields[index];
  if (field.type() != expected.type) {
    return invalid(absl::StrCat("type ", v1::ElementType_Name(field.type()),
                                " differs from the stored ", v1::ElementType_Name(expected.type)));
  }
  const std::vector<int64_t> shape(field.shape().begin(), field.shape().end());
  if (expected.kind == StateFieldKind::kFp8DelayedHistory) {
    if (shape.size() != 1 || shape[0] < 0 || shape[0] > expected.shape[0]) {
      return invalid(absl::StrCat("shape ", ShapeText(shape), " must be [n] with 0 <= n <= ",
                                  expected.shape[0], " (the job's amax_history)"));
    }
  } else if (shape != expected.shape) {
    return invalid(absl::StrCat("shape ", ShapeText(shape), " differs from the stored ",
                                ShapeText(expected.shape)));
  }
  PARAMD_RETURN_IF_ERROR(AwaitStagedAhead(tensor, index));
  seen_[static_cast<size_t>(tensor)][index] = true;
  StateFieldSpec actual = expected;
  actual.shape = shape;
  in_field_ = true;
  tensor_ = tensor;
  field_ = index;
  size_ = actual.bytes();
  received_ = 0;
  dest_ = Stage(staged_.tensors[static_cast<size_t>(tensor)], actual, actual.elements());
  ++staged_.fields;
  return absl::OkStatus();
}

absl::Status StateImport::Add(const v1::StateChunk& chunk) { return Add(chunk, chunk.data()); }

absl::Status StateImport::Add(const v1::StateChunk& chunk, std::string_view data) {
  if (static_cast<int64_t>(data.size()) > max_chunk_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "state chunk of ", data.size(), " bytes exceeds this daemon's max_chunk_bytes (",
        max_chunk_bytes_, "); send fields in chunks of at most that size"));
  }
  if (chunk.has_header()) {
    if (have_header_) {
      return absl::InvalidArgumentError(
          "a state stream carries its header on the first chunk only");
    }
    PARAMD_RETURN_IF_ERROR(CheckHeader(chunk.header()));
    staged_.header = chunk.header();
    have_header_ = true;
  } else if (!have_header_) {
    return absl::InvalidArgumentError(
        "the first chunk of a state stream must carry the StateHeader");
  }
  const auto current = [&] {
    return FieldText(spec_.tensors(tensor_).name(),
                     expected_[static_cast<size_t>(tensor_)][field_].name);
  };
  if (chunk.has_field()) {
    if (in_field_ && received_ != size_) {
      return absl::InvalidArgumentError(
          absl::StrCat(current(), " ended after ", received_, " of its ", size_, " bytes"));
    }
    PARAMD_RETURN_IF_ERROR(StartField(chunk.field()));
  } else if (!data.empty() && !in_field_) {
    return absl::InvalidArgumentError(
        "state bytes arrived before any field; the chunk that begins a field names it");
  }
  if (!in_field_) return absl::OkStatus();
  const int64_t length = static_cast<int64_t>(data.size());
  if (chunk.offset() != received_ || length > size_ - received_) {
    return absl::InvalidArgumentError(absl::StrCat(current(), ": chunk at offset ", chunk.offset(),
                                                   " with ", length, " bytes; expected offset ",
                                                   received_, " and at most ", size_ - received_,
                                                   " more bytes (the field has ", size_, ")"));
  }
  if (length > 0) std::memcpy(dest_ + received_, data.data(), static_cast<size_t>(length));
  received_ += length;
  staged_.bytes += length;
  return absl::OkStatus();
}

absl::StatusOr<StagedState> StateImport::Finish(bool new_serve_formats) {
  StopStagingAhead();
  if (!have_header_) {
    return absl::InvalidArgumentError("the state stream is empty; it starts with a StateHeader");
  }
  for (size_t t = 0; t < expected_.size(); ++t) {
    for (size_t f = 0; f < expected_[t].size(); ++f) {
      const std::string where =
          FieldText(spec_.tensors(static_cast<int>(t)).name(), expected_[t][f].name);
      const StateFieldKind kind = expected_[t][f].kind;
      if (!seen_[t][f] && new_serve_formats &&
          (kind == StateFieldKind::kFp8TensorScale || kind == StateFieldKind::kFp8DelayedScale ||
           kind == StateFieldKind::kFp8DelayedHistory)) {
        HostTensorState& s = staged_.tensors[t];
        if (kind == StateFieldKind::kFp8TensorScale) {
          s.scalars.fp8_tensor_scale =
              InitialFp8TensorScale(TensorInfoOf(spec_, static_cast<int>(t)), s);
        } else if (kind == StateFieldKind::kFp8DelayedScale) {
          s.scalars.fp8_delayed_scale = 1.0f;
        }  // the history stays empty
        seen_[t][f] = true;
      }
      if (!seen_[t][f]) {
        return absl::InvalidArgumentError(absl::StrCat(where, " is missing from the state"));
      }
      if (static_cast<int>(t) == tensor_ && f == field_ && received_ != size_) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " ended after ", received_, " of its ", size_, " bytes"));
      }
      // Scales are read as divisors and multipliers: positive and finite, or the import would
      // publish garbage.
      const HostTensorState& s = staged_.tensors[t];
      const AlignedVector<float>* scales = nullptr;
      float scalar = 1.0f;
      switch (expected_[t][f].kind) {
        case StateFieldKind::kExpAvgScales:
          scales = &s.exp_avg_scale_inv;
          break;
        case StateFieldKind::kExpAvgSqScales:
          scales = &s.exp_avg_sq_scale_inv;
          break;
        case StateFieldKind::kFp8TensorScale:
          scalar = s.scalars.fp8_tensor_scale;
          break;
        case StateFieldKind::kFp8DelayedScale:
          scalar = s.scalars.fp8_delayed_scale;
          break;
        default:
          break;
      }
      if (!PositiveFinite(scalar)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " is ", scalar, "; a scale must be finite and > 0"));
      }
      if (scales != nullptr) {
        for (size_t i = 0; i < scales->size(); ++i) {
          if (!PositiveFinite((*scales)[i])) {
            return absl::InvalidArgumentError(absl::StrCat(
                where, ": element ", i, " is ", (*scales)[i], "; scales must be finite and > 0"));
          }
        }
      }
    }
  }
  return std::move(staged_);
}

}  // namespace paramd
