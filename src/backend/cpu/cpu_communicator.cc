#include "backend/cpu/cpu_communicator.h"

#include <cstring>
#include <string>

#include "core/dtype.h"

namespace mx {

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<CpuCommGroup> group, int rank) : owner_(std::move(group)), group_(*owner_), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }

  Status all_reduce_sum(TensorView x) override {
    if (x.dtype() != DType::kF32 && x.dtype() != DType::kBF16)
      return invalid_argument(std::string("all_reduce_sum of ") + dtype_name(x.dtype()));
    const int64_t n = x.numel();
    group_.published_[static_cast<size_t>(rank_)] = x.data();
    group_.widths_[static_cast<size_t>(rank_)] = n;
    if (!group_.arrive_and_wait()) return aborted();
    for (int64_t w : group_.widths_)
      if (w != n) return fail("all_reduce_sum: ranks gave tensors of different sizes");
    // Every rank sums all ranks' tensors in rank order into its own scratch, then (once nobody reads the
    // inputs any more) writes the sum back: the same bits on every rank.
    sum_.assign(static_cast<size_t>(n), 0.0f);
    for (const void* src : group_.published_) {
      if (x.dtype() == DType::kF32) {
        const auto* s = static_cast<const float*>(src);
        for (int64_t i = 0; i < n; ++i) sum_[static_cast<size_t>(i)] += s[i];
      } else {
        const auto* s = static_cast<const uint16_t*>(src);
        for (int64_t i = 0; i < n; ++i) sum_[static_cast<size_t>(i)] += bf16_to_f32(s[i]);
      }
    }
    if (!group_.arrive_and_wait()) return aborted();
    if (x.dtype() == DType::kF32) {
      std::memcpy(x.data(), sum_.data(), static_cast<size_t>(n) * sizeof(float));
    } else {
      auto* d = x.ptr<uint16_t>();
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(sum_[static_cast<size_t>(i)]);
    }
    return Status::ok();
  }

  Status all_gather_columns(const TensorView& local, TensorView out) override {
    if (local.dtype() != DType::kF32 || out.dtype() != DType::kF32 || local.shape().rank != 2 || out.shape().rank != 2)
      return invalid_argument("all_gather_columns takes f32 [R, n] blocks into f32 [R, N]");
    const int64_t rows = local.dim(0), width = local.dim(1);
    group_.published_[static_cast<size_t>(rank_)] = local.data();
    group_.widths_[static_cast<size_t>(rank_)] = width;
    if (!group_.arrive_and_wait()) return aborted();
    int64_t total = 0;
    for (int64_t w : group_.widths_) total += w;
    for (int r = 0; r < size(); ++r)
      if (group_.widths_[static_cast<size_t>(r)] != split_range(total, r, size()).second - split_range(total, r, size()).first)
        return fail("all_gather_columns: the ranks' widths do not split the columns evenly");
    if (out.dim(0) != rows || out.dim(1) != total)
      return fail("all_gather_columns: output [" + std::to_string(out.dim(0)) + ", " + std::to_string(out.dim(1)) +
                  "] for " + std::to_string(rows) + " rows of " + std::to_string(total) + " columns");
    auto* dst = out.ptr<float>();
    int64_t column = 0;
    for (size_t r = 0; r < group_.published_.size(); ++r) {
      const auto* src = static_cast<const float*>(group_.published_[r]);
      const int64_t w = group_.widths_[r];
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(dst + i * total + column, src + i * w, static_cast<size_t>(w) * sizeof(float));
      column += w;
    }
    // Nobody may overwrite its block before every rank copied it.
    if (!group_.arrive_and_wait()) return aborted();
    return Status::ok();
  }

  void abort() override { group_.abort(); }
  void begin_round() override { group_.reset(); }

 private:
  static Status aborted() { return internal_error(kTensorParallelAborted); }
  // A mismatch every rank sees alike: each fails, and the abort wakes any rank already waiting further on.
  Status fail(const std::string& why) {
    group_.abort();
    return internal_error(why);
  }

  std::shared_ptr<CpuCommGroup> owner_;
  CpuCommGroup& group_;
  const int rank_;
  std::vector<float> sum_;
};

CpuCommGroup::CpuCommGroup(int size)
    : size_(size), published_(static_cast<size_t>(size)), widths_(static_cast<size_t>(size)) {}

std::shared_ptr<CpuCommGroup> CpuCommGroup::create(int size) { return std::shared_ptr<CpuCommGroup>(new CpuCommGroup(size)); }

std::unique_ptr<Communicator> CpuCommGroup::communicator(int rank) {
  return std::make_unique<CpuCommunicator>(shared_from_this(), rank);
}

void CpuCommGroup::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  arrived_ = 0;
}

bool CpuCommGroup::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return false;
  const int64_t generation = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return true;
  }
  cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
  return generation_ != generation;
}

void CpuCommGroup::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

}  // namespace mx
