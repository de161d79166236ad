#include "model/tensor_parallel_model.h"

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_communicator.h"
#include "model/model_registry.h"

namespace mx {
namespace {

constexpr int kMaxTensorParallelSize = 64;

// One persistent thread per rank but the first (which runs on the caller's thread).
class RankThreads {
 public:
  explicit RankThreads(int size) : results_(static_cast<size_t>(size)) {
    for (int r = 1; r < size; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // job(r) for every rank at once; each rank's status, in rank order.
  std::vector<Status> run(const std::function<Status(int)>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      pending_ = static_cast<int>(threads_.size());
      ++round_;
    }
    start_.notify_all();
    results_[0] = job(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    return results_;
  }

 private:
  void loop(int rank) {
    int64_t seen = 0;
    for (;;) {
      const std::function<Status(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || round_ != seen; });
        if (stop_) return;
        seen = round_;
        job = job_;
      }
      Status st = (*job)(rank);
      std::lock_guard<std::mutex> lock(mu_);
      results_[static_cast<size_t>(rank)] = std::move(st);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<Status(int)>* job_ = nullptr;
  int64_t round_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<Status> results_;
  std::vector<std::thread> threads_;
};

struct TensorParallelWorkspace : ModelWorkspace {
  std::vector<std::unique_ptr<ModelWorkspace>> ranks;
  std::vector<Buffer> logits;  // [size] f32 [max_logit_rows, vocab] for ranks 1.. (rank 0 writes the caller's)
};

class TensorParallelModel final : public Model {
 public:
  explicit TensorParallelModel(int size) : group_(size), threads_(size) {
    for (int r = 0; r < size; ++r) comms_.push_back(group_.communicator(r));
  }

  Status load(const std::string& model_dir, Backend& backend, const BackendOptions& options) {
    const int size = group_.size();
    backends_.resize(static_cast<size_t>(size));
    std::vector<KvLayerSpec> layers;
    for (int r = 0; r < size; ++r) {
      Backend* b = &backend;
      if (r > 0) {
        MX_ASSIGN_OR_RETURN(backends_[static_cast<size_t>(r)], make_backend(options));
        b = backends_[static_cast<size_t>(r)].get();
      }
      const ModelShard shard{r, size, comms_[static_cast<size_t>(r)].get(), static_cast<int64_t>(layers.size())};
      MX_ASSIGN_OR_RETURN(auto rank, load_model(model_dir, *b, shard));
      const auto& own = rank->kv_layout().layers;
      layers.insert(layers.end(), own.begin(), own.end());
      ranks_.push_back(std::move(rank));
    }
    kv_layout_ = KvLayout::from_layers(std::move(layers));
    return Status::ok();
  }

  std::string family() const override { return ranks_[0]->family(); }
  const ModelDims& dims() const override { return ranks_[0]->dims(); }
  const GenerationConfig& generation_config() const override { return ranks_[0]->generation_config(); }
  Backend& backend() const override { return ranks_[0]->backend(); }
  int64_t device_weight_bytes() const override {
    int64_t total = 0;
    for (const auto& r : ranks_) total += r->device_weight_bytes();
    return total;
  }
  const KvLayout& kv_layout() const override { return kv_layout_; }
  const ModelCost& cost() const override { return ranks_[0]->cost(); }

  Result<std::unique_ptr<ModelWorkspace>> make_workspace(int64_t max_tokens, int64_t max_logit_rows) const override {
    auto ws = std::make_unique<TensorParallelWorkspace>();
    ws->max_tokens = max_tokens;
    ws->max_logit_rows = max_logit_rows;
    const int64_t bytes = max_logit_rows * dims().vocab_size * static_cast<int64_t>(sizeof(float));
    for (size_t r = 0; r < ranks_.size(); ++r) {
      MX_ASSIGN_OR_RETURN(auto own, ranks_[r]->make_workspace(max_tokens, max_logit_rows));
      ws->ranks.push_back(std::move(own));
      if (r > 0) {
        MX_ASSIGN_OR_RETURN(ws->logits.emplace_back(), ranks_[r]->backend().allocate(std::max<int64_t>(bytes, 4)));
      }
    }
    return std::unique_ptr<ModelWorkspace>(std::move(ws));
  }

  Result<ForwardOutput> forward(const BatchView& batch, const KvCache& kv, ModelWorkspace& workspace, TensorView logits,
                                const HiddenObserver* observer) const override {
    auto* ws = dynamic_cast<TensorParallelWorkspace*>(&workspace);
    if (!ws || ws->ranks.size() != ranks_.size())
      return invalid_argument("tensor-parallel forward pass given another model's workspace");
    group_.reset();
    std::vector<ForwardOutput> outputs(ranks_.size());
    const std::vector<Status> statuses = threads_.run([&](int r) -> Status {
      const auto i = static_cast<size_t>(r);
      const TensorView own_logits =
          r == 0 ? logits : ws->logits[i - 1].view(DType::kF32, {batch.num_logit_rows, dims().vocab_size});
      auto out = ranks_[i]->forward(batch, kv, *ws->ranks[i], own_logits, r == 0 ? observer : nullptr);
      if (!out.is_ok()) {
        comms_[i]->abort();  // the others may be waiting for this rank in a collective
        return out.status();
      }
      outputs[i] = *out;
      return Status::ok();
    });
    // The failure that caused the others, if any rank failed on its own.
    const Status* first = nullptr;
    for (const Status& st : statuses) {
      if (st.is_ok()) continue;
      if (!first) first = &st;
      if (st.message() != kTensorParallelAborted) return st;
    }
    if (first) return *first;
    return outputs[0];
  }

 private:
  mutable CpuCommGroup group_;
  mutable RankThreads threads_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<Backend>> backends_;  // [size]; rank 0's is the caller's (null here)
  std::vector<std::unique_ptr<Model>> ranks_;
  KvLayout kv_layout_;
};

}  // namespace

Status check_tensor_parallel_backend(const BackendOptions& options, int size) {
  if (size < 1 || size > kMaxTensorParallelSize)
    return invalid_argument("tensor parallel size must be in [1, " + std::to_string(kMaxTensorParallelSize) + "], got " +
                            std::to_string(size));
  if (size > 1 && options.name != "cpu")
    return unimplemented("tensor parallel runs on the CPU backend only so far (--backend cpu); on " + options.name +
                         " one device per server for now");
  return Status::ok();
}

Result<std::unique_ptr<Model>> load_tensor_parallel_model(const std::string& model_dir, Backend& backend,
                                                          const BackendOptions& options, int size) {
  MX_RETURN_IF_ERROR(check_tensor_parallel_backend(options, size));
  if (size == 1) return load_model(model_dir, backend);
  if (backend.device() != Device::kCpu) return invalid_argument("tensor parallel rank 0 must be a CPU backend");
  auto model = std::make_unique<TensorParallelModel>(size);
  MX_RETURN_IF_ERROR(model->load(model_dir, backend, options));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace mx
