// ValidateRegistration refuses every bad job description with INVALID_ARGUMENT (or UNIMPLEMENTED
// for what this build cannot do yet) and a message naming the field; NormalizedSpec and
// ServedFormats give the description every rank must repeat and the formats served.
#include "server/registration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

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
constexpr auto kUnimplemented = absl::StatusCode::kUnimplemented;

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
      {"Bf16RemainderMaster",
       [](R& r) { r.mutable_state_policy()->set_master(v1::MASTER_TYPE_BF16_REMAINDER); },
       kUnimplemented, "state policy"},
      {"Fp16Master", [](R& r) { r.mutable_state_policy()->set_master(v1::MASTER_TYPE_FP16); },
       kUnimplemented, "use the fp32 policy"},
      {"Fp8ExpAvg", [](R& r) { r.mutable_state_policy()->set_exp_avg(v1::MOMENT_TYPE_FP8); },
       kUnimplemented, "state policy"},
      {"Bf16ExpAvgSq", [](R& r) { r.mutable_state_policy()->set_exp_avg_sq(v1::MOMENT_TYPE_BF16); },
       kUnimplemented, "state policy"},
      {"ServeFp16", [](R& r) { *r.add_serve() = Serve(v1::RECIPE_FP16); }, kUnimplemented,
       "serve recipe RECIPE_FP16"},
      {"ServeFp8Tensor", [](R& r) { *r.add_serve() = Serve(v1::RECIPE_FP8_TENSOR); },
       kUnimplemented, "serve recipe RECIPE_FP8_TENSOR"},
      {"ServeFp8Delayed", [](R& r) { *r.add_serve() = Serve(v1::RECIPE_FP8_DELAYED); },
       kUnimplemented, "serve recipe RECIPE_FP8_DELAYED"},
      {"ServeFp8Block",
       [](R& r) { *r.add_serve() = Serve(v1::RECIPE_FP8_BLOCK, v1::DIRECTION_COLUMNWISE); },
       kUnimplemented, "serve recipe RECIPE_FP8_BLOCK"},
      {"ServeMxfp8", [](R& r) { *r.add_serve() = Serve(v1::RECIPE_MXFP8); }, kUnimplemented,
       "serve recipe RECIPE_MXFP8"},
      {"ServeUnspecifiedRecipe", [](R& r) { *r.add_serve() = Serve(v1::RECIPE_UNSPECIFIED); },
       kUnimplemented, "serve recipe RECIPE_UNSPECIFIED"},
      {"ColumnwiseBf16",
       [](R& r) { *r.add_serve() = Serve(v1::RECIPE_BF16, v1::DIRECTION_COLUMNWISE); }, kInvalid,
       "RECIPE_BF16 has no columnwise direction"},
      {"ColumnwiseFp32",
       [](R& r) { *r.add_serve() = Serve(v1::RECIPE_FP32, v1::DIRECTION_COLUMNWISE); }, kInvalid,
       "RECIPE_FP32 has no columnwise direction"},
      {"UnknownPushMode", [](R& r) { r.set_push_mode(static_cast<v1::PushMode>(7)); }, kInvalid,
       "push_mode 7"},
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

TEST(RegistrationTest, ServedFormatsPutFp32FirstWithoutRepeats) {
  v1::RegisterRequest r = Valid();
  r.clear_serve();
  EXPECT_EQ(ServedFormats(r), (std::vector<FormatKey>{{v1::RECIPE_FP32, v1::DIRECTION_ROWWISE}}));

  *r.add_serve() = Serve(v1::RECIPE_BF16, v1::DIRECTION_UNSPECIFIED);
  *r.add_serve() = Serve(v1::RECIPE_FP32);
  *r.add_serve() = Serve(v1::RECIPE_BF16, v1::DIRECTION_ROWWISE);
  EXPECT_EQ(ServedFormats(r), (std::vector<FormatKey>{{v1::RECIPE_FP32, v1::DIRECTION_ROWWISE},
                                                      {v1::RECIPE_BF16, v1::DIRECTION_ROWWISE}}));
}

TEST(RegistrationTest, ElementBytesOfEachGradType) {
  EXPECT_EQ(ElementBytes(v1::ELEMENT_TYPE_FP32), 4);
  EXPECT_EQ(ElementBytes(v1::ELEMENT_TYPE_BF16), 2);
  EXPECT_EQ(ElementBytes(v1::ELEMENT_TYPE_UNSPECIFIED), 0);
}

}  // namespace
}  // namespace paramd
