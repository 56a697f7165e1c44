#include "client/sharded_job.h"

#include <algorithm>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/served_pieces.h"
#include "common/element_type.h"
#include "common/kernel_formats.h"
#include "common/quoted.h"
#include "common/status_macros.h"

namespace paramd {
namespace {

// Runs fn(i) for i in [0, n) on threads of their own. Returns the first error in index order
// that is not UNAVAILABLE, else the first error: where a daemon of the job is gone, the others
// answer with the job's failure, which names it and says what they hold.
template <typename Fn>
absl::Status ForEachInParallel(size_t n, Fn fn) {
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) threads.emplace_back([&, i] { status[i] = fn(i); });
  for (std::thread& t : threads) t.join();
  absl::Status first;
  for (const absl::Status& s : status) {
    if (!s.ok() && !absl::IsUnavailable(s)) return s;
    first.Update(s);
  }
  return first;
}

}  // namespace

ShardedJob::~ShardedJob() = default;

absl::StatusOr<std::unique_ptr<ShardedJob>> ShardedJob::Register(const ClientOptions& options,
                                                                 const v1::RegisterRequest& request,
                                                                 v1::RegisterResponse* response) {
  auto sharded = std::unique_ptr<ShardedJob>(new ShardedJob());
  sharded->job_ = request.job();
  sharded->world_size_ = request.world_size();
  sharded->pre_reduced_ = request.push_mode() == v1::PUSH_MODE_PRE_REDUCED;
  std::vector<Owner> owners;
  for (const std::string& daemon : request.daemons()) owners.push_back(Owner{daemon, kCpuDevice});
  PARAMD_ASSIGN_OR_RETURN(sharded->map_,
                          ComputeShardMap(JobTensorShapes(request.tensors()), std::move(owners)));
  for (int i = 0; i < request.tensors_size(); ++i) {
    const v1::TensorSpec& spec = request.tensors(i);
    Tensor t;
    t.name = spec.name();
    t.rows = spec.rows();
    t.cols = spec.cols();
    t.grad_element_bytes = ElementTypeBytes(spec.grad_type());
    t.pieces = sharded->map_.tensors[static_cast<size_t>(i)];
    sharded->index_.emplace(t.name, i);
    sharded->tensors_.push_back(std::move(t));
  }
  const size_t n = sharded->map_.owners.size();
  sharded->clients_.resize(n);
  std::vector<v1::RegisterResponse> responses(n);
  PARAMD_RETURN_IF_ERROR(ForEachInParallel(n, [&](size_t i) -> absl::Status {
    ClientOptions member = options;
    member.address = sharded->map_.owners[i].daemon;
    member.daemons.clear();
    member.daemons_count = 0;
    member.daemons_wait = std::chrono::milliseconds(0);
    PARAMD_ASSIGN_OR_RETURN(sharded->clients_[i], Client::Connect(member));
    sharded->clients_[i]->shard_member_ = true;
    PARAMD_ASSIGN_OR_RETURN(responses[i], sharded->clients_[i]->Register(request));
    return absl::OkStatus();
  }));
  *response = responses.front();
  return sharded;
}

absl::StatusOr<const ShardedJob::Tensor*> ShardedJob::Find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", Quoted(job_), " has no tensor ", Quoted(name)));
  }
  return &tensors_[static_cast<size_t>(it->second)];
}

absl::Status ShardedJob::Push(v1::PushKind kind, int32_t rank, int64_t step,
                              std::span<const PushItem> items, uintptr_t ready_event) {
  // Each owner's rows of each tensor: a contiguous range of its row-major bytes.
  std::vector<std::vector<PushItem>> by_owner(clients_.size());
  for (const PushItem& item : items) {
    PARAMD_ASSIGN_OR_RETURN(const Tensor* t, Find(item.tensor));
    const int64_t element_bytes = kind == v1::PUSH_KIND_INITIAL_WEIGHTS ? 4 : t->grad_element_bytes;
    const int64_t row_bytes = t->cols * element_bytes;
    if (static_cast<int64_t>(item.data.size()) != t->rows * row_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quoted(t->name), " of job ", Quoted(job_), " takes ",
                       t->rows * row_bytes, " bytes per push (", t->rows, " x ", t->cols, " of ",
                       element_bytes, " B); this item has ", item.data.size(),
                       ": a tensor split over daemons is pushed whole"));
    }
    for (const ShardPiece& piece : t->pieces) {
      by_owner[static_cast<size_t>(piece.owner)].push_back(PushItem{
          item.tensor,
          item.data.subspan(static_cast<size_t>(piece.row_begin * row_bytes),
                            static_cast<size_t>((piece.row_end - piece.row_begin) * row_bytes))});
    }
  }
  return ForEachInParallel(clients_.size(), [&](size_t i) -> absl::Status {
    if (by_owner[i].empty()) return absl::OkStatus();
    if (kind == v1::PUSH_KIND_GRADIENT && pre_reduced_ &&
        static_cast<int>(i) % world_size_ != rank) {
      return absl::OkStatus();  // another rank pushes this owner's part
    }
    if (kind == v1::PUSH_KIND_INITIAL_WEIGHTS) {
      return clients_[i]->UploadInitialWeights(job_, by_owner[i]);
    }
    return clients_[i]->PushGradients(job_, rank, step, by_owner[i], ready_event);
  });
}

absl::StatusOr<v1::CommitResponse> ShardedJob::Commit(int32_t rank, int64_t step,
                                                      std::optional<double> lr,
                                                      std::optional<double> grad_scale) {
  std::vector<v1::CommitResponse> responses(clients_.size());
  PARAMD_RETURN_IF_ERROR(ForEachInParallel(clients_.size(), [&](size_t i) -> absl::Status {
    PARAMD_ASSIGN_OR_RETURN(responses[i], clients_[i]->Commit(job_, rank, step, lr, grad_scale));
    return absl::OkStatus();
  }));
  return responses.front();
}

absl::Status ShardedJob::PullPieces(const PullManyTarget& target, std::chrono::milliseconds timeout,
                                    std::vector<std::vector<Pulled>>* out) {
  std::vector<const Tensor*> tensors;
  for (const std::string& name : target.tensors) {
    PARAMD_ASSIGN_OR_RETURN(const Tensor* t, Find(name));
    tensors.push_back(t);
  }
  // Per owner: the tensors it holds pieces of, in the target's order.
  struct Wanted {
    PullManyTarget target;
    std::vector<std::pair<size_t, size_t>> places;  // (tensor in target, piece)
    std::vector<Pulled> pulled;
  };
  std::vector<Wanted> wanted(clients_.size());
  out->assign(tensors.size(), {});
  for (size_t i = 0; i < tensors.size(); ++i) {
    (*out)[i].resize(tensors[i]->pieces.size());
    for (size_t p = 0; p < tensors[i]->pieces.size(); ++p) {
      Wanted& w = wanted[static_cast<size_t>(tensors[i]->pieces[p].owner)];
      w.target.tensors.push_back(tensors[i]->name);
      w.places.emplace_back(i, p);
    }
  }
  PARAMD_RETURN_IF_ERROR(ForEachInParallel(clients_.size(), [&](size_t o) -> absl::Status {
    Wanted& w = wanted[o];
    if (w.places.empty()) return absl::OkStatus();
    w.target.job = target.job;
    w.target.format = target.format;
    w.target.min_version = target.min_version;
    return clients_[o]->PullMany(w.target, timeout, &w.pulled);
  }));
  for (Wanted& w : wanted) {
    for (size_t k = 0; k < w.places.size(); ++k) {
      (*out)[w.places[k].first][w.places[k].second] = std::move(w.pulled[k]);
    }
  }
  return absl::OkStatus();
}

absl::Status ShardedJob::Assemble(const Tensor& t, const v1::ServeFormat& format,
                                  std::vector<Pulled>& pieces, Pulled* out) const {
  for (const Pulled& piece : pieces) {
    if (piece.header.version() != pieces.front().header.version()) {
      return absl::AbortedError(absl::StrCat(
          "the daemons of job ", Quoted(job_), " served versions ", pieces.front().header.version(),
          " and ", piece.header.version(), " of tensor ", Quoted(t.name), "'s pieces"));
    }
  }
  if (pieces.size() == 1) {
    *out = std::move(pieces.front());
    return absl::OkStatus();
  }
  const kernels::Recipe recipe = KernelRecipe(format.recipe());
  const kernels::Direction direction = KernelDirection(format.direction());
  const kernels::ServeBufferLayout layout = kernels::ServeLayout(recipe, direction, t.rows, t.cols);
  out->header = pieces.front().header;
  out->header.set_rows(t.rows);
  out->header.set_data_bytes(layout.data_bytes);
  out->header.set_scale_bytes(layout.scale_bytes);
  out->header.clear_scale_shape();
  if (layout.scale_count > 0) {
    out->header.add_scale_shape(layout.scale_rows);
    out->header.add_scale_shape(layout.scale_cols);
  }
  out->data.resize(static_cast<size_t>(layout.data_bytes + layout.scale_bytes));
  const std::span<uint8_t> whole(reinterpret_cast<uint8_t*>(out->data.data()), out->data.size());
  for (size_t p = 0; p < pieces.size(); ++p) {
    const ShardPiece& piece = t.pieces[p];
    const std::vector<std::byte>& bytes = pieces[p].data;
    PARAMD_RETURN_IF_ERROR(PlaceServedRange(
        recipe, direction, t.rows, t.cols, piece.row_begin, piece.row_end,
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
        whole));
  }
  return absl::OkStatus();
}

absl::Status ShardedJob::Pull(const PullTarget& target, std::chrono::milliseconds timeout,
                              Pulled* out) {
  std::vector<Pulled> many;
  PARAMD_RETURN_IF_ERROR(
      PullMany(PullManyTarget{target.job, {target.tensor}, target.format, target.min_version},
               timeout, &many));
  *out = std::move(many.front());
  return absl::OkStatus();
}

absl::Status ShardedJob::PullMany(const PullManyTarget& target, std::chrono::milliseconds timeout,
                                  std::vector<Pulled>* out) {
  std::vector<std::vector<Pulled>> pieces;
  PullManyTarget again = target;
  for (int attempt = 0;; ++attempt) {
    PARAMD_RETURN_IF_ERROR(PullPieces(again, timeout, &pieces));
    // The daemons step on their own once every rank committed: one may already serve a newer
    // version than another. Ask again for the newest version seen (a few times at most: the
    // others serve it soon).
    int64_t newest = again.min_version;
    bool same = true;
    for (const std::vector<Pulled>& tensor : pieces) {
      for (const Pulled& p : tensor) {
        same = same && p.header.version() == tensor.front().header.version();
        newest = std::max(newest, p.header.version());
      }
    }
    if (same || attempt == 3) break;
    again.min_version = newest;
  }
  out->resize(target.tensors.size());
  for (size_t i = 0; i < target.tensors.size(); ++i) {
    PARAMD_ASSIGN_OR_RETURN(const Tensor* t, Find(target.tensors[i]));
    PARAMD_RETURN_IF_ERROR(Assemble(*t, target.format, pieces[i], &(*out)[i]));
  }
  return absl::OkStatus();
}

absl::StatusOr<PulledView> ShardedJob::PullInPlace(const PullTarget& target,
                                                   std::chrono::milliseconds timeout,
                                                   std::chrono::milliseconds lease) {
  PARAMD_ASSIGN_OR_RETURN(const Tensor* t, Find(target.tensor));
  if (t->pieces.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor ", Quoted(t->name), " of job ", Quoted(job_), " is split over ", t->pieces.size(),
        " daemons: pull it by copy (Pull), which puts its pieces together, or its pieces in place "
        "(PullInPlacePieces)"));
  }
  const int owner = t->pieces.front().owner;
  PARAMD_ASSIGN_OR_RETURN(
      PulledView view, clients_[static_cast<size_t>(owner)]->PullInPlace(target, timeout, lease));
  view.owner = owner;
  return view;
}

absl::StatusOr<std::vector<PulledView>> ShardedJob::PullInPlacePieces(
    const PullTarget& target, std::chrono::milliseconds timeout, std::chrono::milliseconds lease) {
  return PullInPlaceMany({target.job, {target.tensor}, target.format, target.min_version}, timeout,
                         lease);
}

absl::StatusOr<std::vector<PulledView>> ShardedJob::PullInPlaceMany(
    const PullManyTarget& target, std::chrono::milliseconds timeout,
    std::chrono::milliseconds lease) {
  // Each owner's tensors, in the target's order, and where each piece's view comes from.
  std::vector<PullManyTarget> asks(clients_.size());
  struct From {
    int owner;
    size_t index;  // in the owner's answer
    int64_t row_begin;
  };
  std::vector<From> from;
  for (const std::string& name : target.tensors) {
    PARAMD_ASSIGN_OR_RETURN(const Tensor* t, Find(name));
    for (const ShardPiece& piece : t->pieces) {
      PullManyTarget& ask = asks[static_cast<size_t>(piece.owner)];
      from.push_back({piece.owner, ask.tensors.size(), piece.row_begin});
      ask.tensors.push_back(name);
    }
  }
  int64_t min_version = target.min_version;
  for (int attempt = 0;; ++attempt) {
    std::vector<std::vector<PulledView>> answers(clients_.size());
    std::vector<char> leased(clients_.size(), 0);
    const absl::Status pulled = ForEachInParallel(clients_.size(), [&](size_t o) -> absl::Status {
      if (asks[o].tensors.empty()) return absl::OkStatus();
      PullManyTarget ask = asks[o];
      ask.job = target.job;
      ask.format = target.format;
      ask.min_version = min_version;
      PARAMD_ASSIGN_OR_RETURN(answers[o], clients_[o]->PullInPlaceMany(ask, timeout, lease));
      leased[o] = 1;
      return absl::OkStatus();
    });
    int64_t newest = min_version;
    std::set<int64_t> versions;
    for (size_t o = 0; o < answers.size(); ++o) {
      for (const PulledView& v : answers[o]) {
        versions.insert(v.header.version());
        newest = std::max(newest, v.header.version());
      }
    }
    if (pulled.ok() && versions.size() <= 1) {
      std::vector<PulledView> views;
      views.reserve(from.size());
      for (const From& f : from) {
        PulledView view = answers[static_cast<size_t>(f.owner)][f.index];
        view.row_begin = f.row_begin;
        view.owner = f.owner;
        views.push_back(std::move(view));
      }
      return views;
    }
    // A failure, or owners at different versions (one daemon stepped on): let the leases go.
    for (size_t o = 0; o < answers.size(); ++o) {
      if (leased[o]) (void)clients_[o]->Release(answers[o]);
    }
    if (!pulled.ok()) return pulled;
    if (attempt == 3) {
      return absl::AbortedError(
          absl::StrCat("the daemons of job ", Quoted(job_), " kept serving different versions (",
                       absl::StrJoin(versions, ", "), ") after ", attempt + 1, " in-place pulls"));
    }
    min_version = newest;
  }
}

absl::Status ShardedJob::Release(std::span<const PulledView> views) {
  std::vector<std::vector<PulledView>> by_owner(clients_.size());
  for (const PulledView& view : views) {
    if (view.owner < 0 || view.owner >= static_cast<int>(clients_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("a view of owner ", view.owner, "; job ",
                                                     Quoted(job_), " has ", clients_.size()));
    }
    by_owner[static_cast<size_t>(view.owner)].push_back(view);
  }
  absl::Status status;
  for (size_t o = 0; o < by_owner.size(); ++o) {
    if (!by_owner[o].empty()) status.Update(clients_[o]->Release(by_owner[o]));
  }
  return status;
}

absl::Status ShardedJob::Release(const PulledView& view) {
  return Release(std::span<const PulledView>(&view, 1));
}

absl::StatusOr<v1::DeleteJobResponse> ShardedJob::DeleteJob() {
  std::vector<v1::DeleteJobResponse> responses(clients_.size());
  PARAMD_RETURN_IF_ERROR(ForEachInParallel(clients_.size(), [&](size_t i) -> absl::Status {
    PARAMD_ASSIGN_OR_RETURN(responses[i], clients_[i]->DeleteJob(job_));
    return absl::OkStatus();
  }));
  v1::DeleteJobResponse total;
  for (const v1::DeleteJobResponse& r : responses) {
    total.set_released_host_bytes(total.released_host_bytes() + r.released_host_bytes());
    total.set_released_device_bytes(total.released_device_bytes() + r.released_device_bytes());
  }
  return total;
}

absl::StatusOr<v1::SetHyperparamsResponse> ShardedJob::SetHyperparams(
    const v1::SetHyperparamsRequest& request) {
  std::vector<v1::SetHyperparamsResponse> responses(clients_.size());
  PARAMD_RETURN_IF_ERROR(ForEachInParallel(clients_.size(), [&](size_t i) -> absl::Status {
    PARAMD_ASSIGN_OR_RETURN(responses[i], clients_[i]->SetHyperparams(request));
    return absl::OkStatus();
  }));
  return responses.front();
}

absl::StatusOr<v1::CheckpointResponse> ShardedJob::Checkpoint() {
  std::vector<v1::CheckpointResponse> responses(clients_.size());
  PARAMD_RETURN_IF_ERROR(ForEachInParallel(clients_.size(), [&](size_t i) -> absl::Status {
    PARAMD_ASSIGN_OR_RETURN(responses[i], clients_[i]->Checkpoint(job_));
    return absl::OkStatus();
  }));
  v1::CheckpointResponse total = responses.front();
  for (size_t i = 1; i < responses.size(); ++i) {
    if (responses[i].version() != total.version()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the daemons of job ", Quoted(job_), " checkpointed versions ", total.version(), " (",
          map_.owners[0].daemon, ") and ", responses[i].version(), " (", map_.owners[i].daemon,
          "): checkpoint once every rank pulled the newest version"));
    }
    total.set_bytes(total.bytes() + responses[i].bytes());
  }
  return total;
}

namespace {

// How a field of a split tensor's state is cut into its pieces (client/job_state.h).
enum class FieldCut { kRows, kChunks, kSame };

FieldCut CutOf(const std::string& field) {
  if (field == "exp_avg_scales" || field == "exp_avg_sq_scales") return FieldCut::kChunks;
  if (field == "fp8_tensor_scale" || field == "fp8_delayed_scale" ||
      field == "fp8_delayed_history") {
    return FieldCut::kSame;
  }
  return FieldCut::kRows;  // master, master_remainder, exp_avg, exp_avg_sq
}

int64_t Chunks(int64_t elements) { return (elements + 127) / 128; }

// Rows [begin, end) of a [rows, cols] tensor's field: its elements, or its chunk scales (a piece
// starts at a multiple of 128 rows, so at a chunk boundary).
std::pair<int64_t, int64_t> ElementsOf(FieldCut cut, int64_t cols, int64_t begin, int64_t end) {
  if (cut == FieldCut::kChunks) return {begin * cols / 128, Chunks(end * cols)};
  return {begin * cols, end * cols};
}

}  // namespace

absl::StatusOr<JobState> ShardedJob::ExportState() {
  std::vector<JobState> parts(clients_.size());
  PARAMD_RETURN_IF_ERROR(ForEachInParallel(clients_.size(), [&](size_t i) -> absl::Status {
    PARAMD_ASSIGN_OR_RETURN(parts[i], clients_[i]->ExportState(job_));
    return absl::OkStatus();
  }));
  JobState whole = parts.front();
  whole.fields.clear();
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].next_step != whole.next_step || parts[i].applied_steps != whole.applied_steps) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the daemons of job ", Quoted(job_), " exported their parts at step ", whole.next_step,
          " (", map_.owners[0].daemon, ") and ", parts[i].next_step, " (", map_.owners[i].daemon,
          "): export once every rank pulled the newest version"));
    }
  }
  // Each daemon's fields by (tensor, field).
  std::vector<std::map<std::pair<std::string, std::string>, StateField*>> by_name(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    for (StateField& f : parts[i].fields) by_name[i][{f.tensor, f.field}] = &f;
  }
  for (const Tensor& t : tensors_) {
    const size_t first_owner = static_cast<size_t>(t.pieces.front().owner);
    for (const StateField& f : parts[first_owner].fields) {
      if (f.tensor != t.name) continue;
      StateField& out = whole.fields.emplace_back();
      out.tensor = f.tensor;
      out.field = f.field;
      out.type = f.type;
      const FieldCut cut = CutOf(f.field);
      out.shape = cut == FieldCut::kRows     ? std::vector<int64_t>{t.rows, t.cols}
                  : cut == FieldCut::kChunks ? std::vector<int64_t>{Chunks(t.rows * t.cols)}
                                             : f.shape;
      for (const ShardPiece& piece : t.pieces) {
        const auto found = by_name[static_cast<size_t>(piece.owner)].find({f.tensor, f.field});
        if (found == by_name[static_cast<size_t>(piece.owner)].end()) {
          return absl::DataLossError(
              absl::StrCat("daemon ", map_.owners[static_cast<size_t>(piece.owner)].daemon,
                           " exported no field ", Quoted(f.field), " of tensor ", Quoted(t.name)));
        }
        const StateField& part = *found->second;
        if (cut == FieldCut::kSame) {
          // The owners agreed on the whole tensor's amax, so on these.
          if (part.bytes != f.bytes) {
            return absl::DataLossError(
                absl::StrCat("the owners of tensor ", Quoted(t.name), " exported different ",
                             f.field, " (", map_.owners[first_owner].daemon, " and ",
                             map_.owners[static_cast<size_t>(piece.owner)].daemon, ")"));
          }
          out.bytes = f.bytes;
          continue;
        }
        const auto [begin, end] = ElementsOf(cut, t.cols, piece.row_begin, piece.row_end);
        const size_t want = static_cast<size_t>((end - begin) * ElementTypeBytes(f.type));
        if (part.bytes.size() != want) {
          return absl::DataLossError(absl::StrCat(
              "daemon ", map_.owners[static_cast<size_t>(piece.owner)].daemon, " exported ",
              part.bytes.size(), " bytes of ", f.field, " of tensor ", Quoted(t.name), " rows [",
              piece.row_begin, ", ", piece.row_end, "); its part has ", want));
        }
        out.bytes.insert(out.bytes.end(), part.bytes.begin(), part.bytes.end());
      }
    }
  }
  return whole;
}

absl::Status ShardedJob::ImportState(const JobState& state) {
  if (state.job != job_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the state is of job ", Quoted(state.job), ", not ", Quoted(job_)));
  }
  std::map<std::pair<std::string, std::string>, const StateField*> fields;
  for (const StateField& f : state.fields) {
    if (!index_.contains(f.tensor)) {
      return absl::InvalidArgumentError(absl::StrCat("the state has field ", Quoted(f.field),
                                                     " of tensor ", Quoted(f.tensor),
                                                     ", which job ", Quoted(job_), " has not"));
    }
    if (!fields.emplace(std::make_pair(f.tensor, f.field), &f).second) {
      return absl::InvalidArgumentError(absl::StrCat("the state has field ", Quoted(f.field),
                                                     " of tensor ", Quoted(f.tensor), " twice"));
    }
    int64_t elements = 1;
    for (int64_t d : f.shape) elements *= d;
    if (elements < 0 ||
        f.bytes.size() != static_cast<size_t>(elements * ElementTypeBytes(f.type))) {
      return absl::InvalidArgumentError(absl::StrCat("field ", Quoted(f.field), " of tensor ",
                                                     Quoted(f.tensor), " holds ", f.bytes.size(),
                                                     " bytes, not what its type and shape say"));
    }
    const Tensor& t = tensors_[static_cast<size_t>(index_.at(f.tensor))];
    const FieldCut cut = CutOf(f.field);
    const bool shaped =
        cut == FieldCut::kRows
            ? f.shape == std::vector<int64_t>{t.rows, t.cols}
            : cut != FieldCut::kChunks || f.shape == std::vector<int64_t>{Chunks(t.rows * t.cols)};
    if (!shaped) {
      return absl::InvalidArgumentError(absl::StrCat("field ", Quoted(f.field), " of tensor ",
                                                     Quoted(f.tensor),
                                                     " does not have the tensor's shape"));
    }
  }
  // Each daemon's part: the fields of the tensors it holds, a split tensor's cut to its rows.
  std::vector<JobState> parts(clients_.size());
  for (JobState& part : parts) {
    part = state;
    part.fields.clear();
  }
  for (const StateField& f : state.fields) {
    const Tensor& t = tensors_[static_cast<size_t>(index_.at(f.tensor))];
    const FieldCut cut = CutOf(f.field);
    for (const ShardPiece& piece : t.pieces) {
      StateField& out = parts[static_cast<size_t>(piece.owner)].fields.emplace_back();
      out.tensor = f.tensor;
      out.field = f.field;
      out.type = f.type;
      if (cut == FieldCut::kSame) {
        out.shape = f.shape;
        out.bytes = f.bytes;
        continue;
      }
      const auto [begin, end] = ElementsOf(cut, t.cols, piece.row_begin, piece.row_end);
      out.shape = cut == FieldCut::kRows
                      ? std::vector<int64_t>{piece.row_end - piece.row_begin, t.cols}
                      : std::vector<int64_t>{end - begin};
      const int64_t size = ElementTypeBytes(f.type);
      out.bytes.assign(f.bytes.begin() + static_cast<std::ptrdiff_t>(begin * size),
                       f.bytes.begin() + static_cast<std::ptrdiff_t>(end * size));
    }
  }
  // One daemon after another: the first refusal (a header the job does not take is refused by
  // the first daemon, before any imported) ends it, naming the daemons that imported their part.
  std::vector<std::string> imported;
  for (size_t i = 0; i < clients_.size(); ++i) {
    const absl::Status status = clients_[i]->ImportState(parts[i]);
    if (!status.ok()) {
      if (imported.empty()) return status;
      return absl::Status(
          status.code(),
          absl::StrCat(status.message(), " (daemon ", map_.owners[i].daemon, "; the daemons ",
                       absl::StrJoin(imported, ", "),
                       " imported their parts: import the state again, or restore a checkpoint)"));
    }
    imported.push_back(map_.owners[i].daemon);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RestoreResponse> ShardedJob::Restore(const std::string& path) {
  std::vector<v1::RestoreResponse> responses(clients_.size());
  PARAMD_RETURN_IF_ERROR(ForEachInParallel(clients_.size(), [&](size_t i) -> absl::Status {
    PARAMD_ASSIGN_OR_RETURN(responses[i], clients_[i]->Restore(job_, path));
    return absl::OkStatus();
  }));
  v1::RestoreResponse total = responses.front();
  for (size_t i = 1; i < responses.size(); ++i) {
    if (responses[i].version() != total.version()) {
      return absl::DataLossError(
          absl::StrCat("the daemons of job ", Quoted(job_), " restored versions ", total.version(),
                       " (", map_.owners[0].daemon, ") and ", responses[i].version(), " (",
                       map_.owners[i].daemon, "): restore each from checkpoints of one version"));
    }
    total.set_bytes(total.bytes() + responses[i].bytes());
  }
  return total;
}

std::string ShardedJob::transports() const {
  std::vector<std::string> names;
  for (size_t i = 0; i < clients_.size(); ++i) {
    names.push_back(absl::StrCat(map_.owners[i].daemon, "=", clients_[i]->transport_name()));
  }
  return absl::StrJoin(names, ",");
}

std::vector<Client::OwnerTransport> ShardedJob::transport_traits() const {
  std::vector<Client::OwnerTransport> owners;
  for (size_t i = 0; i < clients_.size(); ++i) {
    for (Client::OwnerTransport owner : clients_[i]->transport_traits()) {
      owner.daemon = map_.owners[i].daemon;
      owners.push_back(std::move(owner));
    }
  }
  return owners;
}

}  // namespace paramd
