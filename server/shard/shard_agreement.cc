#include "server/shard/shard_agreement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "kernels/step_rules.h"

namespace paramd {
namespace {

class Identity final : public ShardAgreement {
 public:
  bool alone() const override { return true; }
  absl::StatusOr<bool> AgreeOnCheck(int64_t step, bool finite,
                                    const std::vector<std::vector<double>>& block_sums,
                                    std::vector<double>* blocks) override {
    blocks->clear();
    for (const std::vector<double>& tensor : block_sums) {
      blocks->insert(blocks->end(), tensor.begin(), tensor.end());
    }
    return finite;
  }
  std::function<absl::StatusOr<float>(float)> WholeAmaxOf(size_t, int64_t,
                                                          const std::string&) override {
    return nullptr;
  }
};

class Peers final : public ShardAgreement {
 public:
  Peers(std::string job, const v1::RegisterRequest& part, std::vector<std::vector<int>> amax_among,
        PeerExchange* exchange)
      : job_(std::move(job)), amax_among_(std::move(amax_among)), exchange_(exchange) {
    for (const v1::TensorSpec& t : part.tensors()) {
      job_index_.push_back(t.job_index());
      first_block_.push_back(t.row_offset() / kernels::kNormBlockRows);
    }
  }

  bool alone() const override { return false; }

  absl::StatusOr<bool> AgreeOnCheck(int64_t step, bool finite,
                                    const std::vector<std::vector<double>>& block_sums,
                                    std::vector<double>* blocks) override {
    v1::PeerOffer offer;
    offer.set_job(job_);
    offer.set_step(step);
    offer.set_round("check");
    offer.set_finite(finite);
    for (size_t i = 0; i < block_sums.size(); ++i) {
      v1::PeerBlockSums* sums = offer.add_block_sums();
      sums->set_tensor(job_index_[i]);
      sums->set_first_block(first_block_[i]);
      sums->mutable_sums()->Add(block_sums[i].begin(), block_sums[i].end());
    }
    PARAMD_ASSIGN_OR_RETURN(const std::vector<v1::PeerOffer> offers,
                            exchange_->Exchange(std::move(offer)));
    bool all_finite = true;
    std::vector<const v1::PeerBlockSums*> all;
    for (const v1::PeerOffer& o : offers) {
      all_finite = all_finite && o.finite();
      for (const v1::PeerBlockSums& sums : o.block_sums()) all.push_back(&sums);
    }
    std::sort(all.begin(), all.end(), [](const v1::PeerBlockSums* a, const v1::PeerBlockSums* b) {
      return std::pair(a->tensor(), a->first_block()) < std::pair(b->tensor(), b->first_block());
    });
    blocks->clear();
    for (const v1::PeerBlockSums* sums : all) {
      blocks->insert(blocks->end(), sums->sums().begin(), sums->sums().end());
    }
    return all_finite;
  }

  std::function<absl::StatusOr<float>(float)> WholeAmaxOf(size_t index, int64_t step,
                                                          const std::string& round) override {
    if (amax_among_[index].empty()) return nullptr;
    return [this, among = amax_among_[index], step,
            name = absl::StrCat(round, "/", job_index_[index])](
               float range_amax) -> absl::StatusOr<float> {
      v1::PeerOffer offer;
      offer.set_job(job_);
      offer.set_step(step);
      offer.set_round(name);
      offer.set_amax(range_amax);
      absl::StatusOr<std::vector<v1::PeerOffer>> offers =
          exchange_->Exchange(std::move(offer), among);
      if (!offers.ok()) {
        return absl::AbortedError(
            absl::StrCat("the owners of tensor ", Quoted(name),
                         " did not agree on its amax: ", offers.status().ToString()));
      }
      // The max of non-negative floats is exact in any order; a NaN stays NaN (as one daemon's).
      float whole = 0.0f;
      for (const v1::PeerOffer& o : *offers) {
        whole = std::isnan(whole) || std::isnan(o.amax()) ? std::numeric_limits<float>::quiet_NaN()
                                                          : std::max(whole, o.amax());
      }
      return whole;
    };
  }

 private:
  const std::string job_;
  const std::vector<std::vector<int>> amax_among_;
  PeerExchange* const exchange_;
  std::vector<int32_t> job_index_;    // per tensor of the part: its index in the job
  std::vector<int64_t> first_block_;  // per tensor of the part: its first norm block in the job's
};

}  // namespace

std::unique_ptr<ShardAgreement> IdentityAgreement() { return std::make_unique<Identity>(); }

std::unique_ptr<ShardAgreement> PeerAgreement(std::string job, const v1::RegisterRequest& part,
                                              std::vector<std::vector<int>> amax_among,
                                              PeerExchange* exchange) {
  return std::make_unique<Peers>(std::move(job), part, std::move(amax_among), exchange);
}

}  // namespace paramd
