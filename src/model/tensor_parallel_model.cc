#include "model/tensor_parallel_model.h"

#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/communicator.h"
#include "backend/forwarding_backend.h"
#include "model/model_registry.h"

namespace mx {
namespace {

constexpr int kMaxTensorParallelSize = 64;

// One persistent thread per rank but the first (which runs on the caller's thread).
class RankThreads {
 public:
  explicit RankThreads(int size) : results_(static_cast<size_t>(size)) {
    threads_.reserve(static_cast<size_t>(size));
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

class TensorParallelModel;

// Rank 0's backend as the engine sees it. Its capture() records every rank: rank 0's stream around the whole
// body (so whatever else the body queues on rank 0 lands in its graph), each other rank's stream around its
// share of each forward pass the body runs (TensorParallelModel::forward); replay launches them all.
class RankZeroBackend final : public ForwardingBackend {
 public:
  RankZeroBackend(Backend& inner, TensorParallelModel& model) : ForwardingBackend(inner), model_(model) {}
  bool can_capture() const override;
  Result<std::unique_ptr<ReplayGraph>> capture(const std::function<Status()>& body) override;

 private:
  TensorParallelModel& model_;
};

struct TensorParallelWorkspace : ModelWorkspace {
  std::vector<std::unique_ptr<ModelWorkspace>> ranks;
  std::vector<Buffer> logits;  // [size] f32 [max_logit_rows, vocab] for ranks 1.. (rank 0 writes the caller's)
};

class TensorParallelModel final : public Model {
 public:
  TensorParallelModel(int size, Backend& rank_zero) : size_(size), threads_(size), rank_zero_(rank_zero, *this) {}

  // Rank r on device options.device + r (CUDA) or on another CPU backend; rank 0 on the caller's backend.
  Status load(const std::string& model_dir, Backend& backend, const BackendOptions& options,
              const ModelLoadOptions& load_options) {
    std::vector<Backend*> raw = {&backend};
    backends_.resize(static_cast<size_t>(size_));
    for (int r = 1; r < size_; ++r) {
      BackendOptions o = options;
      o.device = options.device + r;
      MX_ASSIGN_OR_RETURN(backends_[static_cast<size_t>(r)], make_backend(o));
      raw.push_back(backends_[static_cast<size_t>(r)].get());
    }
    MX_RETURN_IF_ERROR(backend.make_current());
    MX_ASSIGN_OR_RETURN(comms_, make_communicators(raw));
    std::vector<KvLayerSpec> layers;
    for (int r = 0; r < size_; ++r) {
      Backend& b = *raw[static_cast<size_t>(r)];
      MX_RETURN_IF_ERROR(b.make_current());
      const ModelShard shard{r, size_, comms_[static_cast<size_t>(r)].get(), static_cast<int64_t>(layers.size())};
      auto rank = load_model(model_dir, b, shard, load_options);
      if (!rank.is_ok()) {
        MX_RETURN_IF_ERROR(backend.make_current());
        return rank.status();
      }
      const auto& own = (*rank)->kv_layout().layers;
      layers.insert(layers.end(), own.begin(), own.end());
      for (size_t l = 0; l < own.size(); ++l) layer_backends_.push_back(&b);
      ranks_.push_back(std::move(rank).value());
    }
    MX_RETURN_IF_ERROR(backend.make_current());
    kv_layout_ = KvLayout::from_layers(std::move(layers));
    return Status::ok();
  }

  std::string family() const override { return ranks_[0]->family(); }
  const ModelDims& dims() const override { return ranks_[0]->dims(); }
  const GenerationConfig& generation_config() const override { return ranks_[0]->generation_config(); }
  Backend& backend() const override { return rank_zero_; }
  // Per device, for the memory plan of rank 0's device: the largest rank's share.
  int64_t device_weight_bytes() const override {
    int64_t most = 0;
    for (const auto& r : ranks_) most = std::max(most, r->device_weight_bytes());
    return most;
  }
  Result<KvCache> allocate_kv_cache(const KvCacheShape& shape) const override {
    return KvCache::allocate(layer_backends_, shape);
  }
  const KvLayout& kv_layout() const override { return kv_layout_; }
  // Each rank's layers on its own device (CUDA); CPU ranks share one memory and one budget.
  int64_t kv_devices() const override { return rank_zero_.device() == Device::kCpu ? 1 : size_; }
  const ModelCost& cost() const override { return ranks_[0]->cost(); }
  std::string parallel_summary() const override {
    std::string text = "tensor parallel over " + std::to_string(size_) + " ranks";
    for (size_t r = 0; r < ranks_.size(); ++r) {
      char weights[32];
      std::snprintf(weights, sizeof(weights), "%.2f GiB", static_cast<double>(ranks_[r]->device_weight_bytes()) / (1 << 30));
      const std::string own = ranks_[r]->parallel_summary();
      text += "; rank " + std::to_string(r) + ": " + (own.empty() ? "" : own + ", ") + "weights " + weights;
    }
    return text;
  }

  Result<std::unique_ptr<ModelWorkspace>> make_workspace(int64_t max_tokens, int64_t max_logit_rows) const override {
    auto ws = std::make_unique<TensorParallelWorkspace>();
    ws->max_tokens = max_tokens;
    ws->max_logit_rows = max_logit_rows;
    const int64_t bytes = max_logit_rows * dims().vocab_size * static_cast<int64_t>(sizeof(float));
    for (size_t r = 0; r < ranks_.size(); ++r) {
      MX_RETURN_IF_ERROR(ranks_[r]->backend().make_current());
      MX_ASSIGN_OR_RETURN(auto own, ranks_[r]->make_workspace(max_tokens, max_logit_rows));
      ws->ranks.push_back(std::move(own));
      if (r > 0) {
        MX_ASSIGN_OR_RETURN(ws->logits.emplace_back(), ranks_[r]->backend().allocate(std::max<int64_t>(bytes, 4)));
      }
    }
    MX_RETURN_IF_ERROR(ranks_[0]->backend().make_current());
    return std::unique_ptr<ModelWorkspace>(std::move(ws));
  }

  Result<ForwardOutput> forward(const BatchView& batch, const KvCache& kv, ModelWorkspace& workspace, TensorView logits,
                                const HiddenObserver* observer) const override {
    auto* ws = dynamic_cast<TensorParallelWorkspace*>(&workspace);
    if (!ws || ws->ranks.size() != ranks_.size())
      return invalid_argument("tensor-parallel forward pass given another model's workspace");
    if (capture_ && observer) return invalid_argument("a captured tensor-parallel forward pass cannot observe hidden rows");
    comms_[0]->begin_round();
    std::vector<ForwardOutput> outputs(ranks_.size());
    const std::vector<Status> statuses = threads_.run([&](int r) -> Status {
      const auto i = static_cast<size_t>(r);
      if (r > 0) MX_RETURN_IF_ERROR(ranks_[i]->backend().make_current());
      const TensorView own_logits =
          r == 0 ? logits : ws->logits[i - 1].view(DType::kF32, {batch.num_logit_rows, dims().vocab_size});
      Status st;
      if (capture_ && r > 0) {
        // Rank 0's stream is being captured by the caller; the others record their share here, on their own
        // threads and streams, collectives included.
        auto graph = ranks_[i]->backend().capture([&] {
          auto out = ranks_[i]->forward(batch, kv, *ws->ranks[i], own_logits, nullptr);
          if (out.is_ok()) outputs[i] = *out;
          return out.status();
        });
        if (graph.is_ok()) capture_->ranks[i - 1].push_back(std::move(graph).value());
        st = graph.status();
      } else {
        auto out = ranks_[i]->forward(batch, kv, *ws->ranks[i], own_logits, r == 0 ? observer : nullptr);
        if (out.is_ok()) outputs[i] = *out;
        st = out.status();
      }
      // The others may be waiting for this rank in a collective (nothing waits while capturing).
      if (!st.is_ok() && !capture_) comms_[i]->abort();
      return st;
    });
    // The failure that caused the others, if any rank failed on its own.
    const Status* first = nullptr;
    for (const Status& st : statuses) {
      if (st.is_ok()) continue;
      if (!first) first = &st;
      if (st.message() != kTensorParallelAborted) return st;
    }
    if (first) return *first;
    if (!capture_) MX_RETURN_IF_ERROR(finish_others());
    return outputs[0];
  }

  // Whether every rank's backend can record its work in a graph (CUDA).
  bool can_capture() const {
    for (const auto& r : ranks_)
      if (!r->backend().can_capture()) return false;
    return true;
  }

  // RankZeroBackend::capture: `body` runs once with rank 0's stream in capture and the forward passes it
  // makes record every other rank's share on that rank (forward above); the graph replays them all.
  Result<std::unique_ptr<ReplayGraph>> capture(Backend& rank_zero, const std::function<Status()>& body) {
    if (!can_capture()) return unimplemented("the tensor-parallel ranks' backends cannot capture graphs");
    if (capture_) return internal_error("nested tensor-parallel graph capture");
    RankGraphs others;
    others.ranks.resize(ranks_.size() - 1);
    capture_ = &others;
    auto zero = rank_zero.capture(body);
    capture_ = nullptr;
    MX_RETURN_IF_ERROR(rank_zero.make_current());
    if (!zero.is_ok()) return zero.status();
    for (const auto& rank : others.ranks)
      if (rank.size() != others.ranks[0].size())
        return internal_error("the tensor-parallel ranks captured different numbers of forward passes");
    return std::unique_ptr<ReplayGraph>(new TensorParallelGraph(*this, std::move(zero).value(), std::move(others)));
  }

 private:
  // Each rank but 0's graphs of one capture, in the order its forward passes ran.
  struct RankGraphs {
    std::vector<std::vector<std::unique_ptr<ReplayGraph>>> ranks;  // [size - 1]
  };

  // Launches rank 0's graph and every other rank's, one after another from the calling thread: a CUDA graph
  // launch only queues work, and the ranks' collectives meet on the devices.
  class TensorParallelGraph final : public ReplayGraph {
   public:
    TensorParallelGraph(const TensorParallelModel& model, std::unique_ptr<ReplayGraph> zero, RankGraphs others)
        : model_(model), zero_(std::move(zero)), others_(std::move(others)) {}
    Status replay() override {
      MX_RETURN_IF_ERROR(zero_->replay());
      for (size_t r = 1; r < model_.ranks_.size(); ++r) {
        Status st = model_.ranks_[r]->backend().make_current();
        for (size_t g = 0; st.is_ok() && g < others_.ranks[r - 1].size(); ++g) st = others_.ranks[r - 1][g]->replay();
        if (!st.is_ok()) {
          model_.comms_[r]->abort();  // the ranks already launched would wait for this one forever
          (void)model_.ranks_[0]->backend().make_current();
          return st;
        }
      }
      MX_RETURN_IF_ERROR(model_.ranks_[0]->backend().make_current());
      return model_.finish_others();
    }

   private:
    const TensorParallelModel& model_;
    std::unique_ptr<ReplayGraph> zero_;
    RankGraphs others_;
  };

  // Rank 0 returns once its work is queued; the others' queued work must be done before their buffers (and
  // the staged batch they read from rank 0's memory) change. Leaves rank 0's device current.
  Status finish_others() const {
    for (size_t r = 1; r < ranks_.size(); ++r) {
      MX_RETURN_IF_ERROR(ranks_[r]->backend().make_current());
      const Status st = ranks_[r]->backend().synchronize();
      MX_RETURN_IF_ERROR(ranks_[0]->backend().make_current());
      MX_RETURN_IF_ERROR(st);
    }
    return Status::ok();
  }

 private:
  const int size_;
  mutable RankThreads threads_;
  mutable RankZeroBackend rank_zero_;
  std::vector<std::unique_ptr<Backend>> backends_;  // [size]; rank 0's is the caller's (null here)
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<Model>> ranks_;
  std::vector<Backend*> layer_backends_;  // each KV layer's rank's backend
  KvLayout kv_layout_;
  mutable RankGraphs* capture_ = nullptr;  // set while RankZeroBackend captures
};

bool RankZeroBackend::can_capture() const { return model_.can_capture(); }

Result<std::unique_ptr<ReplayGraph>> RankZeroBackend::capture(const std::function<Status()>& body) {
  return model_.capture(inner(), body);
}

}  // namespace

Status check_tensor_parallel_backend(const BackendOptions& options, int size) {
  if (size < 1 || size > kMaxTensorParallelSize)
    return invalid_argument("tensor parallel size must be in [1, " + std::to_string(kMaxTensorParallelSize) + "], got " +
                            std::to_string(size));
  if (size > 1 && options.name != "cpu" && options.name != "cuda")
    return unimplemented("tensor parallel runs on the cpu and cuda backends, not " + options.name);
  return Status::ok();
}

Result<std::unique_ptr<Model>> load_tensor_parallel_model(const std::string& model_dir, Backend& backend,
                                                          const BackendOptions& options, int size,
                                                          const ModelLoadOptions& load_options) {
  MX_RETURN_IF_ERROR(check_tensor_parallel_backend(options, size));
  if (size == 1) return load_model(model_dir, backend, ModelShard{}, load_options);
  auto model = std::make_unique<TensorParallelModel>(size, backend);
  MX_RETURN_IF_ERROR(model->load(model_dir, backend, options, load_options));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace mx
