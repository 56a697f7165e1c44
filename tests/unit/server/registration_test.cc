// ValidateRegistration accepts every state policy and serve format and refuses every bad job
// description with INVALID_ARGUMENT and a message naming the field; NormalizedSpec and
// ServedFormats give the description every rank must repeat and the formats served.
#include "server/registration.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using testing::HasStatus;
using testing::MakeSpec;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

v1::RegisterRequest Valid() {
  return MakeSpec("job-1.a_b", 4,
                  {{"layers.0/attn:q_proj-w", 128, 64, v1::ELEMENT_TYPE_BF16},
                   {"bias", 1, 64, v1::ELEMENT_TYPE_FP32}});
}

TEST(RegistrationTest, AcceptsAValidDescription) {
  EXPECT_TRUE(ValidateRegistration(Valid()).ok()) << ValidateRegistration(Valid());
}

TEST(RegistrationTest, AcceptsTheLimitsOfEveryRange) {
  v1::RegisterRequest r = Valid();
  r.set_job(std::string(128, 'j'));
  r.set_world_size(4096);
  r.set_rank(4095);
  r.mutable_tensors(0)->set_name(std::string(256, 't'));
  r.mutable_tensors(1)->set_rows(int64_t{1} << 18);
  r.mutable_tensors(1)->set_cols(int64_t{1} << 18);  // exactly 2^36 elements
  r.mutable_hyperparams()->set_beta1(0);
  r.mutable_hyperparams()->set_beta2(0);
  r.mutable_hyperparams()->set_weight_decay(0);
  EXPECT_TRUE(ValidateRegistration(r).ok()) << ValidateRegistration(r);
}

// One bad description: how to break a valid one, the code and a substring of the message.
struct BadCase {
  std::string name;
  std::function<void(v1::RegisterRequest&)> mutate;
  absl::StatusCode code;
  std::string text;
};
// Test output names the case, not the bytes of its function object.
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class RegistrationBadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(RegistrationBadInputTest, IsRefusedWithACodeAndAMessageNamingTheField) {
  v1::RegisterRequest r = Valid();
  GetParam().mutate(r);
  EXPECT_TRUE(HasStatus(ValidateRegistration(r), GetParam().code, GetParam().text));
}

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

v1::ServeFormat Serve(v1::Recipe recipe, v1::Direction direction = v1::DIRECTION_ROWWISE) {
  v1::ServeFormat f;
  f.set_recipe(recipe);
  f.set_direction(direction);
  return f;
}

const std::vector<BadCase>& BadCases() {
  using R = v1::RegisterRequest;
  static const auto* cases = new std::vector<BadCase>{
      {"EmptyJobName", [](R& r) { r.set_job(""); }, kInvalid, "job name \"\""},
      {"LongJobName", [](R& r) { r.set_job(std::string(129, 'j')); }, kInvalid, "job name"},
      {"JobNameWithSpace", [](R& r) { r.set_job("my job"); }, kInvalid, "job name \"my job\""},
      {"JobNameWithSlash", [](R& r) { r.set_job("a/b"); }, kInvalid, "job name \"a/b\""},
      {"ZeroWorldSize", [](R& r) { r.set_world_size(0); }, kInvalid, "world_size = 0"},
      {"HugeWorldSize", [](R& r) { r.set_world_size(4097); }, kInvalid, "world_size = 4097"},
      {"NegativeRank", [](R& r) { r.set_rank(-1); }, kInvalid, "rank = -1"},
      {"RankAtWorldSize", [](R& r) { r.set_rank(4); }, kInvalid, "rank = 4"},
      {"NoTensors", [](R& r) { r.clear_tensors(); }, kInvalid, "at least one tensor"},
      {"EmptyTensorName", [](R& r) { r.mutable_tensors(1)->set_name(""); }, kInvalid,
       "tensor name \"\""},
      {"LongTensorName", [](R& r) { r.mutable_tensors(1)->set_name(std::string(257, 't')); },
       kInvalid, "tensor name"},
      {"TensorNameWithBadCharacter", [](R& r) { r.mutable_tensors(1)->set_name("w[0]"); }, kInvalid,
       "tensor name \"w[0]\""},
      {"DuplicateTensorName",
       [](R& r) { r.mutable_tensors(1)->set_name("layers.0/attn:q_proj-w"); }, kInvalid,
       "listed twice"},
      {"JobIndexFromATrainer", [](R& r) { r.mutable_tensors(1)->set_job_index(1); }, kInvalid,
       "which only daemons set"},
      {"RowOffsetFromATrainer", [](R& r) { r.mutable_tensors(1)->set_row_offset(128); }, kInvalid,
       "\"bias\" sets job_index, row_offset or whole_rows"},
      {"WholeRowsFromATrainer", [](R& r) { r.mutable_tensors(1)->set_whole_rows(256); }, kInvalid,
       "register the whole tensor"},
      {"ZeroRows", [](R& r) { r.mutable_tensors(1)->set_rows(0); }, kInvalid,
       "\"bias\" has shape [0, 64]"},
      {"ZeroCols", [](R& r) { r.mutable_tensors(1)->set_cols(0); }, kInvalid,
       "\"bias\" has shape [1, 0]"},
      {"NegativeRows", [](R& r) { r.mutable_tensors(1)->set_rows(-3); }, kInvalid,
       "shape [-3, 64]"},
      {"TooManyElements",
       [](R& r) {
         r.mutable_tensors(1)->set_rows((int64_t{1} << 18) + 1);
         r.mutable_tensors(1)->set_cols(int64_t{1} << 18);
       },
       kInvalid, "at most 2^36 elements"},
      {"UnspecifiedGradType",
       [](R& r) { r.mutable_tensors(1)->set_grad_type(v1::ELEMENT_TYPE_UNSPECIFIED); }, kInvalid,
       "\"bias\" needs grad_type"},
      {"UnknownGradType",
       [](R& r) { r.mutable_tensors(1)->set_grad_type(static_cast<v1::ElementType>(99)); },
       kInvalid, "needs grad_type"},
      {"ZeroLr", [](R& r) { r.mutable_hyperparams()->set_lr(0); }, kInvalid, "hyperparams.lr"},
      {"NegativeLr", [](R& r) { r.mutable_hyperparams()->set_lr(-1e-3); }, kInvalid,
       "hyperparams.lr"},
      {"InfiniteLr", [](R& r) { r.mutable_hyperparams()->set_lr(kInf); }, kInvalid,
       "hyperparams.lr"},
      {"NanLr", [](R& r) { r.mutable_hyperparams()->set_lr(kNaN); }, kInvalid, "hyperparams.lr"},
      {"NegativeBeta1", [](R& r) { r.mutable_hyperparams()->set_beta1(-0.1); }, kInvalid,
       "hyperparams.beta1"},
      {"Beta1One", [](R& r) { r.mutable_hyperparams()->set_beta1(1.0); }, kInvalid,
       "hyperparams.beta1"},
      {"NanBeta1", [](R& r) { r.mutable_hyperparams()->set_beta1(kNaN); }, kInvalid,
       "hyperparams.beta1"},
      {"Beta2One", [](R& r) { r.mutable_hyperparams()->set_beta2(1.0); }, kInvalid,
       "hyperparams.beta2"},
      {"NanBeta2", [](R& r) { r.mutable_hyperparams()->set_beta2(kNaN); }, kInvalid,
       "hyperparams.beta2"},
      {"ZeroEps", [](R& r) { r.mutable_hyperparams()->set_eps(0); }, kInvalid, "hyperparams.eps"},
      {"InfiniteEps", [](R& r) { r.mutable_hyperparams()->set_eps(kInf); }, kInvalid,
       "hyperparams.eps"},
      {"NegativeWeightDecay", [](R& r) { r.mutable_hyperparams()->set_weight_decay(-0.01); },
       kInvalid, "hyperparams.weight_decay"},
      {"NanWeightDecay", [](R& r) { r.mutable_hyperparams()->set_weight_decay(kNaN); }, kInvalid,
       "hyperparams.weight_decay"},
      {"MissingHyperparams", [](R& r) { r.clear_hyperparams(); }, kInvalid, "hyperparams.lr"},
      {"StochasticFp32Moment",
       [](R& r) { r.mutable_state_policy()->set_exp_avg_rounding(v1::ROUNDING_STOCHASTIC); },
       kInvalid, "exp_avg is FP32, which is not rounded"},
      {"UnknownMomentType",
       [](R& r) { r.mutable_state_policy()->set_exp_avg_sq(static_cast<v1::MomentType>(9)); },
       kInvalid, "state_policy.exp_avg_sq = 9"},
      {"UnknownMasterType",
       [](R& r) { r.mutable_state_policy()->set_master(static_cast<v1::MasterType>(9)); }, kInvalid,
       "state_policy.master = 9"},
      {"ServeUnspecifiedRecipe", [](R& r) { *r.add_serve() = Serve(v1::RECIPE_UNSPECIFIED); },
       kInvalid, "serve recipe 0 is not a Recipe"},
      {"HistoryOnANonDelayedRecipe",
       [](R& r) {
         v1::ServeFormat f = Serve(v1::RECIPE_FP8_TENSOR);
         f.set_amax_history(4);
         *r.add_serve() = f;
       },
       kInvalid, "takes no amax_history or margin"},
      {"HistoryTooLong",
       [](R& r) {
         v1::ServeFormat f = Serve(v1::RECIPE_FP8_DELAYED);
         f.set_amax_history(2000);
         *r.add_serve() = f;
       },
       kInvalid, "amax_history = 2000"},
      {"Fp8DelayedDirectionsWithDifferentHistories",
       [](R& r) {
         v1::ServeFormat row = Serve(v1::RECIPE_FP8_DELAYED);
         row.set_amax_history(4);
         v1::ServeFormat col = Serve(v1::RECIPE_FP8_DELAYED, v1::DIRECTION_COLUMNWISE);
         col.set_amax_history(8);
         *r.add_serve() = row;
         *r.add_serve() = col;
       },
       kInvalid, "listed with amax_history 4 margin 0 and with amax_history 8 margin 0"},
      {"Fp8DelayedListedTwiceWithDifferentMargins",
       [](R& r) {
         v1::ServeFormat f = Serve(v1::RECIPE_FP8_DELAYED);
         *r.add_serve() = f;
         f.set_margin(2);
         *r.add_serve() = f;
       },
       kInvalid, "amax_history 16 margin 0 and with amax_history 16 margin 2"},
      {"NegativeMaxGradNorm", [](R& r) { r.set_max_grad_norm(-1); }, kInvalid,
       "max_grad_norm = -1"},
      {"NanMaxGradNorm", [](R& r) { r.set_max_grad_norm(kNaN); }, kInvalid, "max_grad_norm"},
      {"UnknownPushMode", [](R& r) { r.set_push_mode(static_cast<v1::PushMode>(7)); }, kInvalid,
       "push_mode 7"},
      {"UnsortedDaemons",
       [](R& r) {
         r.add_daemons("b.test:1");
         r.add_daemons("a.test:1");
       },
       kInvalid, "daemons is not sorted: \"b.test:1\" comes before \"a.test:1\""},
      {"DaemonListedTwice",
       [](R& r) {
         r.add_daemons("a.test:1");
         r.add_daemons("a.test:1");
       },
       kInvalid, "daemons lists \"a.test:1\" twice"},
      {"DaemonWithoutPort", [](R& r) { r.add_daemons("a.test"); }, kInvalid,
       "daemons[0] = \"a.test\" is not \"host:port\""},
      {"DaemonWithPortZero", [](R& r) { r.add_daemons("a.test:0"); }, kInvalid,
       "daemons[0] = \"a.test:0\""},
      {"DaemonWithPortPast65535", [](R& r) { r.add_daemons("a.test:65536"); }, kInvalid,
       "daemons[0] = \"a.test:65536\""},
      {"DaemonWithoutHost", [](R& r) { r.add_daemons(":7000"); }, kInvalid,
       "daemons[0] = \":7000\""},
      {"DaemonWithASpace", [](R& r) { r.add_daemons("a b:7000"); }, kInvalid,
       "daemons[0] = \"a b:7000\""},
      {"BackendOfNoKnownName", [](R& r) { r.add_daemons("a.test:7000/tpu:0"); }, kInvalid,
       "daemons[0] = \"a.test:7000/tpu:0\" is not \"host:port\" with a port in 1..65535, or "
       "that with \"/BACKEND\""},
      {"BackendWithoutDaemon", [](R& r) { r.add_daemons("/cuda:0"); }, kInvalid,
       "daemons[0] = \"/cuda:0\""},
      {"BackendWithoutName", [](R& r) { r.add_daemons("a.test:7000/"); }, kInvalid,
       "daemons[0] = \"a.test:7000/\""},
      {"TooManyDaemons",
       [](R& r) {
         for (int i = 0; i < 4097; ++i) r.add_daemons(absl::StrCat("d", 10000 + i, ".test:1"));
       },
       kInvalid, "daemons lists 4097 addresses; a job has at most 4096"},
  };
  return *cases;
}

INSTANTIATE_TEST_SUITE_P(EveryField, RegistrationBadInputTest, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return info.param.name;
                         });

TEST(RegistrationTest, NormalizedSpecClearsTheRankAndSpellsOutEveryDefault) {
  v1::RegisterRequest r = Valid();
  r.set_rank(3);
  r.clear_serve();
  r.add_serve()->set_recipe(v1::RECIPE_BF16);  // direction unspecified
  const v1::RegisterRequest n = NormalizedSpec(r);
  EXPECT_EQ(n.rank(), 0);
  EXPECT_EQ(n.state_policy().master(), v1::MASTER_TYPE_FP32);
  EXPECT_EQ(n.state_policy().exp_avg(), v1::MOMENT_TYPE_FP32);
  EXPECT_EQ(n.state_policy().exp_avg_sq(), v1::MOMENT_TYPE_FP32);
  ASSERT_EQ(n.serve_size(), 1);
  EXPECT_EQ(n.serve(0).recipe(), v1::RECIPE_BF16);
  EXPECT_EQ(n.serve(0).direction(), v1::DIRECTION_ROWWISE);
  EXPECT_EQ(n.push_mode(), v1::PUSH_MODE_FULL);
  // Everything else is kept as sent.
  EXPECT_EQ(n.job(), r.job());
  EXPECT_EQ(n.world_size(), r.world_size());
  EXPECT_EQ(n.seed(), r.seed());
  EXPECT_EQ(n.tensors_size(), r.tensors_size());
  EXPECT_EQ(n.hyperparams().SerializeAsString(), r.hyperparams().SerializeAsString());
}

TEST(RegistrationTest, NormalizedSpecMakesImplicitAndExplicitDefaultsEqual) {
  v1::RegisterRequest implicit = Valid();
  v1::RegisterRequest explicit_defaults = Valid();
  explicit_defaults.set_rank(2);
  explicit_defaults.mutable_state_policy()->set_master(v1::MASTER_TYPE_FP32);
  explicit_defaults.mutable_state_policy()->set_exp_avg(v1::MOMENT_TYPE_FP32);
  explicit_defaults.mutable_state_policy()->set_exp_avg_sq(v1::MOMENT_TYPE_FP32);
  explicit_defaults.mutable_serve(0)->set_direction(v1::DIRECTION_ROWWISE);
  explicit_defaults.set_push_mode(v1::PUSH_MODE_FULL);
  EXPECT_EQ(NormalizedSpec(implicit).SerializeAsString(),
            NormalizedSpec(explicit_defaults).SerializeAsString());
}

TEST(RegistrationTest, ServedFormatsAreTheRequestedOnesWithoutRepeatsAndFp32OnlyWhenAsked) {
  v1::RegisterRequest r = Valid();
  r.clear_serve();
  // A job that names no format gets the FP32 weights.
  EXPECT_EQ(ServedFormats(r), (std::vector<FormatKey>{{v1::RECIPE_FP32, v1::DIRECTION_ROWWISE}}));

  // One that names formats pays for those only: no FP32 unless listed.
  *r.add_serve() = Serve(v1::RECIPE_BF16, v1::DIRECTION_UNSPECIFIED);
  *r.add_serve() = Serve(v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE);
  EXPECT_EQ(ServedFormats(r),
            (std::vector<FormatKey>{{v1::RECIPE_BF16, v1::DIRECTION_ROWWISE},
                                    {v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE}}));

  *r.add_serve() = Serve(v1::RECIPE_FP32);
  *r.add_serve() = Serve(v1::RECIPE_BF16, v1::DIRECTION_ROWWISE);
  EXPECT_EQ(ServedFormats(r), (std::vector<FormatKey>{{v1::RECIPE_BF16, v1::DIRECTION_ROWWISE},
                                                      {v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE},
                                                      {v1::RECIPE_FP32, v1::DIRECTION_ROWWISE}}));
}

TEST(RegistrationTest, AcceptsEveryStatePolicyWithEveryServeFormat) {
  const v1::MasterType masters[] = {v1::MASTER_TYPE_UNSPECIFIED, v1::MASTER_TYPE_FP32,
                                    v1::MASTER_TYPE_BF16_REMAINDER, v1::MASTER_TYPE_FP16};
  const v1::MomentType moments[] = {v1::MOMENT_TYPE_UNSPECIFIED, v1::MOMENT_TYPE_FP32,
                                    v1::MOMENT_TYPE_BF16, v1::MOMENT_TYPE_FP16,
                                    v1::MOMENT_TYPE_FP8};
  v1::RegisterRequest r = Valid();
  r.clear_serve();
  for (int recipe = v1::RECIPE_FP32; recipe <= v1::RECIPE_MXFP8; ++recipe) {
    for (v1::Direction d :
         {v1::DIRECTION_UNSPECIFIED, v1::DIRECTION_ROWWISE, v1::DIRECTION_COLUMNWISE}) {
      v1::ServeFormat f = Serve(static_cast<v1::Recipe>(recipe), d);
      if (recipe == v1::RECIPE_FP8_DELAYED) {
        f.set_amax_history(1024);
        f.set_margin(32);
      }
      *r.add_serve() = f;
    }
  }
  r.set_max_grad_norm(1.0);
  for (v1::MasterType master : masters) {
    for (v1::MomentType exp_avg : moments) {
      for (v1::MomentType exp_avg_sq : moments) {
        for (v1::Rounding rounding :
             {v1::ROUNDING_UNSPECIFIED, v1::ROUNDING_NEAREST, v1::ROUNDING_STOCHASTIC}) {
          v1::StatePolicy* p = r.mutable_state_policy();
          p->set_master(master);
          p->set_exp_avg(exp_avg);
          p->set_exp_avg_sq(exp_avg_sq);
          const bool fp32_m =
              exp_avg == v1::MOMENT_TYPE_UNSPECIFIED || exp_avg == v1::MOMENT_TYPE_FP32;
          const bool fp32_v =
              exp_avg_sq == v1::MOMENT_TYPE_UNSPECIFIED || exp_avg_sq == v1::MOMENT_TYPE_FP32;
          // Stochastic rounding only where there is something to round.
          p->set_exp_avg_rounding(fp32_m ? v1::ROUNDING_NEAREST : rounding);
          p->set_exp_avg_sq_rounding(fp32_v ? v1::ROUNDING_UNSPECIFIED : rounding);
          EXPECT_TRUE(ValidateRegistration(r).ok())
              << p->ShortDebugString() << ": " << ValidateRegistration(r);
        }
      }
    }
  }
}

TEST(RegistrationTest, NormalizedSpecSpellsOutTheDefaultRoundingAndDelayedHistory) {
  v1::RegisterRequest r = Valid();
  r.mutable_state_policy()->set_exp_avg(v1::MOMENT_TYPE_FP8);
  r.mutable_state_policy()->set_exp_avg_sq(v1::MOMENT_TYPE_FP8);
  *r.add_serve() = Serve(v1::RECIPE_FP8_DELAYED, v1::DIRECTION_UNSPECIFIED);
  const int delayed = r.serve_size() - 1;
  v1::RegisterRequest n = NormalizedSpec(r);
  // Nearest for exp_avg, stochastic for an fp8 exp_avg_sq (DESIGN.md §3).
  EXPECT_EQ(n.state_policy().exp_avg_rounding(), v1::ROUNDING_NEAREST);
  EXPECT_EQ(n.state_policy().exp_avg_sq_rounding(), v1::ROUNDING_STOCHASTIC);
  EXPECT_EQ(n.serve(delayed).direction(), v1::DIRECTION_ROWWISE);
  EXPECT_EQ(n.serve(delayed).amax_history(), 16);
  EXPECT_EQ(n.serve(delayed).margin(), 0);
  TensorInfo info = TensorInfoOf(n, 0);
  EXPECT_EQ(info.policy.exp_avg, kernels::MomentType::kFp8);
  EXPECT_EQ(info.policy.exp_avg_rounding, kernels::Rounding::kNearest);
  EXPECT_EQ(info.policy.exp_avg_sq_rounding, kernels::Rounding::kStochastic);
  EXPECT_EQ(info.delayed_history, 16);

  // Any other narrow exp_avg_sq rounds to nearest unless told; what is sent is kept.
  for (v1::MomentType t : {v1::MOMENT_TYPE_BF16, v1::MOMENT_TYPE_FP16}) {
    r.mutable_state_policy()->set_exp_avg_sq(t);
    EXPECT_EQ(NormalizedSpec(r).state_policy().exp_avg_sq_rounding(), v1::ROUNDING_NEAREST);
  }
  r.mutable_state_policy()->set_master(v1::MASTER_TYPE_FP16);
  r.mutable_state_policy()->set_exp_avg_sq(v1::MOMENT_TYPE_FP8);
  r.mutable_state_policy()->set_exp_avg_sq_rounding(v1::ROUNDING_NEAREST);
  r.mutable_state_policy()->set_exp_avg_rounding(v1::ROUNDING_STOCHASTIC);
  r.mutable_serve(delayed)->set_amax_history(3);
  r.mutable_serve(delayed)->set_margin(2);
  n = NormalizedSpec(r);
  EXPECT_EQ(n.state_policy().exp_avg_rounding(), v1::ROUNDING_STOCHASTIC);
  EXPECT_EQ(n.state_policy().exp_avg_sq_rounding(), v1::ROUNDING_NEAREST);
  info = TensorInfoOf(n, 1);
  EXPECT_EQ(info.index, 1u);
  EXPECT_EQ(info.policy.master, kernels::MasterType::kFp16);
  EXPECT_EQ(info.policy.exp_avg_rounding, kernels::Rounding::kStochastic);
  EXPECT_EQ(info.policy.exp_avg_sq_rounding, kernels::Rounding::kNearest);
  EXPECT_EQ(info.delayed_history, 3);
  EXPECT_EQ(info.delayed_margin, 2);
}

TEST(RegistrationTest, ElementBytesOfEachGradType) {
  EXPECT_EQ(ElementBytes(v1::ELEMENT_TYPE_FP32), 4);
  EXPECT_EQ(ElementBytes(v1::ELEMENT_TYPE_BF16), 2);
  EXPECT_EQ(ElementBytes(v1::ELEMENT_TYPE_UNSPECIFIED), 0);
}

TEST(RegistrationTest, AcceptsASortedDaemonListOfNamesAndAddresses) {
  v1::RegisterRequest r = Valid();
  for (const char* d : {"10.0.0.7:50051", "10.0.0.8:50051/cpu:1", "10.0.0.8:50051/cuda:0",
                        "[fd00::1]:50051", "node-0.paramd.default.svc:50051", "node_1:65535"}) {
    r.add_daemons(d);
  }
  EXPECT_TRUE(ValidateRegistration(r).ok()) << ValidateRegistration(r);
  for (int i = 0; i < 4096; ++i) r.add_daemons(absl::StrCat("z", 10000 + i, ".test:1"));
  r.mutable_daemons()->DeleteSubrange(4096, r.daemons_size() - 4096);
  EXPECT_TRUE(ValidateRegistration(r).ok()) << ValidateRegistration(r);
}

TEST(RegistrationTest, AnOwnerOfADaemonOfSeveralBackendsHasItsBackendsDevice) {
  v1::RegisterRequest spec = Valid();
  for (const char* d : {"a.test:1", "b.test:2/cpu:1", "b.test:2/cuda:3"}) spec.add_daemons(d);
  const absl::StatusOr<ShardMap> map = JobShardMap(spec, "b.test:2/cuda:3", 7);
  ASSERT_TRUE(map.ok()) << map.status();
  ASSERT_EQ(map->owners.size(), 3u);
  // An address without a backend takes the device given (this daemon's kind).
  EXPECT_EQ(map->owners[0], (Owner{"a.test:1", 7}));
  EXPECT_EQ(map->owners[1], (Owner{"b.test:2/cpu:1", kCpuDevice}));
  EXPECT_EQ(map->owners[2], (Owner{"b.test:2/cuda:3", 3}));
  // The pieces are those of the owners' addresses alone, whatever their devices.
  EXPECT_EQ(map->tensors, JobShardMap(spec, "", kCpuDevice)->tensors);
}

TEST(RegistrationTest, ADaemonListMustNameTheDaemonByItsAdvertisedAddress) {
  v1::RegisterRequest r = Valid();
  EXPECT_TRUE(CheckDaemonList(r, "b.test:2").ok()) << "an empty list is this daemon alone";
  for (const char* d : {"a.test:1", "b.test:2", "c.test:3"}) r.add_daemons(d);
  EXPECT_TRUE(CheckDaemonList(r, "b.test:2").ok());
  EXPECT_TRUE(HasStatus(CheckDaemonList(r, "b.test:3"), absl::StatusCode::kFailedPrecondition,
                        "the daemon list of job \"job-1.a_b\", [a.test:1, b.test:2, c.test:3], "
                        "does not name this daemon, which advertises itself as \"b.test:3\""));
  // Bad input before the membership: an unsorted list that names no daemon here.
  std::swap(*r.mutable_daemons(0), *r.mutable_daemons(2));
  EXPECT_TRUE(HasStatus(CheckDaemonList(r, "x.test:9"), kInvalid, "not sorted"));
}

TEST(RegistrationTest, AnotherDaemonListThanTheJobsShowsBoth) {
  v1::RegisterRequest registered = Valid();
  registered.add_daemons("a.test:1");
  registered.add_daemons("b.test:2");
  v1::RegisterRequest same = registered;
  same.set_rank(2);
  EXPECT_TRUE(CheckSameDaemons(registered, same).ok());
  v1::RegisterRequest other = registered;
  other.set_daemons(1, "c.test:3");
  EXPECT_TRUE(HasStatus(CheckSameDaemons(registered, other), absl::StatusCode::kFailedPrecondition,
                        "job \"job-1.a_b\" is registered with daemons [a.test:1, b.test:2]; this "
                        "request lists daemons [a.test:1, c.test:3]"));
  other.clear_daemons();
  EXPECT_TRUE(HasStatus(CheckSameDaemons(registered, other), absl::StatusCode::kFailedPrecondition,
                        "this request lists daemons [] (the daemon called alone)"));
  EXPECT_TRUE(HasStatus(CheckSameDaemons(other, registered), absl::StatusCode::kFailedPrecondition,
                        "registered with daemons [] (the daemon called alone); this request "
                        "lists daemons [a.test:1, b.test:2]"));
}

TEST(RegistrationTest, AVeryLongDaemonListIsShownCutWithACount) {
  google::protobuf::RepeatedPtrField<std::string> daemons;
  for (int i = 0; i < 4096; ++i) daemons.Add(absl::StrCat("node-", 10000 + i, ".test:50051"));
  const std::string text = DaemonListText(daemons);
  EXPECT_LT(text.size(), 2200u);
  EXPECT_EQ(text.rfind("[node-10000.test:50051, node-10001.test:50051, ", 0), 0u) << text;
  EXPECT_NE(text.find(" more]"), std::string::npos) << text;
}

TEST(RegistrationTest, AJobsDaemonsAreItsListOrThisDaemonAlone) {
  v1::RegisterRequest r = Valid();
  EXPECT_EQ(JobDaemons(r, "me.test:1"), std::vector<std::string>{"me.test:1"});
  r.add_daemons("a.test:1");
  r.add_daemons("me.test:1");
  EXPECT_EQ(JobDaemons(r, "me.test:1"), (std::vector<std::string>{"a.test:1", "me.test:1"}));
}

}  // namespace
}  // namespace paramd

namespace paramd {
namespace {

// A daemon's part of a job over three daemons: the shard map's pieces of it, each with its index in
// the job, and for a split tensor's range its rows, first row and the whole tensor's rows; the
// parts of the three cover every row of every tensor once.
TEST(RegistrationTest, EachDaemonsPartHoldsItsPiecesOfTheShardMap) {
  v1::RegisterRequest spec;
  spec.set_job("j");
  spec.set_world_size(1);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{600, 16}, {64, 32}, {1, 10}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(absl::StrCat("t", i));
    t->set_rows(shapes[i].first);
    t->set_cols(shapes[i].second);
  }
  for (const char* d : {"a:1", "b:1", "c:1"}) spec.add_daemons(d);
  const absl::StatusOr<ShardMap> map = JobShardMap(spec, "", kCpuDevice);
  ASSERT_TRUE(map.ok()) << map.status();
  std::vector<int64_t> rows(shapes.size(), 0);
  for (int owner = 0; owner < 3; ++owner) {
    const absl::StatusOr<v1::RegisterRequest> part = DaemonPart(spec, spec.daemons(owner));
    ASSERT_TRUE(part.ok()) << part.status();
    EXPECT_EQ(part->daemons_size(), 3);
    for (const v1::TensorSpec& t : part->tensors()) {
      ASSERT_TRUE(t.has_job_index());
      const auto& pieces = map->tensors[static_cast<size_t>(t.job_index())];
      const auto piece = std::find_if(pieces.begin(), pieces.end(),
                                      [&](const ShardPiece& p) { return p.owner == owner; });
      ASSERT_NE(piece, pieces.end()) << t.name();
      EXPECT_EQ(t.name(), spec.tensors(t.job_index()).name());
      EXPECT_EQ(t.rows(), piece->row_end - piece->row_begin);
      EXPECT_EQ(t.row_offset(), piece->row_begin);
      EXPECT_EQ(t.whole_rows(), pieces.size() > 1 ? shapes[t.job_index()].first : 0);
      rows[static_cast<size_t>(t.job_index())] += t.rows();
    }
  }
  for (size_t i = 0; i < shapes.size(); ++i) EXPECT_EQ(rows[i], shapes[i].first) << i;
  EXPECT_EQ(map->tensors[0].size(), 3u);  // the big tensor is split over all three
  // A list that does not name the daemon; a job without a list is held whole.
  EXPECT_EQ(DaemonPart(spec, "d:1").status().code(), absl::StatusCode::kFailedPrecondition);
  v1::RegisterRequest alone = spec;
  alone.clear_daemons();
  const absl::StatusOr<v1::RegisterRequest> whole = DaemonPart(alone, "a:1");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->ShortDebugString(), alone.ShortDebugString());
}

}  // namespace
}  // namespace paramd
