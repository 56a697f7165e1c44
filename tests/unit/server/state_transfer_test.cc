// State export and import at the job level (server/state/state_transfer.h) on a real CpuBackend:
// export -> import into a fresh job -> continue is bit-identical to uninterrupted training for
// every served format (fp8_tensor and fp8_delayed included) under the fp32 policy and fp8 states
// with stochastic rounding; refused imports (a step collecting or queued, any mismatch) change
// nothing; an export holds steps back without blocking the step executor. And the step publishes
// tensor by tensor: a pull of tensor 0 completes while the last tensor is not yet published.
#include "server/state/state_transfer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/backend/cpu_backend.h"
#include "server/job/job.h"
#include "tests/unit/server/push_chunks.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/run_taken_step.h"

namespace paramd {
namespace {

using testing::ForRank;
using testing::FromBytes;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::RunTakenStep;
using testing::StepGradients;
using testing::ToBytes;

constexpr int64_t kMaxChunkBytes = 1 << 20;
constexpr int64_t kPushChunkBytes = 8192;

struct TransferCase {
  std::string name;
  v1::StatePolicy policy;
};
void PrintTo(const TransferCase& c, std::ostream* os) { *os << c.name; }

v1::StatePolicy Policy(v1::MasterType master, v1::MomentType m, v1::MomentType v,
                       v1::Rounding m_rounding, v1::Rounding v_rounding) {
  v1::StatePolicy p;
  p.set_master(master);
  p.set_exp_avg(m);
  p.set_exp_avg_sq(v);
  p.set_exp_avg_rounding(m_rounding);
  p.set_exp_avg_sq_rounding(v_rounding);
  return p;
}

std::vector<TransferCase> Cases() {
  return {
      {"Fp32", v1::StatePolicy()},
      {"Fp8StatesStochastic", Policy(v1::MASTER_TYPE_FP32, v1::MOMENT_TYPE_FP8, v1::MOMENT_TYPE_FP8,
                                     v1::ROUNDING_STOCHASTIC, v1::ROUNDING_STOCHASTIC)},
      {"Bf16RemainderMasterFp16Moments",
       Policy(v1::MASTER_TYPE_BF16_REMAINDER, v1::MOMENT_TYPE_FP16, v1::MOMENT_TYPE_FP16,
              v1::ROUNDING_NEAREST, v1::ROUNDING_STOCHASTIC)},
      {"Fp16MasterBf16Moments",
       Policy(v1::MASTER_TYPE_FP16, v1::MOMENT_TYPE_BF16, v1::MOMENT_TYPE_BF16,
              v1::ROUNDING_STOCHASTIC, v1::ROUNDING_NEAREST)},
  };
}

// Two ranks; one element, odd shapes, several 128-row panels, a 1-D tensor. Serves every recipe
// with per-tensor state (fp8_tensor both ways, fp8_delayed with a short history so it wraps) and a
// block one.
v1::RegisterRequest Spec(const v1::StatePolicy& policy) {
  v1::RegisterRequest spec = MakeSpec("transfer", 2,
                                      {{"scalar", 1, 1, v1::ELEMENT_TYPE_FP32},
                                       {"odd", 7, 13, v1::ELEMENT_TYPE_BF16},
                                       {"panels", 131, 257, v1::ELEMENT_TYPE_FP32},
                                       {"vector", 1, 1000, v1::ELEMENT_TYPE_BF16}});
  *spec.mutable_state_policy() = policy;
  auto serve = [&spec](v1::Recipe recipe, v1::Direction direction) {
    v1::ServeFormat* f = spec.add_serve();
    f->set_recipe(recipe);
    f->set_direction(direction);
    if (recipe == v1::RECIPE_FP8_DELAYED) f->set_amax_history(3);
    return f;
  };
  serve(v1::RECIPE_FP16, v1::DIRECTION_ROWWISE);
  serve(v1::RECIPE_FP8_TENSOR, v1::DIRECTION_ROWWISE);
  serve(v1::RECIPE_FP8_TENSOR, v1::DIRECTION_COLUMNWISE);
  serve(v1::RECIPE_FP8_DELAYED, v1::DIRECTION_ROWWISE);
  serve(v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE);
  return spec;
}

// Every served byte of one version: [tensor][format].
using Snapshot = std::vector<std::vector<std::vector<uint8_t>>>;

// Drives one Job the way the services do; the step a last commit hands over runs at once.
class Driver {
 public:
  Driver(const v1::RegisterRequest& spec, Backend* backend)
      : spec_(spec), job_(std::make_shared<Job>(spec, backend)) {
    for (int r = 0; r < spec.world_size(); ++r) {
      EXPECT_TRUE(job_->Register(ForRank(spec, r), kMaxChunkBytes).ok());
    }
  }

  Job& job() { return *job_; }
  std::shared_ptr<Job> shared() { return job_; }

  absl::Status Push(int rank, int64_t step, int tensor, const std::string& bytes,
                    v1::PushKind kind = v1::PUSH_KIND_GRADIENT) {
    return testing::PushInChunks(*job_, spec_, rank, step, tensor, bytes, kPushChunkBytes, kind);
  }

  absl::Status Upload(const std::vector<std::vector<float>>& initial) {
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      absl::Status s =
          Push(0, 0, i, ToBytes(initial[static_cast<size_t>(i)]), v1::PUSH_KIND_INITIAL_WEIGHTS);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Every rank pushes and commits `step`; the work the last commit hands over.
  absl::StatusOr<StepWork> PushAndCommit(int64_t step, const StepGradients& grads,
                                         std::optional<double> lr) {
    for (int r = 0; r < spec_.world_size(); ++r) {
      for (int i = 0; i < spec_.tensors_size(); ++i) {
        absl::Status s = Push(r, step, i, grads[static_cast<size_t>(i)][static_cast<size_t>(r)]);
        if (!s.ok()) return s;
      }
    }
    std::optional<StepWork> work;
    for (int r = 0; r < spec_.world_size(); ++r) {
      v1::CommitRequest request;
      request.set_job(spec_.job());
      request.set_rank(r);
      request.set_step(step);
      if (lr) request.set_lr(*lr);
      request.set_grad_scale(0.5);
      absl::StatusOr<CommitOutcome> outcome = job_->Commit(request);
      if (!outcome.ok()) return outcome.status();
      if (outcome->work) work = outcome->work;
    }
    if (!work) return absl::InternalError("no commit handed the step over");
    return *work;
  }

  absl::StatusOr<StepReport> Step(int64_t step, const StepGradients& grads,
                                  std::optional<double> lr) {
    absl::StatusOr<StepWork> work = PushAndCommit(step, grads, lr);
    if (!work.ok()) return work.status();
    return RunTakenStep(*job_, *work);
  }

  // Every served byte of the newest version, which must be `version`.
  Snapshot Served(int64_t version) const {
    Snapshot out;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      std::shared_ptr<const ServedTensor> served = job_->Served(i, version);
      EXPECT_TRUE(served != nullptr && served->version == version)
          << "tensor " << i << " has not published version " << version;
      std::vector<std::vector<uint8_t>>& formats = out.emplace_back();
      if (served == nullptr) continue;
      for (const ServedFormat& f : served->formats) {
        const auto* data = reinterpret_cast<const uint8_t*>(f.bytes.data());
        formats.emplace_back(data, data + f.bytes.size());
      }
    }
    return out;
  }

  absl::StatusOr<std::vector<v1::StateChunk>> Export(int64_t max_chunk_bytes) {
    absl::StatusOr<std::unique_ptr<StateExport>> exporter =
        StateExport::BeginAndWait(ExportOf(job_, nullptr), max_chunk_bytes);
    if (!exporter.ok()) return exporter.status();
    std::vector<v1::StateChunk> chunks;
    v1::StateChunk chunk;
    while (true) {
      absl::StatusOr<bool> more = (*exporter)->Next(&chunk);
      if (!more.ok()) return more.status();
      if (!*more) break;
      chunks.push_back(chunk);
    }
    return chunks;
  }

  absl::StatusOr<v1::ImportStateResponse> Import(const std::vector<v1::StateChunk>& chunks,
                                                 bool stage_ahead = false) {
    StateImport import(job_->spec(), kMaxChunkBytes, stage_ahead);
    for (const v1::StateChunk& chunk : chunks) {
      absl::Status s = import.Add(chunk);
      if (!s.ok()) return s;
    }
    absl::StatusOr<StagedState> staged = import.Finish();
    if (!staged.ok()) return staged.status();
    return job_->Import(*std::move(staged));
  }

 private:
  const v1::RegisterRequest spec_;
  std::shared_ptr<Job> job_;
};

// The bytes of a whole state stream, to compare two exports.
std::string Serialized(const std::vector<v1::StateChunk>& chunks) {
  std::string out;
  for (const v1::StateChunk& c : chunks) out += c.SerializeAsString();
  return out;
}

std::optional<double> StepLr(int64_t step) {
  return step % 2 == 0 ? std::optional<double>(1e-3 * (1.0 + 0.25 * step)) : std::nullopt;
}

StepGradients Gradients(const v1::RegisterRequest& spec, int64_t step) {
  StepGradients g = RandomGradients(spec, 500 + static_cast<uint64_t>(step));
  if (step == 2) {  // a non-finite gradient: step 2 is skipped
    std::vector<float> w = FromBytes<float>(g[2][1]);
    w[77] = std::numeric_limits<float>::infinity();
    g[2][1] = ToBytes(w);
  }
  return g;
}

class StateTransferTest : public ::testing::TestWithParam<TransferCase> {
 protected:
  StateTransferTest() : spec_(Spec(GetParam().policy)), backend_(2) {}

  const v1::RegisterRequest spec_;
  CpuBackend backend_;
};

TEST_P(StateTransferTest, ExportImportThenContinuingIsBitIdenticalToUninterruptedTraining) {
  constexpr int64_t kBefore = 5;  // steps before the export (step 2 is skipped)
  constexpr int64_t kAfter = 5;   // steps after it, on both jobs
  Driver a(spec_, &backend_);
  ASSERT_TRUE(a.Upload(RandomWeights(spec_, 7)).ok());
  for (int64_t step = 0; step < kBefore; ++step) {
    ASSERT_TRUE(a.Step(step, Gradients(spec_, step), StepLr(step)).ok());
  }
  v1::SetHyperparamsRequest hyper;
  hyper.set_lr(2e-3);
  hyper.set_weight_decay(0.05);
  ASSERT_TRUE(a.job().SetHyperparams(hyper).ok());

  // Small chunks: fields span several chunks and chunks end inside elements.
  absl::StatusOr<std::vector<v1::StateChunk>> exported = a.Export(999);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_FALSE(exported->empty());
  const v1::StateHeader& header = exported->front().header();
  EXPECT_EQ(header.next_step(), kBefore);
  EXPECT_EQ(header.applied_steps(), kBefore - 1);
  EXPECT_EQ(header.skipped_steps(), 1);
  EXPECT_EQ(header.hyperparams().lr(), 2e-3);
  EXPECT_EQ(header.seed(), spec_.seed());
  for (const v1::StateChunk& c : *exported) EXPECT_LE(c.data().size(), 999u);
  const Snapshot at_export = a.Served(kBefore);

  // A fresh job with the same description, no initial weights: the import is its state.
  Driver b(spec_, &backend_);
  absl::StatusOr<v1::ImportStateResponse> imported = b.Import(*exported);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->next_step(), kBefore);
  EXPECT_EQ(b.Served(kBefore), at_export) << "the re-published version differs";
  const v1::JobStatus status = b.job().Status();
  EXPECT_EQ(status.next_step(), kBefore);
  EXPECT_EQ(status.applied_steps(), kBefore - 1);
  EXPECT_EQ(status.skipped_steps(), 1);
  EXPECT_EQ(status.hyperparams().weight_decay(), 0.05);
  // Exporting the imported state gives the same stream.
  absl::StatusOr<std::vector<v1::StateChunk>> again = b.Export(999);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Serialized(*again), Serialized(*exported));
  // The same, staged ahead (as a restore imports).
  Driver c(spec_, &backend_);
  ASSERT_TRUE(c.Import(*exported, /*stage_ahead=*/true).ok());
  EXPECT_EQ(c.Served(kBefore), at_export);
  absl::StatusOr<std::vector<v1::StateChunk>> staged_ahead = c.Export(999);
  ASSERT_TRUE(staged_ahead.ok()) << staged_ahead.status();
  EXPECT_EQ(Serialized(*staged_ahead), Serialized(*exported));

  for (int64_t step = kBefore; step < kBefore + kAfter; ++step) {
    const StepGradients g = Gradients(spec_, step);
    ASSERT_TRUE(a.Step(step, g, StepLr(step)).ok());
    ASSERT_TRUE(b.Step(step, g, StepLr(step)).ok());
    EXPECT_EQ(b.Served(step + 1), a.Served(step + 1)) << "version " << step + 1;
  }
  absl::StatusOr<std::vector<v1::StateChunk>> end_a = a.Export(kMaxChunkBytes);
  absl::StatusOr<std::vector<v1::StateChunk>> end_b = b.Export(kMaxChunkBytes);
  ASSERT_TRUE(end_a.ok() && end_b.ok());
  EXPECT_EQ(Serialized(*end_b), Serialized(*end_a)) << "the states differ after training on";
}

TEST_P(StateTransferTest, AnExportListsEveryFieldInItsStoredTypeAndShape) {
  Driver a(spec_, &backend_);
  ASSERT_TRUE(a.Upload(RandomWeights(spec_, 8)).ok());
  ASSERT_TRUE(a.Step(0, Gradients(spec_, 0), std::nullopt).ok());
  absl::StatusOr<std::vector<v1::StateChunk>> exported = a.Export(kMaxChunkBytes);
  ASSERT_TRUE(exported.ok()) << exported.status();
  std::vector<std::string> fields;
  for (const v1::StateChunk& c : *exported) {
    if (!c.has_field()) continue;
    if (c.field().tensor() == "panels") {
      fields.push_back(absl::StrCat(c.field().field(), ":", v1::ElementType_Name(c.field().type()),
                                    ":", absl::StrJoin(c.field().shape(), "x")));
    }
  }
  const v1::StatePolicy& p = spec_.state_policy();
  std::vector<std::string> want;
  auto moment = [](v1::MomentType t) {
    switch (t) {
      case v1::MOMENT_TYPE_BF16:
        return "ELEMENT_TYPE_BF16";
      case v1::MOMENT_TYPE_FP16:
        return "ELEMENT_TYPE_FP16";
      case v1::MOMENT_TYPE_FP8:
        return "ELEMENT_TYPE_FP8_E4M3";
      default:
        return "ELEMENT_TYPE_FP32";
    }
  };
  const bool scaled_m = p.exp_avg() == v1::MOMENT_TYPE_FP16 || p.exp_avg() == v1::MOMENT_TYPE_FP8;
  const bool scaled_v =
      p.exp_avg_sq() == v1::MOMENT_TYPE_FP16 || p.exp_avg_sq() == v1::MOMENT_TYPE_FP8;
  switch (p.master()) {
    case v1::MASTER_TYPE_BF16_REMAINDER:
      want.push_back("master:ELEMENT_TYPE_BF16:131x257");
      want.push_back("master_remainder:ELEMENT_TYPE_INT16:131x257");
      break;
    case v1::MASTER_TYPE_FP16:
      want.push_back("master:ELEMENT_TYPE_FP16:131x257");
      break;
    default:
      want.push_back("master:ELEMENT_TYPE_FP32:131x257");
  }
  want.push_back(absl::StrCat("exp_avg:", moment(p.exp_avg()), ":131x257"));
  if (scaled_m) want.push_back("exp_avg_scales:ELEMENT_TYPE_FP32:264");  // ceil(131*257/128)
  want.push_back(absl::StrCat("exp_avg_sq:", moment(p.exp_avg_sq()), ":131x257"));
  if (scaled_v) want.push_back("exp_avg_sq_scales:ELEMENT_TYPE_FP32:264");
  want.push_back("fp8_tensor_scale:ELEMENT_TYPE_FP32:1");
  want.push_back("fp8_delayed_scale:ELEMENT_TYPE_FP32:1");
  want.push_back("fp8_delayed_history:ELEMENT_TYPE_FP32:1");  // one applied step
  EXPECT_EQ(fields, want);
}

INSTANTIATE_TEST_SUITE_P(Policies, StateTransferTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Refusals: the job's state is the same afterwards (its export and its served version).

class StateImportRefusalTest : public ::testing::Test {
 protected:
  StateImportRefusalTest()
      : spec_(Spec(Policy(v1::MASTER_TYPE_FP32, v1::MOMENT_TYPE_FP8, v1::MOMENT_TYPE_FP16,
                          v1::ROUNDING_NEAREST, v1::ROUNDING_STOCHASTIC))),
        backend_(2),
        source_(spec_, &backend_),
        target_(spec_, &backend_) {}

  void SetUp() override {
    ASSERT_TRUE(source_.Upload(RandomWeights(spec_, 9)).ok());
    for (int64_t step = 0; step < 3; ++step) {
      ASSERT_TRUE(source_.Step(step, RandomGradients(spec_, 90 + step), std::nullopt).ok());
    }
    absl::StatusOr<std::vector<v1::StateChunk>> exported = source_.Export(4096);
    ASSERT_TRUE(exported.ok()) << exported.status();
    state_ = *std::move(exported);
    ASSERT_TRUE(target_.Upload(RandomWeights(spec_, 10)).ok());
    ASSERT_TRUE(target_.Step(0, RandomGradients(spec_, 99), std::nullopt).ok());
    absl::StatusOr<std::vector<v1::StateChunk>> before = target_.Export(kMaxChunkBytes);
    ASSERT_TRUE(before.ok());
    before_ = Serialized(*before);
  }

  void ExpectUnchanged() {
    absl::StatusOr<std::vector<v1::StateChunk>> after = target_.Export(kMaxChunkBytes);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(Serialized(*after), before_) << "a refused import changed the state";
    EXPECT_NE(target_.job().Served(0, 1), nullptr);
    EXPECT_EQ(target_.job().Served(0, 2), nullptr);
  }

  // The first chunk that begins `field` of `tensor`.
  v1::StateChunk* FieldChunk(std::vector<v1::StateChunk>& chunks, const std::string& tensor,
                             const std::string& field) {
    for (v1::StateChunk& c : chunks) {
      if (c.has_field() && c.field().tensor() == tensor && c.field().field() == field) return &c;
    }
    ADD_FAILURE() << "no field " << field << " of " << tensor;
    return &chunks.front();
  }

  void ExpectRefused(const std::vector<v1::StateChunk>& chunks, absl::StatusCode code,
                     const std::vector<std::string>& words) {
    ExpectRefusedStatus(chunks, code, words);
    ExpectUnchanged();
  }

  // The refusal alone, for a job whose export would wait on a queued step; with and without
  // staging ahead (a refused import staged ahead stops its staging thread).
  void ExpectRefusedStatus(const std::vector<v1::StateChunk>& chunks, absl::StatusCode code,
                           const std::vector<std::string>& words) {
    for (const bool stage_ahead : {false, true}) {
      absl::StatusOr<v1::ImportStateResponse> imported = target_.Import(chunks, stage_ahead);
      ASSERT_FALSE(imported.ok()) << "stage_ahead " << stage_ahead;
      EXPECT_EQ(imported.status().code(), code) << imported.status();
      for (const std::string& w : words) {
        EXPECT_NE(imported.status().message().find(w), std::string::npos)
            << "\"" << w << "\" missing from: " << imported.status().message();
      }
    }
  }

  const v1::RegisterRequest spec_;
  CpuBackend backend_;
  Driver source_;
  Driver target_;
  std::vector<v1::StateChunk> state_;
  std::string before_;
};

TEST_F(StateImportRefusalTest, MismatchesAreInvalidArgumentNamingTheTensorAndField) {
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  {
    auto chunks = state_;
    FieldChunk(chunks, "odd", "exp_avg")->mutable_field()->set_type(v1::ELEMENT_TYPE_FP16);
    ExpectRefused(chunks, kInvalid, {"\"exp_avg\"", "\"odd\"", "ELEMENT_TYPE_FP8_E4M3"});
  }
  {
    auto chunks = state_;
    FieldChunk(chunks, "vector", "master")->mutable_field()->set_shape(1, 999);
    ExpectRefused(chunks, kInvalid, {"\"master\"", "\"vector\"", "[1, 999]", "[1, 1000]"});
  }
  {
    auto chunks = state_;
    FieldChunk(chunks, "scalar", "exp_avg_sq_scales")
        ->mutable_field()
        ->set_field("master_remainder");
    ExpectRefused(chunks, kInvalid, {"\"master_remainder\"", "\"scalar\"", "no such field"});
  }
  {
    auto chunks = state_;
    FieldChunk(chunks, "panels", "exp_avg")->mutable_field()->set_tensor("nope");
    ExpectRefused(chunks, kInvalid, {"\"nope\"", "no such tensor"});
  }
  {
    // A field missing: the stream ends without the last tensor's history.
    auto chunks = state_;
    chunks.pop_back();
    ExpectRefused(chunks, kInvalid, {"\"fp8_delayed_history\"", "\"vector\"", "missing"});
  }
  {
    // A field cut short: a chunk of the largest field dropped.
    auto chunks = state_;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].has_field() && chunks[i].field().tensor() == "panels" &&
          chunks[i].field().field() == "master") {
        chunks.erase(chunks.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        break;
      }
    }
    ExpectRefused(chunks, kInvalid, {"\"master\"", "\"panels\"", "offset"});
  }
  {
    auto chunks = state_;
    chunks.push_back(*FieldChunk(chunks, "odd", "exp_avg_sq"));
    ExpectRefused(chunks, kInvalid, {"\"exp_avg_sq\"", "\"odd\"", "twice"});
  }
  {
    auto chunks = state_;
    chunks.front().mutable_header()->set_seed(spec_.seed() + 1);
    ExpectRefused(chunks, kInvalid, {"seed"});
  }
  {
    auto chunks = state_;
    chunks.front().mutable_header()->mutable_state_policy()->set_exp_avg(v1::MOMENT_TYPE_FP16);
    ExpectRefused(chunks, kInvalid, {"state_policy"});
  }
  {
    auto chunks = state_;
    chunks.front().mutable_header()->set_skipped_steps(1);
    ExpectRefused(chunks, kInvalid, {"applied_steps + skipped_steps = next_step"});
  }
  {
    // A scale that is not a usable divisor.
    auto chunks = state_;
    v1::StateChunk* c = FieldChunk(chunks, "scalar", "fp8_tensor_scale");
    const float zero = 0.0f;
    c->set_data(std::string(reinterpret_cast<const char*>(&zero), sizeof(zero)));
    ExpectRefused(chunks, kInvalid, {"\"fp8_tensor_scale\"", "\"scalar\"", "> 0"});
  }
  {
    // A job of another description: fp16 moments have other types and scales.
    v1::RegisterRequest other = spec_;
    other.mutable_state_policy()->set_exp_avg(v1::MOMENT_TYPE_FP16);
    other.set_job("other");
    CpuBackend backend(1);
    Driver d(other, &backend);
    auto chunks = state_;
    chunks.front().mutable_header()->set_job("other");
    absl::StatusOr<v1::ImportStateResponse> imported = d.Import(chunks);
    EXPECT_EQ(imported.status().code(), kInvalid) << imported.status();
  }
  // The unchanged state still takes a good import.
  ASSERT_TRUE(target_.Import(state_).ok());
  EXPECT_NE(target_.job().Served(0, 3), nullptr);
}

TEST_F(StateImportRefusalTest, AnImportIsRefusedWhileAStepIsCollectedQueuedOrExported) {
  constexpr auto kPrecondition = absl::StatusCode::kFailedPrecondition;
  const StepGradients g = RandomGradients(spec_, 100);
  // While an export streams.
  {
    absl::StatusOr<std::unique_ptr<StateExport>> exporting =
        StateExport::BeginAndWait(ExportOf(target_.shared(), nullptr), 4096);
    ASSERT_TRUE(exporting.ok());
    ExpectRefused(state_, kPrecondition, {"an export of its state is streaming"});
  }
  // A push of the step being collected.
  ASSERT_TRUE(target_.Push(1, 1, 2, g[2][1]).ok());
  ExpectRefused(state_, kPrecondition, {"rank 1 pushed", "\"panels\"", "step 1"});
  // Committed and taken, not yet run.
  absl::StatusOr<StepWork> work = target_.PushAndCommit(1, g, std::nullopt);
  ASSERT_TRUE(work.ok()) << work.status();
  ExpectRefusedStatus(state_, kPrecondition, {"step 1 is running or queued"});
  RunTakenStep(target_.job(), *work);
  ASSERT_NE(target_.job().Served(0, 2), nullptr);  // the step's version, not the refused import's
  EXPECT_EQ(target_.job().Served(0, 3), nullptr);
  // Between steps it goes through, back to version 3 of the source.
  absl::StatusOr<v1::ImportStateResponse> imported = target_.Import(state_);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(target_.Served(3), source_.Served(3));
}

// ---------------------------------------------------------------------------------------------
// An export holds steps back without blocking the step executor, and hands them back at its end.

// A job and a reference copy of it stepped without exports, both from the same initial weights.
class ExportHoldTest : public ::testing::Test {
 protected:
  ExportHoldTest()
      : spec(Spec(v1::StatePolicy())),
        backend(2),
        d(spec, &backend),
        reference(spec, &backend),
        initial(RandomWeights(spec, 11)) {}

  void SetUp() override {
    ASSERT_TRUE(d.Upload(initial).ok());
    ASSERT_TRUE(reference.Upload(initial).ok());
  }

  const v1::RegisterRequest spec;
  CpuBackend backend;
  Driver d;
  Driver reference;
  const std::vector<std::vector<float>> initial;
};

TEST_F(ExportHoldTest, StepsWaitForAnExportAndRunInOrderOnceItEnds) {
  std::vector<StepWork> resumed;
  absl::StatusOr<std::unique_ptr<StateExport>> exporting = StateExport::BeginAndWait(
      ExportOf(d.shared(), [&](const StepWork& w) { resumed.push_back(w); }), 4096);
  ASSERT_TRUE(exporting.ok()) << exporting.status();
  v1::StateChunk first;
  ASSERT_TRUE(*(*exporting)->Next(&first));
  // Two steps committed meanwhile: their ticks return at once and run nothing.
  for (int64_t step = 0; step < 2; ++step) {
    const StepGradients g = RandomGradients(spec, 200 + step);
    absl::StatusOr<StepWork> work = d.PushAndCommit(step, g, std::nullopt);
    ASSERT_TRUE(work.ok()) << work.status();
    EXPECT_TRUE(d.job().RunOrHoldStep(*work).empty());
    ASSERT_TRUE(reference.Step(step, g, std::nullopt).ok());
  }
  EXPECT_EQ(d.job().Served(0, 1), nullptr);
  // The rest of the stream is the state of version 0.
  v1::StateChunk chunk;
  std::string master;
  while (*(*exporting)->Next(&chunk)) {
    if (chunk.has_field()) master = chunk.field().tensor() + "/" + chunk.field().field();
    if (master == "scalar/master") {
      EXPECT_EQ(FromBytes<float>(chunk.data())[0], initial[0][0]);
    }
  }
  EXPECT_EQ(first.header().next_step(), 0);
  exporting->reset();  // the export ends: the newest held step goes back to the executor
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].step, 1);
  const std::vector<StepReport> reports = d.job().RunOrHoldStep(resumed[0]);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].step, 0);
  EXPECT_EQ(reports[1].step, 1);
  EXPECT_EQ(d.Served(2), reference.Served(2));
  // A tick of a step that already ran does nothing.
  EXPECT_TRUE(d.job().RunOrHoldStep(resumed[0]).empty());
}

// A trainer that commits a step and exports at once gets the state after that step: the export
// waits for the steps every rank committed before it, queued or running; a step committed while
// it waits is held back until it ends.
TEST_F(ExportHoldTest, AnExportIsTheStateAfterEveryStepCommittedBeforeIt) {
  const StepGradients g0 = RandomGradients(spec, 300);
  absl::StatusOr<StepWork> step0 = d.PushAndCommit(0, g0, std::nullopt);
  ASSERT_TRUE(step0.ok()) << step0.status();
  ASSERT_TRUE(reference.Step(0, g0, std::nullopt).ok());

  // Step 0 is queued (its tick has not reached the executor) when the export begins: it starts
  // from the thread that runs step 0, at that step's end.
  std::vector<StepWork> resumed;
  bool started = false;
  absl::StatusOr<std::unique_ptr<StateExport>> exporting;
  StateExport::Begin(ExportOf(d.shared(), [&](const StepWork& w) { resumed.push_back(w); }), 4096,
                     [&](absl::StatusOr<std::unique_ptr<StateExport>> e) {
                       exporting = std::move(e);
                       started = true;
                     });
  EXPECT_FALSE(started) << "the export began before the step committed ahead of it ran";
  // Step 1, committed while the export waits, is held; step 0's tick runs step 0 alone.
  const StepGradients g1 = RandomGradients(spec, 301);
  absl::StatusOr<StepWork> step1 = d.PushAndCommit(1, g1, std::nullopt);
  ASSERT_TRUE(step1.ok()) << step1.status();
  EXPECT_TRUE(d.job().RunOrHoldStep(*step1).empty());
  EXPECT_FALSE(started);
  const std::vector<StepReport> ran = d.job().RunOrHoldStep(*step0);
  ASSERT_EQ(ran.size(), 1u);
  EXPECT_EQ(ran[0].step, 0);
  ASSERT_TRUE(started);
  ASSERT_TRUE(exporting.ok()) << exporting.status();
  v1::StateChunk header;
  ASSERT_TRUE(*(*exporting)->Next(&header));
  EXPECT_EQ(header.header().next_step(), 1);
  EXPECT_EQ(header.header().applied_steps(), 1);
  EXPECT_EQ(d.job().Served(0, 2), nullptr);  // step 1 still held

  exporting->reset();  // the export ends: step 1 goes back to the executor
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].step, 1);
  ASSERT_EQ(d.job().RunOrHoldStep(resumed[0]).size(), 1u);
  ASSERT_TRUE(reference.Step(1, g1, std::nullopt).ok());
  EXPECT_EQ(d.Served(2), reference.Served(2));
}

// Two exports overlap with steps held between them, in the order that once lost a step's tick:
// export A streams; step 0 is committed (held); export B begins and waits for step 0; step 1 is
// committed (held). A's end hands back the newest held step, whose tick runs step 0 alone (step 1
// is B's to hold), which starts B; B's end hands step 1 back, and its tick runs it. Every step
// runs once, in order, and each export is the state after the steps committed before it.
TEST_F(ExportHoldTest, OverlappingExportsLoseNoHeldStep) {
  std::vector<StepWork> resumed;
  auto resume = [&](const StepWork& w) { resumed.push_back(w); };
  absl::StatusOr<std::unique_ptr<StateExport>> a =
      StateExport::BeginAndWait(ExportOf(d.shared(), resume), 4096);
  ASSERT_TRUE(a.ok()) << a.status();
  const StepGradients g0 = RandomGradients(spec, 400);
  absl::StatusOr<StepWork> step0 = d.PushAndCommit(0, g0, std::nullopt);
  ASSERT_TRUE(step0.ok()) << step0.status();
  EXPECT_TRUE(d.job().RunOrHoldStep(*step0).empty());

  bool b_started = false;
  absl::StatusOr<std::unique_ptr<StateExport>> b;
  StateExport::Begin(ExportOf(d.shared(), resume), 4096,
                     [&](absl::StatusOr<std::unique_ptr<StateExport>> e) {
                       b = std::move(e);
                       b_started = true;
                     });
  EXPECT_FALSE(b_started) << "B began before step 0, committed ahead of it, ran";
  const StepGradients g1 = RandomGradients(spec, 401);
  absl::StatusOr<StepWork> step1 = d.PushAndCommit(1, g1, std::nullopt);
  ASSERT_TRUE(step1.ok()) << step1.status();
  EXPECT_TRUE(d.job().RunOrHoldStep(*step1).empty());

  v1::StateChunk header;
  ASSERT_TRUE(*(*a)->Next(&header));
  EXPECT_EQ(header.header().next_step(), 0);
  a->reset();  // A ends: the newest held step's tick goes back
  ASSERT_EQ(resumed.size(), 1u);
  std::vector<StepReport> ran = d.job().RunOrHoldStep(resumed.back());
  ASSERT_EQ(ran.size(), 1u);
  EXPECT_EQ(ran[0].step, 0);
  ASSERT_TRUE(b_started) << "B did not start once step 0 ran";
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(*(*b)->Next(&header));
  EXPECT_EQ(header.header().next_step(), 1);
  EXPECT_EQ(d.job().Served(0, 2), nullptr);  // step 1 held by B

  b->reset();  // B ends: step 1 goes back
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_EQ(resumed.back().step, 1);
  ran = d.job().RunOrHoldStep(resumed.back());
  ASSERT_EQ(ran.size(), 1u);
  EXPECT_EQ(ran[0].step, 1);
  ASSERT_TRUE(reference.Step(0, g0, std::nullopt).ok());
  ASSERT_TRUE(reference.Step(1, g1, std::nullopt).ok());
  EXPECT_EQ(d.Served(2), reference.Served(2));
  EXPECT_TRUE(d.job().RunOrHoldStep(*step0).empty());  // late ticks run nothing
  EXPECT_TRUE(d.job().RunOrHoldStep(*step1).empty());
}

TEST(StateExportTest, AJobWithoutItsInitialWeightsHasNoStateToExport) {
  const v1::RegisterRequest spec = Spec(v1::StatePolicy());
  CpuBackend backend(1);
  Driver d(spec, &backend);
  absl::StatusOr<std::vector<v1::StateChunk>> exported = d.Export(4096);
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kFailedPrecondition) << exported.status();
}

// ---------------------------------------------------------------------------------------------
// Per-tensor publish (DESIGN.md §2): a backend that reports each tensor as it finishes lets the
// job publish it, and wake its pullers, while later tensors are still being stepped.

// The cpu backend with a hook called after the job handled each tensor's completion.
class HookedBackend : public CpuBackend {
 public:
  HookedBackend() : CpuBackend(2) {}
  std::function<void(size_t, std::span<TensorStep>)> after_tensor;

  absl::Status ApplyStep(std::span<TensorStep> tensors, const StepScalars& scalars,
                         const std::function<void(size_t)>& tensor_done) override {
    return CpuBackend::ApplyStep(tensors, scalars, [&](size_t i) {
      tensor_done(i);
      if (after_tensor) after_tensor(i, tensors);
    });
  }
};

TEST(PerTensorPublishTest, APullOfTheFirstTensorCompletesBeforeTheLastIsStepped) {
  const v1::RegisterRequest spec = Spec(v1::StatePolicy());  // fp32 master: the initial weights
  const size_t last = static_cast<size_t>(spec.tensors_size() - 1);
  const std::vector<std::vector<float>> initial = RandomWeights(spec, 12);
  HookedBackend backend;
  Driver d(spec, &backend);
  ASSERT_TRUE(d.Upload(initial).ok());
  // A puller of tensor 0's version 1, waiting.
  bool woken = false;
  ASSERT_NE(d.job().AddWaiter(0, 1, [&] { woken = true; }), 0u);
  std::vector<std::string> seen;
  backend.after_tensor = [&](size_t i, std::span<TensorStep> tensors) {
    // The last tensor's master as the backend holds it now: still the initial weights until its
    // own step ran.
    std::vector<float> master(initial[last].size());
    ASSERT_TRUE(backend
                    .ReadStateArray(*tensors[last].state, StateArray::kMaster, 0,
                                    std::span<uint8_t>(reinterpret_cast<uint8_t*>(master.data()),
                                                       master.size() * sizeof(float)))
                    .ok());
    seen.push_back(
        absl::StrCat("tensor ", i, ": pull of tensor 0 ", woken ? "done" : "waiting",
                     "; last tensor ", master == initial[last] ? "not " : "", "stepped, ",
                     d.job().Served(static_cast<int>(last), 1) ? "" : "not ", "published"));
    if (i == 0) {
      // The puller reads its version now.
      std::shared_ptr<const ServedTensor> first = d.job().Served(0, 1);
      ASSERT_NE(first, nullptr);
      EXPECT_EQ(first->version, 1);
    }
  };
  ASSERT_TRUE(d.Step(0, RandomGradients(spec, 300), std::nullopt).ok());
  const std::vector<std::string> want = {
      "tensor 0: pull of tensor 0 done; last tensor not stepped, not published",
      "tensor 1: pull of tensor 0 done; last tensor not stepped, not published",
      "tensor 2: pull of tensor 0 done; last tensor not stepped, not published",
      "tensor 3: pull of tensor 0 done; last tensor stepped, published"};
  EXPECT_EQ(seen, want);
}

}  // namespace
}  // namespace paramd
