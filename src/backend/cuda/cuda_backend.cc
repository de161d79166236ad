#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/cublaslt_linear.h"
#include "backend/forwarding_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/expert_repack.h"
#include "backend/cuda/kernel_configs.h"
#include "backend/cuda/kernels/cluster_kernels.h"
#include "backend/cuda/kernels/norm_fusion_kernels.h"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/llama_kernels.h"
#include "backend/cuda/kernels/moe_tile_order.h"
#include "backend/cuda/kernels/attention_wgmma_wide.h"
#include "backend/cuda/kernels/moe_wgmma_ws.h"

namespace mx {
namespace {

using namespace mx::cuda;

constexpr int64_t kLtWorkspaceBytes = 32ll << 20;
// linear_fp8 above 16 rows: the largest bf16 slab of widened FP8 weights (gpt-oss qkv and o fit in one; the
// lm_head takes ~18 slabs at 20b).
constexpr int64_t kFp8SlabBytes = 64ll << 20;
// Router batches up to this size run the fused GEMV + top-k kernel; larger ones use cuBLASLt for logits.
constexpr int64_t kFusedRouterMaxTokens = 32;

// What allocate() holds, per device (Backend::allocated_bytes): every allocation's size by its address.
struct DeviceAllocations {
  std::mutex mutex;
  std::unordered_map<void*, std::pair<int, int64_t>> sizes;  // address -> device, bytes
  std::map<int, int64_t> total;                               // device -> bytes
};
DeviceAllocations& device_allocations() {
  static DeviceAllocations* a = new DeviceAllocations();  // never destroyed: buffers may outlive static destructors
  return *a;
}
void count_allocation(void* p, int device, int64_t bytes) {
  DeviceAllocations& a = device_allocations();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.sizes[p] = {device, bytes};
  a.total[device] += bytes;
}
void free_device(void* p) {
  {
    DeviceAllocations& a = device_allocations();
    std::lock_guard<std::mutex> lock(a.mutex);
    if (auto it = a.sizes.find(p); it != a.sizes.end()) {
      a.total[it->second.first] -= it->second.second;
      a.sizes.erase(it);
    }
  }
  cudaFree(p);
}


template <typename T>
T* ptr(const TensorView& t) {
  return static_cast<T*>(t.data());
}

void expect(const TensorView& t, DType dtype, const char* what) {
  MX_CHECK(t.device() == Device::kCuda) << what << " is not in device memory";
  MX_CHECK(t.dtype() == dtype) << what << ": " << dtype_name(t.dtype()) << ", expected " << dtype_name(dtype);
}

class CudaReplayGraph final : public ReplayGraph {
 public:
  CudaReplayGraph(CudaGraphExec exec, cudaStream_t stream) : exec_(std::move(exec)), stream_(stream) {}
  Status replay() override {
    MX_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_.get(), stream_));
    return Status::ok();
  }

 private:
  CudaGraphExec exec_;
  cudaStream_t stream_;
};

// CUDA events on the ops' stream; slot 0 is the reference of read().
class CudaDeviceTimer final : public DeviceTimer {
 public:
  static Result<std::unique_ptr<DeviceTimer>> create(int64_t slots, cudaStream_t stream) {
    auto t = std::unique_ptr<CudaDeviceTimer>(new CudaDeviceTimer(stream));
    for (int64_t i = 0; i < slots; ++i) {
      cudaEvent_t e = nullptr;
      MX_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
      t->events_.emplace_back(e);
    }
    return std::unique_ptr<DeviceTimer>(std::move(t));
  }
  int64_t capacity() const override { return static_cast<int64_t>(events_.size()); }
  Status hold(double seconds) override {
    return launch_device_wait(static_cast<uint64_t>(std::max(0.0, seconds) * 1e9), stream_);
  }
  Status mark(int64_t slot) override {
    if (slot < 0 || slot >= capacity()) return invalid_argument("timer slot out of range");
    // Inside stream capture a plain record only marks a dependency; "external" makes it an event node
    // that records when the graph runs.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MX_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream_, &capture));
    const unsigned flags = capture == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : 0u;
    MX_CUDA_RETURN_IF_ERROR(cudaEventRecordWithFlags(events_[static_cast<size_t>(slot)].get(), stream_, flags));
    return Status::ok();
  }
  Result<std::vector<double>> read(int64_t count) override {
    if (count < 1 || count > capacity()) return invalid_argument("timer read count out of range");
    MX_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events_[static_cast<size_t>(count - 1)].get()));
    std::vector<double> ms(static_cast<size_t>(count), 0.0);
    for (int64_t i = 1; i < count; ++i) {
      float v = 0;
      MX_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&v, events_[0].get(), events_[static_cast<size_t>(i)].get()));
      ms[static_cast<size_t>(i)] = v;
    }
    return ms;
  }

 private:
  explicit CudaDeviceTimer(cudaStream_t stream) : stream_(stream) {}
  cudaStream_t stream_;
  std::vector<CudaEvent> events_;
};

// Private scratch, grown only outside graph capture.
struct Scratch {
  Buffer moe_h, moe_y, moe_meta, moe_tickets, moe_fused_counters, tickets, partials, sampling, linear_partials, linear_tickets;
  Buffer share_ids, share_weights;  // expert parallel: the slots' local expert ids and weights
  Buffer gemma_router_tickets;
  Buffer dense_fp8;                  // FP8 dense weights widened to bf16 for M > 16 (linear_fp8)
  Buffer q_rope;                     // attention's Q rotated for kernels without RoPE in their Q load
  int64_t max_slots = 0, max_tiles = 0, experts = 0;
};

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> create(int device, const CudaBackendOptions& options) {
    int count = 0;
    MX_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
    if (device < 0 || device >= count)
      return invalid_argument("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
                              " visible; tensor parallel takes one device per rank)");
    MX_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    auto b = std::unique_ptr<CudaBackend>(new CudaBackend());
    b->options_ = options;
    b->device_ = device;
    MX_ASSIGN_OR_RETURN(b->dev_, query_device_info(device));
    cudaStream_t s = nullptr;
    MX_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    b->stream_ = CudaStream(s);
    MX_ASSIGN_OR_RETURN(LtLinear lt, LtLinear::create(kLtWorkspaceBytes));
    b->lt_ = std::make_unique<LtLinear>(std::move(lt));
    MX_LOG(Info) << "CUDA backend on " << b->dev_.name << " (sm_" << b->dev_.sm_major << b->dev_.sm_minor << ", "
                 << b->dev_.sm_count << " SMs, " << b->dev_.max_smem_per_block_optin << " B smem/block)";
    return std::unique_ptr<Backend>(std::move(b));
  }

  CudaBackendOptions& options() { return options_; }
  CudaPlacement placement() const { return {device_, stream_.get()}; }

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return DType::kBF16; }
  DType residual_dtype() const override { return DType::kF32; }
  DType kv_dtype() const override { return DType::kBF16; }

  Result<Buffer> allocate(int64_t bytes) override {
    if (capturing_) return internal_error("allocate during graph capture");
    if (bytes < 0) return invalid_argument("negative allocation");
    // On this backend's device whichever device the calling thread is bound to (tensor-parallel ranks'
    // KV caches are allocated from the engine's thread).
    int current = 0;
    MX_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
    if (current != device_) MX_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 256)));
    if (current != device_) MX_CUDA_RETURN_IF_ERROR(cudaSetDevice(current));
    if (err != cudaSuccess) {
      cudaGetLastError();
      return resource_exhausted("cannot allocate " + std::to_string(bytes) + " bytes of GPU memory: " +
                                cudaGetErrorString(err));
    }
    count_allocation(p, device_, std::max<int64_t>(bytes, 256));
    return Buffer(p, bytes, Device::kCuda, free_device);
  }
  Status copy_from_host(TensorView dst, const void* src) override {
    if (capturing_) return internal_error("host copy during graph capture");
    MX_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data(), src, static_cast<size_t>(dst.bytes()), cudaMemcpyHostToDevice,
                                            stream_.get()));
    MX_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
    return Status::ok();
  }
  Status copy_row_prefixes_from_host(TensorView dst, const void* src, int64_t prefix_bytes) override {
    if (capturing_) return internal_error("host copy during graph capture");
    const int64_t rows = dst.dim(0), row_bytes = rows > 0 ? dst.bytes() / rows : 0;
    if (prefix_bytes < 0 || prefix_bytes > row_bytes) return invalid_argument("row prefix longer than the row");
    if (prefix_bytes == 0 || rows == 0) return Status::ok();
    const auto pitch = static_cast<size_t>(row_bytes);
    MX_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst.data(), pitch, src, pitch, static_cast<size_t>(prefix_bytes),
                                              static_cast<size_t>(rows), cudaMemcpyHostToDevice, stream_.get()));
    MX_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
    return Status::ok();
  }
  Status copy_to_host(void* dst, const TensorView& src) override {
    if (capturing_) return internal_error("host copy during graph capture");
    MX_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src.data(), static_cast<size_t>(src.bytes()), cudaMemcpyDeviceToHost,
                                            stream_.get()));
    MX_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
    return Status::ok();
  }
  Status synchronize() override {
    MX_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
    if (side_stream_) MX_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(side_stream_.get()));
    return Status::ok();
  }

  // The side group on a second stream (Backend::begin_side): forked after the ops issued so far on the main
  // stream; its ops launch on the side stream (with programmatic dependent launch there as everywhere) until
  // end_side(), and join_side() makes the main stream wait for its last op. Both events are reused: a record
  // and the wait on it are issued together (captured as graph edges, or taken at the call eagerly).
  Result<bool> begin_side(int64_t tokens) override {
    if (side_open_ || side_pending_) return internal_error("begin_side: the previous side group is not joined");
    if (tokens <= 0 || tokens > options_.side_stream.max_tokens) return false;
    if (!side_stream_) {
      if (capturing_) return internal_error("begin_side: the side stream is made outside graph capture first");
      MX_RETURN_IF_ERROR(make_side_stream());
    }
    MX_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_event_.get(), stream_.get()));
    MX_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_stream_.get(), fork_event_.get(), 0));
    side_open_ = true;
    return true;
  }
  Status end_side() override {
    if (!side_open_) return Status::ok();
    MX_CUDA_RETURN_IF_ERROR(cudaEventRecord(join_event_.get(), side_stream_.get()));
    side_open_ = false;
    side_pending_ = true;
    return Status::ok();
  }
  Status join_side() override {
    if (side_open_) return internal_error("join_side before end_side");
    if (!side_pending_) return Status::ok();
    MX_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_.get(), join_event_.get(), 0));
    side_pending_ = false;
    return Status::ok();
  }
  Status copy(TensorView dst, const TensorView& src) override {
    if (dst.bytes() != src.bytes()) return invalid_argument("copy: sizes differ");
    MX_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(src.bytes()),
                                            cudaMemcpyDeviceToDevice, stream_.get()));
    return Status::ok();
  }

  std::string device_name() const override { return dev_.name; }
  Result<DeviceMemory> memory_info() override {
    size_t free = 0, total = 0;
    MX_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
    return DeviceMemory{static_cast<int64_t>(free), static_cast<int64_t>(total)};
  }
  int64_t allocated_bytes() const override {
    DeviceAllocations& a = device_allocations();
    std::lock_guard<std::mutex> lock(a.mutex);
    const auto it = a.total.find(device_);
    return it == a.total.end() ? 0 : it->second;
  }
  Result<std::unique_ptr<DeviceTimer>> make_timer(int64_t slots) override {
    if (capturing_) return internal_error("make_timer during graph capture");
    return CudaDeviceTimer::create(slots, stream_.get());
  }
  bool can_capture() const override { return true; }
  Status make_current() override {
    MX_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return Status::ok();
  }

  Result<TensorView> upload_weight(const TensorView& host, std::vector<Buffer>* owner) override {
    if (host.device() != Device::kCpu) return internal_error("upload_weight: source is not host memory");
    MX_ASSIGN_OR_RETURN(Buffer b, allocate(host.bytes()));
    TensorView view(b.data(), host.dtype(), host.shape(), Device::kCuda);
    MX_RETURN_IF_ERROR(copy_from_host(view, host.data()));
    if (host.dtype() == DType::kF8E4M3 && host.rank() == 2)  // prepare() sizes the slab linear_fp8 needs
      fp8_slab_bytes_ = std::max(fp8_slab_bytes_, fp8_slab_rows(host.dim(0), host.dim(1)) * host.dim(1) * 2);
    owner->push_back(std::move(b));
    return view;
  }

  Result<ExpertWeights> upload_experts(const ExpertWeights& host, std::vector<Buffer>* owner) override {
    if (host.layout != ExpertLayout::kMxfp4Checkpoint) return internal_error("upload_experts: checkpoint layout expected");
    const int64_t E = host.num_experts, H = host.hidden, I = host.intermediate;
    ExpertWeights out = host;
    out.layout = ExpertLayout::kMxfp4SwapAb;
    // Most of a big model's load (gpt-oss-120b: 57 GB of experts): each expert is checked and repacked on its own
    // core into pinned host memory (load_staging), then copied. load_seconds_ keeps the parts.
    auto repack = [&](const TensorView& blocks, const TensorView& scales, int64_t rows, int64_t k, bool pairs,
                      const char* what, TensorView* out_blocks, TensorView* out_scales) -> Status {
      using Clock = std::chrono::steady_clock;
      const auto start = Clock::now();
      const int64_t block_bytes = rows * k / 2, scale_bytes = rows * k / 32;
      MX_ASSIGN_OR_RETURN(uint8_t* const pb, load_staging(static_cast<size_t>(E * (block_bytes + scale_bytes))));
      uint8_t* const ps = pb + E * block_bytes;
      std::vector<Status> checked(static_cast<size_t>(E));
      const int64_t workers = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, E);
      std::vector<std::thread> threads;
      for (int64_t w = 0; w < workers; ++w)
        threads.emplace_back([&, w] {
          for (int64_t e = w; e < E; e += workers) {
            const uint8_t* expert_scales = scales.ptr<const uint8_t>() + e * scale_bytes;
            checked[static_cast<size_t>(e)] = check_swap_ab(rows, k, expert_scales);
            if (!checked[static_cast<size_t>(e)].is_ok()) continue;
            repack_mxfp4_swap_ab(blocks.ptr<const uint8_t>() + e * block_bytes, expert_scales, rows, k, pairs,
                                 pb + e * block_bytes, ps + e * scale_bytes);
          }
        });
      for (auto& t : threads) t.join();
      for (const Status& st : checked) MX_RETURN_IF_ERROR(st.with_context(what));
      const auto repacked = Clock::now();
      MX_ASSIGN_OR_RETURN(*out_blocks, upload_weight(TensorView(pb, DType::kU8, {E, rows / 16, k / 64, 32, 16}), owner));
      MX_ASSIGN_OR_RETURN(*out_scales, upload_weight(TensorView(ps, DType::kU8, {E, rows / 16, k / 64, 2, 16}), owner));
      load_seconds_.repack += std::chrono::duration<double>(repacked - start).count();
      load_seconds_.copies += std::chrono::duration<double>(Clock::now() - repacked).count();
      return Status::ok();
    };
    MX_RETURN_IF_ERROR(repack(host.w1_blocks, host.w1_scales, 2 * I, H, true, "gate_up_proj", &out.w1_blocks, &out.w1_scales));
    MX_RETURN_IF_ERROR(repack(host.w2_blocks, host.w2_scales, H, I, false, "down_proj", &out.w2_blocks, &out.w2_scales));
    MX_ASSIGN_OR_RETURN(out.w1_bias, upload_weight(host.w1_bias, owner));
    MX_ASSIGN_OR_RETURN(out.w2_bias, upload_weight(host.w2_bias, owner));
    return out;
  }

  Result<uint8_t*> load_staging(size_t bytes) {
    if (bytes > staging_bytes_) {
      pinned_staging_.reset();
      pageable_staging_.reset();
      void* p = nullptr;
      if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) == cudaSuccess) {
        pinned_staging_.reset(p);
      } else {
        (void)cudaGetLastError();  // not sticky: fall back to pageable memory
        pageable_staging_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);
      }
      staging_bytes_ = bytes;
    }
    return pinned_staging_ ? static_cast<uint8_t*>(pinned_staging_.get()) : pageable_staging_.get();
  }

  Status embedding(const TensorView& table, const TensorView& token_ids, TensorView out) override {
    expect(table, DType::kBF16, "embedding table");
    MX_CHECK(out.dtype() == DType::kF32 || out.dtype() == DType::kBF16) << dtype_name(out.dtype());
    return launch_embedding({ptr<const uint16_t>(table), ptr<const int32_t>(token_ids), out.data(), token_ids.numel(),
                             table.dim(1), table.dim(0), out.dtype() == DType::kF32},
                            stream());
  }

  Status rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView out) override {
    MX_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16) << dtype_name(x.dtype());
    expect(out, DType::kBF16, "rms_norm out");
    const int64_t h = x.dim(-1);
    RmsNormParams p;
    p.x = x.data();
    p.residual_f32 = x.dtype() == DType::kF32;
    p.weight = ptr<const uint16_t>(weight);
    p.out = ptr<uint16_t>(out);
    p.rows = x.numel() / h;
    p.hidden = h;
    p.eps = eps;
    p.weight_before_wait = options_.moe.norm_inputs_before_wait;
    return launch_rms_norm(p, stream());
  }

  Status add_rms_norm(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                      TensorView out) override {
    return launch_rms_norm(add_rms_norm_params(residual, delta, weight, eps, out), stream());
  }

  RmsNormParams add_rms_norm_params(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                                    TensorView out) {
    MX_CHECK(residual.dtype() == DType::kF32 || residual.dtype() == DType::kBF16) << dtype_name(residual.dtype());
    expect(delta, DType::kBF16, "delta");
    expect(out, DType::kBF16, "add_rms_norm out");
    const int64_t h = residual.dim(-1);
    RmsNormParams p;
    p.residual = residual.data();
    p.residual_f32 = residual.dtype() == DType::kF32;
    p.delta = ptr<const uint16_t>(delta);
    p.weight = ptr<const uint16_t>(weight);
    p.out = ptr<uint16_t>(out);
    p.rows = residual.numel() / h;
    p.hidden = h;
    p.eps = eps;
    p.weight_before_wait = options_.moe.norm_inputs_before_wait;
    return p;
  }

  // One launch where the router's fused form takes the tokens in CTA clusters (router.cu); else the two ops.
  Status add_rms_norm_route(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                            TensorView out, const RouterParams& route) override {
    const bool gpt_oss_router = route.x_scale.empty() && route.expert_scale.empty() && route.x_norm_eps <= 0.0f &&
                                !route.bias.empty() && route.x.data() == out.data();
    if (gpt_oss_router) {
      const RmsNormParams norm = add_rms_norm_params(residual, delta, weight, eps, out);
      RouterKernelParams r = gpt_oss_router_params(route);
      if (options_.moe.norm_route_tickets && r.tokens <= kFusedRouterMaxTokens) {  // where a cluster does not take it
        MX_RETURN_IF_ERROR(ensure(scratch_.tickets, kFusedRouterMaxTokens * 4, "router tickets", /*zero=*/true));
        r.tickets = ptr_of<uint32_t>(scratch_.tickets);
      }
      MX_ASSIGN_OR_RETURN(const bool fusable, can_fuse_add_rms_norm_route(norm, r));
      if (fusable && r.tokens <= kFusedRouterMaxTokens) return launch_add_rms_norm_route(norm, r, stream());
    }
    MX_RETURN_IF_ERROR(add_rms_norm(residual, delta, weight, eps, out));
    return router_topk(route);
  }

  Status linear(const TensorView& x, const TensorView& weight, const TensorView& bias, TensorView out) override {
    expect(x, DType::kBF16, "linear x");
    expect(weight, DType::kBF16, "linear weight");
    const int64_t n = weight.dim(0), k = weight.dim(1), m = x.numel() / k;
    MX_CHECK_EQ(out.numel(), m * n);
    const bool out_f32 = out.dtype() == DType::kF32;
    MX_CHECK(out_f32 || out.dtype() == DType::kBF16) << dtype_name(out.dtype());
    if (m == 0) return Status::ok();
    const bool aligned = reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(weight.data()) % 16 == 0;
    const CudaSkinnyLinearOptions& so = options_.skinny_linear;
    const int max_rows = so.max_rows;  // > 0: forced, whatever the waves
    if (aligned && use_skinny_linear(m, k, max_rows) &&
        (max_rows > 0 || skinny_linear_by_default(dev_, n) || (so.staged_waves > 1 && staged_ctas(m, n, k, /*fp8=*/false) > 0))) {
      SkinnyLinearParams s;
      s.w = ptr<const uint16_t>(weight);
      return run_skinny_linear(s, x, bias, out, n, k);
    }
    // cuBLASLt's bias epilogue takes a bias of the output type; an f32 output gets its bf16 bias separately.
    const bool fused_bias = !bias.empty() && !out_f32;
    MX_RETURN_IF_ERROR(lt_->run(x.data(), weight.data(), fused_bias ? bias.data() : nullptr, out.data(), m, n, k,
                                out_f32, stream()));
    if (!bias.empty() && out_f32)
      return launch_add_bias_f32({ptr<float>(out), ptr<const uint16_t>(bias), m, n}, stream());
    return Status::ok();
  }

  // FP8 dense weights: the skinny kernel reads them as they are for a few rows; more rows widen them to bf16
  // (scale applied) in slabs of at most kFp8SlabBytes and run each slab on cuBLASLt.
  Status linear_fp8(const TensorView& x, const TensorView& weight, const TensorView& scale, const TensorView& bias,
                    TensorView out) override {
    expect(x, DType::kBF16, "linear_fp8 x");
    expect(weight, DType::kF8E4M3, "linear_fp8 weight");
    expect(scale, DType::kF32, "linear_fp8 scale");
    const int64_t n = weight.dim(0), k = weight.dim(1), m = x.numel() / k;
    MX_CHECK_EQ(scale.numel(), n);
    MX_CHECK_EQ(out.numel(), m * n);
    const bool out_f32 = out.dtype() == DType::kF32;
    MX_CHECK(out_f32 || out.dtype() == DType::kBF16) << dtype_name(out.dtype());
    if (m == 0) return Status::ok();
    if (k % 8 != 0) return unimplemented("FP8 dense linear: k must be a multiple of 8");
    const CudaSkinnyLinearOptions& so = options_.skinny_linear;
    if (reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && use_skinny_linear(m, k, so.max_rows)) {
      SkinnyLinearParams s;
      s.w_fp8 = ptr<const uint8_t>(weight);
      s.w_scale = ptr<const float>(scale);
      return run_skinny_linear(s, x, bias, out, n, k);
    }
    const int64_t slab_rows = fp8_slab_rows(n, k);
    MX_RETURN_IF_ERROR(ensure(scratch_.dense_fp8, slab_rows * k * 2, "FP8 dense slab"));
    const bool fused_bias = !bias.empty() && !out_f32;
    const int64_t out_bytes = out_f32 ? 4 : 2;
    for (int64_t r0 = 0; r0 < n; r0 += slab_rows) {
      const int64_t rows = std::min(slab_rows, n - r0);
      auto* slab = ptr_of<uint16_t>(scratch_.dense_fp8);
      MX_RETURN_IF_ERROR(launch_dequant_fp8_rows(ptr<const uint8_t>(weight) + r0 * k, ptr<const float>(scale) + r0,
                                                 slab, rows, k, stream()));
      const void* slab_bias = fused_bias ? static_cast<const void*>(ptr<const uint16_t>(bias) + r0) : nullptr;
      MX_RETURN_IF_ERROR(lt_->run(x.data(), slab, slab_bias, static_cast<char*>(out.data()) + r0 * out_bytes, m, rows, k,
                                  out_f32, stream(), n));
    }
    if (!bias.empty() && out_f32)
      return launch_add_bias_f32({ptr<float>(out), ptr<const uint16_t>(bias), m, n}, stream());
    return Status::ok();
  }

  // Rows of one bf16 slab of an FP8 weight [n, k]: all of them when they fit kFp8SlabBytes, else a multiple of 16.
  static int64_t fp8_slab_rows(int64_t n, int64_t k) {
    const int64_t fit = std::max<int64_t>(16, kFp8SlabBytes / (2 * k) / 16 * 16);
    return std::min(n, fit);
  }

  static PagedKv paged(const KvLayerView& kv, const BatchView& batch) {
    PagedKv p;
    p.k = ptr<uint16_t>(kv.k);
    p.v = ptr<uint16_t>(kv.v);
    p.positions = ptr<const int32_t>(batch.positions);
    p.token_seq = ptr<const int32_t>(batch.token_seq);
    const TensorView& table = batch.page_table(kv.group);
    p.page_table = ptr<const int32_t>(table);
    p.page_size = kv.page_size;
    p.max_pages = table.dim(1);
    p.num_pages = kv.k.dim(0);
    return p;
  }

  Status qkv_rope(const QkvRopeParams& p, const BatchView& batch) override {
    expect(p.qkv, DType::kBF16, "qkv");
    expect(p.kv.k, DType::kBF16, "k cache");
    if (p.norm_eps > 0) {
      expect(p.q_norm, DType::kBF16, "q_norm");
      expect(p.k_norm, DType::kBF16, "k_norm");
      if (p.q_norm.numel() != p.head_dim || p.k_norm.numel() != p.head_dim)
        return invalid_argument("qkv_rope: q_norm and k_norm need head_dim values");
      GemmaQkvNormRopeParams g;
      g.qkv = ptr<const uint16_t>(p.qkv);
      g.q_out = ptr<uint16_t>(p.q_out);
      g.inv_freq = ptr<const float>(p.inv_freq);
      g.q_norm = ptr<const uint16_t>(p.q_norm);
      g.k_norm = ptr<const uint16_t>(p.k_norm);
      g.kv = paged(p.kv, batch);
      g.tokens = batch.num_tokens, g.n_q = p.n_q, g.n_kv = p.n_kv, g.head_dim = p.head_dim;
      g.rope_scale = p.rope_scale, g.eps = p.norm_eps;
      g.prefetch_bytes = l2_prefetch_bytes(p.prefetch, batch);
      if (g.prefetch_bytes > 0) g.prefetch = p.prefetch.data();
      return launch_gemma_qkv_norm_rope(g, stream());
    }
    RopeParams r;
    r.qkv = ptr<const uint16_t>(p.qkv);
    r.q_out = p.q_out.empty() ? nullptr : ptr<uint16_t>(p.q_out);  // null: K and V alone
    if (r.q_out == nullptr && !options_.rope.q_in_attention) {  // the comparison form: Q written to scratch
      MX_RETURN_IF_ERROR(ensure(scratch_.q_rope, batch.num_tokens * p.n_q * p.head_dim * 2, "attention Q"));
      r.q_out = ptr_of<uint16_t>(scratch_.q_rope);
      q_rope_source_ = r.qkv;
    }
    r.inv_freq = ptr<const float>(p.inv_freq);
    r.kv = paged(p.kv, batch);
    r.tokens = batch.num_tokens;
    r.n_q = p.n_q;
    r.n_kv = p.n_kv;
    r.head_dim = p.head_dim;
    r.rope_scale = p.rope_scale;
    const CudaRopeOptions& ro = options_.rope;
    if (batch.num_tokens >= ro.stream_min_tokens) return launch_qkv_rope_stream(r, ro.tokens_per_cta, ro.items, stream());
    return launch_qkv_rope(r, stream());
  }

  // Gemma-4's decode step (the q/k/v norms, one query per sequence, head dims 256 and 512, V apart from K) where
  // attention() takes the clustered swap-AB kernel: the kernel norms and rotates q and the new K/V itself
  // (AttentionKernelParams::norm_rope): no qkv_rope launch, and Q is not written and read back
  // (CudaAttentionOptions::norm_rope_in_attention). Elsewhere qkv_rope, then attention.
  Status qkv_rope_attention(const QkvRopeParams& r, const AttentionParams& p, const BatchView& batch) override {
    const bool fits = options_.attention.norm_rope_in_attention && r.norm_eps > 0 && p.q_inv_freq.empty() &&
                      batch.num_tokens == batch.num_seqs && (p.head_dim == 256 || p.head_dim == 512) &&
                      r.head_dim == p.head_dim && r.n_q == p.n_q && r.n_kv == p.n_kv && r.q_out.data() == p.q.data() &&
                      r.kv.k.data() == p.kv.k.data() && r.kv.v.data() == p.kv.v.data() &&
                      p.kv.k.data() != p.kv.v.data() && r.qkv.dtype() == DType::kBF16 &&
                      p.kv.k.dtype() == DType::kBF16 && r.q_norm.numel() == r.head_dim &&
                      r.k_norm.numel() == r.head_dim && r.q_norm.dtype() == DType::kBF16 &&
                      r.k_norm.dtype() == DType::kBF16 && p.out.dtype() == DType::kBF16;
    if (!fits) return Backend::qkv_rope_attention(r, p, batch);
    AttentionKernelParams a = attention_kernel_params(p, batch);
    MX_ASSIGN_OR_RETURN(const auto cluster, decode_cluster_choice(p, a, batch));
    if (!cluster.second) return Backend::qkv_rope_attention(r, p, batch);
    a.q = nullptr;  // not read: the kernel norms and rotates Q from the projection
    a.keys_before_wait = true;
    AttentionNormRope& nr = a.norm_rope;
    nr.qkv = ptr<const uint16_t>(r.qkv);
    nr.inv_freq = ptr<const float>(r.inv_freq);
    nr.q_norm = ptr<const uint16_t>(r.q_norm);
    nr.k_norm = ptr<const uint16_t>(r.k_norm);
    nr.rope_scale = r.rope_scale, nr.eps = r.norm_eps;
    nr.prefetch_bytes = l2_prefetch_bytes(r.prefetch, batch);
    if (nr.prefetch_bytes > 0) nr.prefetch = r.prefetch.data();
    return launch_attention_decode_swap_cluster(a, cluster.first, stream());
  }

  // At <= kSkinnyLinearMaxRows tokens (gpt-oss's decode: no q/k norms) the skinny kernel rotates q and k and
  // writes q and the cache in its epilogue (skinny_linear.cu, SkinnyRope); rope.qkv is not written. Head dims
  // that are multiples of 8 only: there qkv_rope runs its 4-wide form, whose rounding the epilogue repeats.
  Status linear_qkv_rope(const TensorView& x, const TensorView& weight, const TensorView& scale, const TensorView& bias,
                         const QkvRopeParams& rope, const BatchView& batch) override {
    const CudaSkinnyLinearOptions& so = options_.skinny_linear;
    const int64_t k = weight.dim(1), m = x.numel() / k;
    const bool fp8 = !scale.empty();
    const bool fits = (so.rope_epilogue >= 0 && (fp8 || so.rope_epilogue != 2)) && rope.norm_eps <= 0 &&
                      !rope.q_out.empty() &&  // no Q out: the attention rotates Q from qkv, which this skips
                      use_skinny_linear(m, k, so.max_rows) &&
                      m == batch.num_tokens && rope.head_dim % 8 == 0 &&
                      weight.dim(0) == (rope.n_q + 2 * rope.n_kv) * rope.head_dim &&
                      x.dtype() == DType::kBF16 && weight.dtype() == (fp8 ? DType::kF8E4M3 : DType::kBF16) &&
                      rope.kv.k.dtype() == DType::kBF16 && reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(weight.data()) % 16 == 0;
    if (!fits) return Backend::linear_qkv_rope(x, weight, scale, bias, rope, batch);
    SkinnyLinearParams s;
    if (fp8) {
      s.w_fp8 = ptr<const uint8_t>(weight);
      s.w_scale = ptr<const float>(scale);
    } else {
      s.w = ptr<const uint16_t>(weight);
    }
    s.x = ptr<const uint16_t>(x);
    s.bias = bias.empty() ? nullptr : ptr<const uint16_t>(bias);
    s.m = m, s.n = weight.dim(0), s.k = k;
    s.rope.q_out = ptr<uint16_t>(rope.q_out);
    s.rope.inv_freq = ptr<const float>(rope.inv_freq);
    s.rope.kv = paged(rope.kv, batch);
    s.rope.n_q = rope.n_q, s.rope.n_kv = rope.n_kv, s.rope.head_dim = rope.head_dim;
    s.rope.scale = rope.rope_scale;
    s.inputs_first = so.inputs_first;
    const int rows = so.rope_strip_rows > 0 ? so.rope_strip_rows : skinny_rope_strip_rows(dev_, s.n);
    SkinnyLinearConfig c = choose_skinny_linear_config(dev_, m, s.n, k, /*k_splits=*/1, 0, rows);
    c.staged = fp8 && so.fp8_qkv_staged && dev_.sm_major == 9;
    return launch_skinny_linear(s, c, stream());
  }

  // The attention kernels' parameters of `p` (Q as p.q has it).
  AttentionKernelParams attention_kernel_params(const AttentionParams& p, const BatchView& batch) const {
    AttentionKernelParams a;
    a.q = ptr<const uint16_t>(p.q);
    a.sinks = ptr<const uint16_t>(p.sinks);
    a.out = ptr<uint16_t>(p.out);
    a.kv = paged(p.kv, batch);
    a.tokens = batch.num_tokens;
    a.n_q = p.n_q;
    a.n_kv = p.n_kv;
    a.head_dim = p.head_dim;
    a.window = p.window;
    a.scale_log2 = p.softmax_scale * 1.4426950408889634f;
    return a;
  }

  // The clustered swap-AB decode attention's config for a decode call of `p` (a its kernel parameters), and whether
  // attention() takes it under the options' decode choice (kSwapAbCluster where it is not enabled: an error).
  Result<std::pair<AttentionDecodeSwapConfig, bool>> decode_cluster_choice(const AttentionParams& p,
                                                                           const AttentionKernelParams& a,
                                                                           const BatchView& batch) const {
    const int64_t capacity = a.kv.max_pages * a.kv.page_size;
    const int64_t max_keys = p.window > 0 ? std::min(p.window, capacity) : capacity;
    const int64_t group = p.n_q / p.n_kv;
    const CudaAttentionDecode decode = options_.attention.decode;
    const AttentionDecodeSwapConfig c = choose_attention_decode_swap_config(dev_, p.head_dim, group, a.kv.k == a.kv.v,
                                                                          batch.num_tokens, p.n_kv, max_keys);
    // The clustered form (a token's splits merged in distributed shared memory): forced, or kAuto's where
    // attention_decode_swap_cluster_by_default has it measured faster.
    AttentionDecodeSwapConfig cc = attention_decode_swap_cluster_config(dev_, c, p.head_dim, a.kv.k == a.kv.v);
    if (batch.num_tokens == 1)  // short splits: a shallower ring, room for the next linear's staged CTAs
      cc = attention_decode_swap_one_token_ring(cc, p.head_dim, a.kv.k == a.kv.v, max_keys,
                                                options_.attention.cluster_stages_one_token);
    if (decode == CudaAttentionDecode::kSwapAbCluster && !cc.enabled)
      return unimplemented("attention decode (swap AB, clusters): head dim 256 or 512, up to 8 q heads per kv head, "
                           "sm_90+");
    const bool takes = decode == CudaAttentionDecode::kSwapAbCluster ||
                       (decode == CudaAttentionDecode::kAuto &&
                        attention_decode_swap_cluster_by_default(dev_, cc, p.head_dim, a.kv.k == a.kv.v,
                                                                 batch.num_tokens, p.n_kv));
    return std::make_pair(cc, takes);
  }

  // Bytes of `prefetch` the Gemma-4 qkv_rope forms pull into the L2 at this batch (CudaL2PrefetchOptions), or 0.
  int64_t l2_prefetch_bytes(const TensorView& prefetch, const BatchView& batch) const {
    const CudaL2PrefetchOptions& pf = options_.l2_prefetch;
    if (prefetch.empty() || batch.num_tokens > pf.max_tokens || dev_.sm_major < 9) return 0;
    return std::min(prefetch.bytes(), pf.max_bytes) / 16 * 16;
  }

  Status attention(const AttentionParams& p, const BatchView& batch) override {
    expect(p.q, DType::kBF16, "attention q");
    expect(p.kv.k, DType::kBF16, "k cache");
    AttentionKernelParams a = attention_kernel_params(p, batch);
    if (!p.q_inv_freq.empty()) {  // q is the q|k|v projection: RoPE in the Q load, or by plain_q
      if (p.q.numel() != batch.num_tokens * (p.n_q + 2 * p.n_kv) * p.head_dim)
        return invalid_argument("attention: with q_inv_freq, q must be the q|k|v projection");
      if (!options_.rope.q_in_attention) {  // the comparison form: qkv_rope wrote the rotated Q to scratch
        if (q_rope_source_ != a.q) return internal_error("attention: no qkv_rope wrote this Q (CudaRopeOptions)");
        a.q = ptr_of<const uint16_t>(scratch_.q_rope);
      } else {
        a.q_stride = (p.n_q + 2 * p.n_kv) * p.head_dim;
        a.q_inv_freq = ptr<const float>(p.q_inv_freq);
        a.q_rope_scale = p.q_rope_scale;
      }
    }
    // One query per sequence (decode), or a few (verify rows of <= 7 drafts) unless a prefill kernel is
    // forced: the split-KV decode kernel, one CTA group per token, which keeps every SM busy at small
    // batches and long contexts where the prefill kernels' CTAs (a tile of tokens each, all keys) are few.
    // Otherwise FlashAttention prefill: the warp-specialized wgmma kernel on sm_90 (head dim 64), else mma.sync.
    constexpr int64_t kDecodeAttentionMaxRows = 8;
    const bool few_rows = batch.num_tokens == batch.num_seqs ||
                          (options_.attention.prefill == CudaAttentionPath::kAuto && batch.max_seq_tokens > 0 &&
                           batch.max_seq_tokens <= kDecodeAttentionMaxRows);
    if (few_rows) {
      MX_RETURN_IF_ERROR(plain_q(a, p, batch));
      // One query per sequence: the keys before it are earlier steps' (only qkv_rope, the kernel before, writes
      // this step's).
      a.keys_before_wait = options_.attention.keys_before_wait && batch.num_tokens == batch.num_seqs;
      const int64_t capacity = a.kv.max_pages * a.kv.page_size;
      const int64_t max_keys = p.window > 0 ? std::min(p.window, capacity) : capacity;
      const int64_t group = p.n_q / p.n_kv, head_blocks = (group + 15) / 16;
      const CudaAttentionDecode decode = options_.attention.decode;
      const AttentionDecodeSwapConfig c = choose_attention_decode_swap_config(
          dev_, p.head_dim, group, a.kv.k == a.kv.v, batch.num_tokens, p.n_kv, max_keys);
      MX_ASSIGN_OR_RETURN(const auto cluster, decode_cluster_choice(p, a, batch));
      if (cluster.second) return launch_attention_decode_swap_cluster(a, cluster.first, stream());
      if (decode == CudaAttentionDecode::kSwapAb && !c.enabled)
        return unimplemented("attention decode (swap AB): head dim 64, 256 or 512, up to 8 q heads per kv head");
      if (decode == CudaAttentionDecode::kSwapAb ||
          (decode == CudaAttentionDecode::kAuto && c.enabled && attention_decode_swap_by_default(dev_, c, batch.num_tokens))) {
        if (c.num_splits > 1) {
          const int64_t need = batch.num_tokens * p.n_q * c.num_splits * (p.head_dim + 2) * 4;
          MX_RETURN_IF_ERROR(ensure(scratch_.partials, need, "attention partials"));
          a.partials = ptr_of<float>(scratch_.partials);
        }
        return launch_attention_decode_swap(a, c, stream());
      }
      AttentionDecodeConfig dc =
          choose_attention_decode_config(dev_, p.head_dim, batch.num_tokens, p.n_kv, head_blocks, max_keys);
      if (decode == CudaAttentionDecode::kMmaSyncMerge) dc.clusters = false;
      if (!fits(dev_, dc.smem_bytes, dc.stages)) return internal_error("attention decode config does not fit");
      if (dc.num_splits > 1) {
        const int64_t need = batch.num_tokens * p.n_q * dc.num_splits * (p.head_dim + 2) * 4;
        MX_RETURN_IF_ERROR(ensure(scratch_.partials, need, "attention partials"));
        a.partials = ptr_of<float>(scratch_.partials);
      }
      return launch_attention_decode(a, dc, stream());
    }
    CudaAttentionPath path = options_.attention.prefill;
    if (path == CudaAttentionPath::kWgmmaWide || (path == CudaAttentionPath::kAuto && p.head_dim >= 256)) {
      const AttentionWideWgmmaConfig cw = choose_attention_wide_wgmma_config(dev_, p.head_dim, a.kv.k == a.kv.v);
      if (cw.enabled && p.n_q / p.n_kv <= cw.rows_per_cta) {
        MX_RETURN_IF_ERROR(plain_q(a, p, batch));
        return launch_attention_prefill_wgmma_wide(a, cw, stream());
      }
      if (path == CudaAttentionPath::kWgmmaWide)
        return unimplemented("attention: the wide-head wgmma prefill kernel needs sm_90, head_dim 256 or 512 and at most " +
                             std::to_string(cw.rows_per_cta) + " q heads per kv head");
    }
    if (path == CudaAttentionPath::kWgmmaWindow || path == CudaAttentionPath::kAuto) {
      // The window kernel where it takes the layer (gpt-oss's sliding layers: 1.40x the ws kernel's 64-key
      // shape at 8K on an H200, session 12); other layers as kAuto.
      const AttentionWindowWgmmaConfig cw = choose_attention_window_wgmma_config(dev_, p.head_dim);
      if (cw.enabled && p.n_q / p.n_kv <= 128 && attention_window_wgmma_takes(p.window, p.n_q / p.n_kv))
        return launch_attention_prefill_wgmma_window(a, cw, stream());
      if (path == CudaAttentionPath::kWgmmaWindow && !cw.enabled)
        return unimplemented("attention: the wgmma window prefill kernel needs sm_90 and head_dim 64");
      path = CudaAttentionPath::kAuto;
    }
    if (path == CudaAttentionPath::kWgmmaWs || path == CudaAttentionPath::kWgmmaWs64 || path == CudaAttentionPath::kAuto) {
      // kAuto (layers the window kernel does not take): the 64-key-tile shape for windows of up to 128 keys
      // (1.38x faster than the 128-key one at 8K on an H100), the 128-key one for full layers (1.13x there).
      const bool narrow = path == CudaAttentionPath::kWgmmaWs64 ||
                          (path == CudaAttentionPath::kAuto && p.window > 0 && p.window <= 128);
      const AttnWsShape& shape = narrow ? kAttnWsNarrow : kAttnWsWide;
      const AttentionPrefillWgmmaConfig cw = choose_attention_prefill_wgmma_ws_config(dev_, p.head_dim, shape);
      if (cw.enabled && p.n_q / p.n_kv <= cw.rows_per_cta) {
        if (narrow) MX_RETURN_IF_ERROR(plain_q(a, p, batch));  // the wide shape (persistent) rotates Q itself
        return launch_attention_prefill_wgmma_ws(a, cw, stream());
      }
      if (path != CudaAttentionPath::kAuto)
        return unimplemented("attention: the warp-specialized wgmma prefill kernel needs sm_90 and head_dim 64");
    }
    const AttentionPrefillConfig c = choose_attention_prefill_config(dev_, p.head_dim);
    if (!fits(dev_, c.smem_bytes, c.stages)) return internal_error("attention prefill config does not fit");
    MX_RETURN_IF_ERROR(plain_q(a, p, batch));
    return launch_attention_prefill(a, c, stream());
  }

  // For the kernels without RoPE in their Q load (all but the window kernel and the persistent wgmma one): with
  // AttentionParams::q_inv_freq, Q rotated into scratch first by the qkv_rope kernels with no K or V to write. The
  // scratch grows on first use, which is eager (the runner's step graphs are captured after an eager pass).
  // gpt-oss asks for RoPE in the attention for prefill only, which on sm_90a takes the rotating kernels.
  Status plain_q(AttentionKernelParams& a, const AttentionParams& p, const BatchView& batch) {
    if (a.q_inv_freq == nullptr) return Status::ok();
    MX_RETURN_IF_ERROR(ensure(scratch_.q_rope, batch.num_tokens * p.n_q * p.head_dim * 2, "attention Q"));
    RopeParams r;
    r.qkv = a.q;
    r.q_out = ptr_of<uint16_t>(scratch_.q_rope);
    r.inv_freq = a.q_inv_freq;
    r.kv = a.kv;
    r.kv.k = nullptr;  // Q alone
    r.tokens = batch.num_tokens, r.n_q = p.n_q, r.n_kv = p.n_kv, r.head_dim = p.head_dim;
    r.rope_scale = p.q_rope_scale;
    const CudaRopeOptions& ro = options_.rope;
    MX_RETURN_IF_ERROR(batch.num_tokens >= ro.stream_min_tokens
                           ? launch_qkv_rope_stream(r, ro.tokens_per_cta, ro.items, stream())
                           : launch_qkv_rope(r, stream()));
    a.q = r.q_out;
    a.q_stride = 0;
    a.q_inv_freq = nullptr;
    return Status::ok();
  }

  Status router_topk(const RouterParams& p) override {
    if (!p.x_scale.empty() || !p.expert_scale.empty() || p.x_norm_eps > 0.0f) return gemma_router(p);
    if (p.bias.empty()) return unimplemented("cuda router: gpt-oss's router takes a bias, Gemma-4's an x_scale");
    RouterKernelParams r = gpt_oss_router_params(p);
    if (r.tokens <= kFusedRouterMaxTokens) {
      MX_RETURN_IF_ERROR(ensure(scratch_.tickets, kFusedRouterMaxTokens * 4, "router tickets", /*zero=*/true));
      r.tickets = ptr_of<uint32_t>(scratch_.tickets);
      return launch_router_topk(r, stream());
    }
    MX_RETURN_IF_ERROR(
        lt_->run(p.x.data(), p.weight.data(), nullptr, p.logits.data(), r.tokens, r.experts, r.hidden, true, stream()));
    return launch_topk_softmax(r, stream());
  }

  // gpt-oss's router (a bias, no scales) as router.cu's parameters, tickets unset.
  RouterKernelParams gpt_oss_router_params(const RouterParams& p) {
    expect(p.x, DType::kBF16, "router x");
    expect(p.logits, DType::kF32, "router logits");
    const int64_t e = p.weight.dim(0), h = p.weight.dim(1);
    RouterKernelParams r;
    r.x = ptr<const uint16_t>(p.x);
    r.weight = ptr<const uint16_t>(p.weight);
    r.bias = ptr<const uint16_t>(p.bias);
    r.logits = ptr<float>(p.logits);
    r.topk_ids = ptr<int32_t>(p.topk_ids);
    r.topk_weights = ptr<float>(p.topk_weights);
    r.tokens = p.x.numel() / h;
    r.hidden = h;
    r.experts = e;
    r.top_k = p.top_k;
    r.bias_before_wait = options_.moe.norm_inputs_before_wait;
    return r;
  }

  // Gemma-4 (gemma_router.cu): weightless norm, logits, top-k, softmax and expert scales in one launch.
  Status gemma_router(const RouterParams& p) {
    MX_ASSIGN_OR_RETURN(GemmaRouterParams r, gemma_router_params(p));
    MX_RETURN_IF_ERROR(ensure(scratch_.gemma_router_tickets, gemma_router_tickets(r.tokens) * 4, "router tickets",
                              /*zero=*/true));
    r.tickets = ptr_of<uint32_t>(scratch_.gemma_router_tickets);
    return launch_gemma_router(r, stream());
  }

  // The router's kernel parameters and kernel choice (the options, the tokens, the device).
  Result<GemmaRouterParams> gemma_router_params(const RouterParams& p) {
    if (!p.bias.empty()) return unimplemented("cuda router: Gemma-4's router takes no bias");
    if (p.weight.dtype() != DType::kBF16 || p.x_scale.empty())
      return unimplemented("cuda router: Gemma-4's router takes the bf16 weight and an f32 x_scale");
    MX_CHECK(p.x.dtype() == DType::kF32 || p.x.dtype() == DType::kBF16) << dtype_name(p.x.dtype());
    expect(p.logits, DType::kF32, "router logits");
    expect(p.x_scale, DType::kF32, "router x_scale");
    if (p.x_scale.numel() != p.weight.dim(1)) return invalid_argument("cuda router: x_scale is not [hidden]");
    GemmaRouterParams r;
    r.x = p.x.data();
    r.x_f32 = p.x.dtype() == DType::kF32;
    r.weight = ptr<const uint16_t>(p.weight);
    r.x_scale = ptr<const float>(p.x_scale);
    if (!p.expert_scale.empty()) {
      MX_CHECK(p.expert_scale.dtype() == DType::kF32 || p.expert_scale.dtype() == DType::kBF16);
      r.expert_scale = p.expert_scale.data();
      r.scale_f32 = p.expert_scale.dtype() == DType::kF32;
    }
    r.logits = ptr<float>(p.logits);
    r.topk_ids = ptr<int32_t>(p.topk_ids);
    r.topk_weights = ptr<float>(p.topk_weights);
    r.experts = p.weight.dim(0);
    r.hidden = p.weight.dim(1);
    r.tokens = p.x.numel() / r.hidden;
    r.top_k = p.top_k;
    r.norm_eps = p.x_norm_eps;
    const CudaGemmaRouterDecode decode = options_.gemma_router.decode;
    const int forced_ctas = options_.gemma_router.cluster_ctas;
    if (forced_ctas != 0 && forced_ctas != 8 && forced_ctas != 16)
      return invalid_argument("cuda router: clusters of 8 or 16 CTAs, not " + std::to_string(forced_ctas));
    if (decode == CudaGemmaRouterDecode::kSplit ||
        (decode == CudaGemmaRouterDecode::kAuto && r.tokens > CudaGemmaRouterOptions::kClusterMaxTokens)) {
      if (router_split_ctas_ < 0) router_split_ctas_ = gemma_router_split_ctas();
      const int by_tokens =
          r.tokens <= CudaGemmaRouterOptions::kSplitLargeClusterMaxTokens ? router_split_ctas_ : std::min(router_split_ctas_, 8);
      r.split_ctas = forced_ctas > 0 && forced_ctas <= router_split_ctas_ ? forced_ctas : by_tokens;
      if (decode == CudaGemmaRouterDecode::kSplit &&
          (r.split_ctas == 0 || (forced_ctas > 0 && r.split_ctas != forced_ctas)))
        return unimplemented("cuda router: this device runs split clusters of at most " +
                             std::to_string(router_split_ctas_));
      if (r.split_ctas > 0 && !gemma_router_split_fits(r)) {
        if (decode == CudaGemmaRouterDecode::kSplit)
          return unimplemented("cuda router: the split kernel needs hidden % 8 == 0 and its tile in shared memory");
        r.split_ctas = 0;  // kAuto: the ticket kernel
      }
    }
    if (r.split_ctas == 0 && (decode == CudaGemmaRouterDecode::kAuto || decode == CudaGemmaRouterDecode::kCluster) &&
        r.tokens <= CudaGemmaRouterOptions::kClusterMaxTokens) {
      if (router_cluster_ctas_ < 0) router_cluster_ctas_ = gemma_router_cluster_ctas();
      int ctas = r.tokens <= CudaGemmaRouterOptions::kLargeClusterMaxTokens ? router_cluster_ctas_
                                                                            : std::min(router_cluster_ctas_, 8);
      // kAuto takes a forced size only where the device runs it; kCluster gets what it asks for or an error.
      if (forced_ctas > 0 && forced_ctas <= router_cluster_ctas_) ctas = forced_ctas;
      if (decode == CudaGemmaRouterDecode::kCluster && (ctas == 0 || (forced_ctas > 0 && ctas != forced_ctas)))
        return unimplemented("cuda router: this device runs CTA clusters of at most " +
                             std::to_string(router_cluster_ctas_));
      if (decode == CudaGemmaRouterDecode::kCluster || dev_.sm_major == 9)
        r.cluster_ctas = ctas;
    }
    if (r.cluster_ctas > 0) {
      const int bulk = options_.gemma_router.bulk_weights;
      r.bulk_weights = bulk >= 0 && gemma_router_bulk_weights_fit(r);
      if (bulk > 0 && !r.bulk_weights)
        return unimplemented("cuda router: a CTA's weight rows do not fit its shared memory");
    }
    return r;
  }

  Status unit_rms_norm(const TensorView& x, float eps, TensorView out) override {
    return rms_norm(x, TensorView(), eps, out);
  }
  Status soft_cap(TensorView x, float cap) override {
    expect(x, DType::kF32, "soft_cap x");
    return launch_soft_cap(ptr<float>(x), x.numel(), cap, stream());
  }
  Status gelu_tanh_mul(const TensorView& gate, const TensorView& up, TensorView out) override {
    expect(gate, DType::kBF16, "gelu_tanh_mul gate");
    expect(up, DType::kBF16, "gelu_tanh_mul up");
    expect(out, DType::kBF16, "gelu_tanh_mul out");
    MX_CHECK(gate.numel() == up.numel() && gate.numel() == out.numel());
    return launch_gelu_tanh_mul(ptr<const uint16_t>(gate), ptr<const uint16_t>(up), ptr<uint16_t>(out), out.numel(),
                                stream());
  }
  Status geglu(const TensorView& gate_up, TensorView out) override {
    expect(gate_up, DType::kBF16, "geglu gate_up");
    expect(out, DType::kBF16, "geglu out");
    if (gate_up.numel() != 2 * out.numel()) return invalid_argument("geglu: gate_up must hold twice out's values");
    const int64_t inter = out.dim(-1);
    return launch_geglu(ptr<const uint16_t>(gate_up), ptr<uint16_t>(out), out.numel() / inter, inter, stream());
  }
  Status silu_mul(const TensorView& gate, const TensorView& up, TensorView out) override {
    expect(gate, DType::kBF16, "silu_mul gate");
    expect(up, DType::kBF16, "silu_mul up");
    expect(out, DType::kBF16, "silu_mul out");
    MX_CHECK(gate.numel() == up.numel() && gate.numel() == out.numel());
    return launch_silu_mul(ptr<const uint16_t>(gate), ptr<const uint16_t>(up), ptr<uint16_t>(out), out.numel(),
                           stream());
  }
  Status convert(const TensorView& x, TensorView out) override {
    MX_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16) << dtype_name(x.dtype());
    MX_CHECK(out.dtype() == DType::kF32 || out.dtype() == DType::kBF16) << dtype_name(out.dtype());
    MX_CHECK_EQ(x.numel(), out.numel());
    return launch_convert(x.data(), x.dtype() == DType::kF32, out.data(), out.dtype() == DType::kF32, x.numel(),
                          stream());
  }
  Status scale_by(TensorView x, const TensorView& factor) override {
    MX_CHECK(x.dtype() == DType::kF32 || x.dtype() == DType::kBF16) << dtype_name(x.dtype());
    MX_CHECK(factor.dtype() == DType::kF32 || factor.dtype() == DType::kBF16) << dtype_name(factor.dtype());
    MX_CHECK_EQ(factor.numel(), 1);
    return launch_scale_by(x.data(), x.dtype() == DType::kF32, x.numel(), factor.data(),
                           factor.dtype() == DType::kF32, stream());
  }
  // CudaGemmaRowOptions as the row kernels' GemmaRowForm.
  GemmaRowForm gemma_row_form() const {
    const CudaGemmaRowForm f = options_.gemma_rows.form;
    return {f == CudaGemmaRowForm::kFourChunks ? 4 : f == CudaGemmaRowForm::kAuto ? 0 : 2,
            f == CudaGemmaRowForm::kTwoChunksBounded};
  }
  Status gemma_attention_end(const GemmaAttentionEndParams& p) override {
    expect(p.residual, DType::kF32, "gemma_attention_end residual");
    const int64_t h = p.residual.dim(-1), n = p.residual.numel();
    for (const TensorView* t : {&p.attn_out, &p.mlp_in}) expect(*t, DType::kBF16, "gemma_attention_end activation");
    for (const TensorView* t : {&p.post_attention_norm, &p.pre_mlp_norm}) expect(*t, DType::kBF16, "gemma norm weight");
    const bool moe = !p.pre_moe_norm.empty();
    if (moe) {
      expect(p.pre_moe_norm, DType::kBF16, "gemma norm weight");
      expect(p.moe_in, DType::kBF16, "moe_in");
    }
    if (p.attn_out.numel() != n || p.mlp_in.numel() != n || (moe && p.moe_in.numel() != n) ||
        p.post_attention_norm.numel() != h || p.pre_mlp_norm.numel() != h || (moe && p.pre_moe_norm.numel() != h))
      return invalid_argument("gemma_attention_end: rows of " + std::to_string(h) + " values expected everywhere");
    GemmaAttentionEndKernelParams k;
    k.attn_out = ptr<const uint16_t>(p.attn_out);
    k.residual = ptr<float>(p.residual);
    k.post_attention_norm = ptr<const uint16_t>(p.post_attention_norm);
    k.pre_mlp_norm = ptr<const uint16_t>(p.pre_mlp_norm);
    k.pre_moe_norm = moe ? ptr<const uint16_t>(p.pre_moe_norm) : nullptr;
    k.mlp_in = ptr<uint16_t>(p.mlp_in);
    k.moe_in = moe ? ptr<uint16_t>(p.moe_in) : nullptr;
    k.rows = n / h, k.hidden = h, k.eps = p.eps;
    k.form = gemma_row_form();
    if (!p.route) return launch_gemma_attention_end(k, stream());
    const RouterParams& route = *p.route;
    if (route.x.data() != p.residual.data() || route.x.numel() != n)
      return invalid_argument("gemma_attention_end: the route's x must be the residual it updates");
    // Where the router runs its cluster kernel, the fused launch (gemma_attention_end_route.cu); else the two.
    if (!route.x_scale.empty() && route.bias.empty()) {
      MX_ASSIGN_OR_RETURN(const GemmaRouterParams r, gemma_router_params(route));
      if (r.cluster_ctas > 0 && gemma_attention_end_route_fits(k, r))
        return launch_gemma_attention_end_route(k, r, stream());
    }
    MX_RETURN_IF_ERROR(launch_gemma_attention_end(k, stream()));
    return router_topk(route);
  }
  Status gemma_layer_end(const GemmaLayerEndParams& p) override {
    expect(p.residual, DType::kF32, "gemma_layer_end residual");
    const int64_t h = p.residual.dim(-1), n = p.residual.numel();
    for (const TensorView* t : {&p.dense, &p.next_in}) expect(*t, DType::kBF16, "gemma_layer_end activation");
    for (const TensorView* t : {&p.post_mlp_norm, &p.next_norm}) expect(*t, DType::kBF16, "gemma norm weight");
    const bool moe = !p.moe.empty();
    if (moe) {
      expect(p.moe, DType::kBF16, "gemma_layer_end moe");
      for (const TensorView* t : {&p.post_moe_norm, &p.post_ffn_norm}) expect(*t, DType::kBF16, "gemma norm weight");
    }
    if (p.dense.numel() != n || p.next_in.numel() != n || (moe && p.moe.numel() != n) || p.post_mlp_norm.numel() != h ||
        p.next_norm.numel() != h || (moe && (p.post_moe_norm.numel() != h || p.post_ffn_norm.numel() != h)))
      return invalid_argument("gemma_layer_end: rows of " + std::to_string(h) + " values expected everywhere");
    if (!p.layer_scalar.empty() && (p.layer_scalar.numel() != 1 || (p.layer_scalar.dtype() != DType::kF32 &&
                                                                      p.layer_scalar.dtype() != DType::kBF16)))
      return invalid_argument("gemma_layer_end: layer_scalar must be one bf16 or f32 value");
    GemmaLayerEndKernelParams k;
    k.dense = ptr<const uint16_t>(p.dense);
    k.moe = moe ? ptr<const uint16_t>(p.moe) : nullptr;
    k.post_mlp_norm = ptr<const uint16_t>(p.post_mlp_norm);
    k.post_moe_norm = moe ? ptr<const uint16_t>(p.post_moe_norm) : nullptr;
    k.post_ffn_norm = moe ? ptr<const uint16_t>(p.post_ffn_norm) : nullptr;
    k.layer_scalar = p.layer_scalar.empty() ? nullptr : p.layer_scalar.data();
    k.scalar_f32 = p.layer_scalar.dtype() == DType::kF32;
    k.residual = ptr<float>(p.residual);
    k.next_norm = ptr<const uint16_t>(p.next_norm);
    k.next_in = ptr<uint16_t>(p.next_in);
    k.rows = n / h, k.hidden = h, k.eps = p.eps;
    k.form = gemma_row_form();
    return launch_gemma_layer_end(k, stream());
  }
  Status qkv_norms(const QkvNormParams& p) override {
    expect(p.qkv, DType::kBF16, "qkv_norms qkv");
    expect(p.q_norm, DType::kBF16, "q_norm");
    expect(p.k_norm, DType::kBF16, "k_norm");
    QkvNormKernelParams k;
    k.qkv = ptr<uint16_t>(p.qkv);
    k.q_norm = ptr<const uint16_t>(p.q_norm);
    k.k_norm = ptr<const uint16_t>(p.k_norm);
    k.n_q = p.n_q, k.n_kv = p.n_kv, k.head_dim = p.head_dim, k.eps = p.eps;
    k.tokens = p.qkv.numel() / ((p.n_q + 2 * p.n_kv) * p.head_dim);
    return launch_qkv_norms(k, stream());
  }

  // bf16 GeGLU experts (moe_bf16.cu): routing tiles of 8 tokens at decode, 64 or 128 when experts get many
  // tokens each; the two GEMMs; the combine in router order. Up to 32 routed slots the GEMMs route themselves and
  // the second one combines (two launches in all).
  Status moe_geglu_experts(const GegluMoeParams& p) override {
    expect(p.x, DType::kBF16, "moe x");
    expect(p.out, DType::kBF16, "moe out");
    expect(p.gate_up, DType::kBF16, "experts gate_up");
    expect(p.down, DType::kBF16, "experts down");
    const int64_t E = p.gate_up.dim(0), I = p.gate_up.dim(1) / 2, H = p.gate_up.dim(2), k = p.top_k;
    const int64_t T = p.x.numel() / H, slots = T * k;
    if (T == 0) return Status::ok();
    const CudaBf16ExpertsOptions& opt = options_.bf16_experts;
    const CudaBf16ExpertsDecode decode = opt.decode;
    if ((decode == CudaBf16ExpertsDecode::kBulkCopies || decode == CudaBf16ExpertsDecode::kStreamed ||
         decode == CudaBf16ExpertsDecode::kFused) &&
        dev_.sm_major < 9)
      return unimplemented("bf16 experts: the bulk-copy, streamed and fused decode kernels need sm_90 or later");
    const bool prefill_wgmma = opt.prefill == CudaBf16ExpertsPrefill::kWgmma ||
                               (opt.prefill == CudaBf16ExpertsPrefill::kAuto && dev_.sm_major == 9);
    if (prefill_wgmma && dev_.sm_major != 9)
      return unimplemented("bf16 experts: the wgmma prefill kernel runs on sm_90 only");
    const int64_t prefill_tile_tokens =
        opt.prefill_tile_tokens != 0 ? opt.prefill_tile_tokens : moe_bf16_prefill_tile_tokens(prefill_wgmma, slots, E);
    if (prefill_tile_tokens != 64 && !(prefill_tile_tokens == 128 && prefill_wgmma))
      return invalid_argument("bf16 experts: prefill tiles of 64 tokens (wgmma: also 128)");
    // 128-token tiles on wgmma: the warp-specialized persistent kernel unless told otherwise (cuda_backend.h), 128
    // weight rows a CTA in both GEMMs, through rings of 6 k tiles (the CTA-per-item kernel: 4).
    const bool ws = opt.prefill_warp_specialized >= 0;
    const int up_rows = opt.prefill_up_rows != 0 ? opt.prefill_up_rows : 128;
    const int up_stages = opt.prefill_up_stages != 0 ? opt.prefill_up_stages : ws ? 6 : 4;
    const int down_rows = opt.prefill_down_rows != 0 ? opt.prefill_down_rows : 128;
    const int down_stages = opt.prefill_down_stages != 0 ? opt.prefill_down_stages : ws ? 6 : 4;
    if (!moe_bf16_wgmma_form_ok(true, up_rows, up_stages, ws) ||
        !moe_bf16_wgmma_form_ok(false, down_rows, down_stages, ws))
      return invalid_argument("bf16 experts: no wgmma prefill kernel of those rows and stages");
    // 64-token tiles (grouped GEMM) once experts average 32 routed tokens; its epilogues store channel pairs.
    const bool grouped = slots >= 32 * E && I % 2 == 0;
    const bool self_routed = !grouped && use_fused_moe_routing(slots);
    const bool streamed = !grouped && !self_routed &&
                          (decode == CudaBf16ExpertsDecode::kStreamed || decode == CudaBf16ExpertsDecode::kFused ||
                           (decode == CudaBf16ExpertsDecode::kAuto && dev_.sm_major == 9));
    int64_t tile_tokens = grouped ? prefill_tile_tokens : 8;
    if (streamed) {
      // 32-token tiles once experts average 16 routed tokens (an expert streamed once for up to 32), else 16
      // (the kernel for <= 16-token tiles fits 5 CTAs per SM, the 32-token one 4): cuda_backend.h's table.
      tile_tokens = opt.stream_tile_tokens != 0 ? opt.stream_tile_tokens : slots >= 16 * E ? 32 : 16;
      if (tile_tokens != 8 && tile_tokens != 16 && tile_tokens != 32)
        return invalid_argument("bf16 experts: streamed tiles of 8, 16 or 32 tokens");
    }
    const int64_t max_tiles = self_routed ? moe_fused_max_tiles(slots, E) : moe_max_tiles(slots, E, tile_tokens);
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_h, slots * I * 2, "MoE h"));
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_y, slots * H * 2, "MoE y"));
    MoeBf16GemmParams g;
    if (self_routed) {
      MX_RETURN_IF_ERROR(ensure(scratch_.moe_tickets, (H + 15) / 16 * 4, "MoE tickets", /*zero=*/true));
      g.topk_ids = ptr<const int32_t>(p.topk_ids);
      g.slots = slots;
      g.experts = E;
      g.routing_ready = p.routing_ready;
    } else {
      MX_RETURN_IF_ERROR(ensure(scratch_.moe_meta, ((E + 1) + 2 * slots + 3 * max_tiles + 1) * 4, "MoE routing"));
      g.r = routing_scratch(E, slots, max_tiles);
      MX_RETURN_IF_ERROR(
          launch_moe_routing({ptr<const int32_t>(p.topk_ids), g.r, slots, E, tile_tokens, max_tiles}, stream()));
    }
    g.top_k = k;
    g.max_tiles = max_tiles;
    g.tile_tokens = tile_tokens;
    // kAuto: the bulk-copy and streamed kernels where they were measured faster (Hopper: docs/PERF.md); not
    // yet timed on sm_100/120.
    g.bulk_copies = !streamed && (decode == CudaBf16ExpertsDecode::kBulkCopies ||
                                  decode == CudaBf16ExpertsDecode::kStreamed ||
                                  decode == CudaBf16ExpertsDecode::kFused ||
                                  (decode == CudaBf16ExpertsDecode::kAuto && dev_.sm_major == 9));
    g.streamed = streamed;
    g.wgmma = grouped && prefill_wgmma;
    g.ring_slots = opt.stream_ring_slots != 0 ? opt.stream_ring_slots : 4;
    g.weight_experts = E;
    // Tensor boxes in the bulk-copy and streamed kernels (kAuto: both; kRows: a copy per weight row, the before).
    const bool boxes = (g.bulk_copies || g.streamed) && opt.bulk_copy_form != CudaBulkCopyForm::kRows;
    // Decode (register loads): a k split that leaves each warp ~8 chunks of 64 (more warps in flight per strip).
    auto k_split = [&](int64_t kdim) {
      return tile_tokens == 8 ? static_cast<int>(std::clamp<int64_t>((kdim + 63) / 64 / 8, 1, 8)) : 1;
    };
    g.gated = true;
    g.w = ptr<const uint16_t>(p.gate_up);
    g.in = ptr<const uint16_t>(p.x);
    g.out = ptr_of<uint16_t>(scratch_.moe_h);
    g.out_rows = I;
    g.k = H;
    g.k_split = k_split(H);
    if (g.wgmma && tile_tokens == 128) {
      g.wgmma_rows = up_rows;
      g.wgmma_stages = up_stages;
      g.wgmma_ws = ws;
      g.sms = dev_.sm_count;
    }
    // Bulk copies where the experts route themselves (one CTA per tile and strip): wider ring stages, fewer copies.
    g.bulk_stage_k = opt.bulk_up_stage_k != 0 ? opt.bulk_up_stage_k : self_routed ? 512 : 256;
    g.bulk_tensor_boxes = boxes && moe_bf16_bulk_boxes_fit(g);
    // A self-routed step's two GEMMs in one persistent launch (moe_bf16_fused.cu): kFused, and kAuto on Hopper
    // from two tokens (H200: 4 tokens 128.1 -> 113.2 us; one token 34.6 -> 35.7 keeps the two launches).
    const bool fused = self_routed && (decode == CudaBf16ExpertsDecode::kFused ||
                                       (decode == CudaBf16ExpertsDecode::kAuto && dev_.sm_major == 9 && T > 1));
    const MoeBf16GemmParams up = g;
    if (!fused) MX_RETURN_IF_ERROR(launch_moe_bf16_gemm(g, stream()));
    g.gated = false;
    g.w = ptr<const uint16_t>(p.down);
    g.in = ptr_of<const uint16_t>(scratch_.moe_h);
    g.out = ptr_of<uint16_t>(scratch_.moe_y);
    g.topk_weights = ptr<const float>(p.topk_weights);
    g.out_rows = H;
    g.k = I;
    g.k_split = k_split(I);
    if (g.wgmma && tile_tokens == 128) {
      g.wgmma_rows = down_rows;
      g.wgmma_stages = down_stages;
    }
    g.bulk_stage_k = opt.bulk_down_stage_k != 0 ? opt.bulk_down_stage_k : 256;
    g.bulk_tensor_boxes = boxes && moe_bf16_bulk_boxes_fit(g);
    if (g.bulk_copies) {
      const int forced = opt.second_gemm_tiles_per_cta;
      g.tiles_per_cta = forced > 0 ? forced : self_routed ? 1 : 3;
    }
    if (self_routed) {
      g.tickets = ptr_of<uint32_t>(scratch_.moe_tickets);
      g.combined = ptr<uint16_t>(p.out);
    }
    if (fused) {
      MX_RETURN_IF_ERROR(ensure(scratch_.moe_fused_counters, moe_bf16_fused_counters() * 4, "MoE fused counters",
                                /*zero=*/true));
      const int ring_slots = opt.fused_ring_slots != 0 ? opt.fused_ring_slots : 6;
      return launch_moe_bf16_fused(up, g, ptr_of<uint32_t>(scratch_.moe_fused_counters), ring_slots, stream());
    }
    MX_RETURN_IF_ERROR(launch_moe_bf16_gemm(g, stream()));
    if (self_routed) return Status::ok();
    return launch_moe_combine({g.out, g.r.slot_pos, ptr<uint16_t>(p.out), T, H, k},
                              stream());
  }

  Status moe_experts(const MoeParams& p) override {
    const ExpertWeights& w = *p.experts;
    if (w.layout != ExpertLayout::kMxfp4SwapAb) return internal_error("moe_experts: weights were not uploaded by CUDA");
    if ((p.routed_experts != 0 && p.routed_experts != w.num_experts) || p.first_expert != 0)
      return moe_experts_of_a_share(p);
    expect(p.x, DType::kBF16, "moe x");
    expect(p.out, DType::kBF16, "moe out");
    const int64_t H = w.hidden, I = w.intermediate, E = w.num_experts, k = p.top_k, T = p.x.numel() / H;
    if (T == 0) return Status::ok();
    const int64_t slots = T * k;
    if (moe_takes_decode_gemms(slots, E)) return moe_experts_decode(p);
    const CudaMoePath path = options_.moe.path;
    const MoeWgmmaConfig cw = moe_wgmma_config(slots, E);
    const bool grouped = path == CudaMoePath::kGrouped || path == CudaMoePath::kGroupedMmaSync ||
                         (path == CudaMoePath::kAuto && use_grouped_moe(slots, E, cw.enabled));
    if (grouped && path != CudaMoePath::kGroupedMmaSync && cw.enabled) return moe_experts_wgmma(p, cw);
    const MoeConfig c1 = choose_moe_config(dev_, slots, E, 2 * I);
    const MoeConfig c2 = choose_moe_config(dev_, slots, E, H);
    MoeGroupedConfig cg = choose_moe_grouped_config(dev_, slots, E);
    if (const int tile = options_.moe.grouped_tile_tokens; tile != 0 && tile != cg.tile_tokens)
      cg = choose_moe_grouped_config(dev_, tile == 64 ? E : 128 * E, E);  // a routing that picks `tile`
    if (grouped ? !fits(dev_, cg.smem_bytes, cg.stages) : (!fits(dev_, c1.smem_bytes, 1) || !fits(dev_, c2.smem_bytes, 1)))
      return internal_error("MoE config does not fit");
    // prepare() sized the routing scratch for 8-token tiles, the most tiles any path needs.
    const int64_t tile_tokens = grouped ? cg.tile_tokens : c1.tile_tokens;
    const int64_t max_tiles = moe_max_tiles(slots, E, tile_tokens);
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_h, slots * I * 2, "MoE h"));
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_y, slots * H * 2, "MoE y"));
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_meta, ((E + 1) + 2 * slots + 3 * max_tiles + 1) * 4, "MoE routing"));
    const MoeRouting r = routing_scratch(E, slots, max_tiles);
    MX_RETURN_IF_ERROR(
        launch_moe_routing({ptr<const int32_t>(p.topk_ids), r, slots, E, tile_tokens, max_tiles}, stream()));
    MoeGemmParams g1 = expert_gemm(p, r, /*first=*/true);
    g1.max_tiles = max_tiles;
    MX_RETURN_IF_ERROR(grouped ? launch_moe_grouped_gemm(g1, cg, stream()) : launch_moe_gemm(g1, c1, stream()));
    MoeGemmParams g2 = expert_gemm(p, r, /*first=*/false);
    g2.max_tiles = max_tiles;
    MX_RETURN_IF_ERROR(grouped ? launch_moe_grouped_gemm(g2, cg, stream()) : launch_moe_gemm(g2, c2, stream()));
    return launch_moe_combine({ptr_of<const uint16_t>(scratch_.moe_y), r.slot_pos, ptr<uint16_t>(p.out), T, H, k},
                              stream());
  }

  // CudaMoeOptions::wgmma_glue with its default resolved: 1, 2 or -1.
  int moe_wgmma_glue() const { return options_.moe.wgmma_glue != 0 ? options_.moe.wgmma_glue : kMoeWgmmaGlue; }
  // CudaMoeOptions::wgmma_bulk with its default resolved: 1 to 3 (the copy engine's forms) or -1 (cp.async).
  int moe_wgmma_bulk_form() const {
    return options_.moe.wgmma_bulk != 0 ? options_.moe.wgmma_bulk : kMoeWgmmaBulk ? (kMoeWgmmaBulkPairs ? 3 : 1) : -1;
  }
  MoeWgmmaConfig moe_wgmma_config(int64_t slots, int64_t experts) {
    return choose_moe_wgmma_config(dev_, slots, experts, options_.moe.grouped_tile_tokens, options_.moe.wgmma_persistent,
                                   options_.moe.wgmma_warp_specialized, options_.moe.wgmma_pdl);
  }
  // Whether moe_experts runs the decode GEMMs (moe_experts_decode) for this many routed slots of all its experts.
  bool moe_takes_decode_gemms(int64_t slots, int64_t experts) {
    const CudaMoePath path = options_.moe.path;
    if (path == CudaMoePath::kDecode) return true;
    return path == CudaMoePath::kAuto && !use_grouped_moe(slots, experts, moe_wgmma_config(slots, experts).enabled) &&
           use_fused_moe_decode(slots);
  }

  // Where moe_experts would run the self-routed decode GEMMs, whose second GEMM combines the experts' rows, that
  // GEMM leaves the rows and the norm's kernel sums them (norm_embed.cu): the combine's fences, ticket and the
  // strip's reads through L2 leave the second GEMM's critical path.
  Status moe_experts_add_rms_norm(const MoeParams& p, TensorView residual, const TensorView& weight, float eps,
                                  TensorView out) override {
    const ExpertWeights& w = *p.experts;
    const int64_t slots = p.topk_ids.numel();
    const bool all_experts = (p.routed_experts == 0 || p.routed_experts == w.num_experts) && p.first_expert == 0;
    if (w.layout == ExpertLayout::kMxfp4SwapAb && all_experts && slots > 0 && use_fused_moe_routing(slots) &&
        options_.moe.decode_only_gemm == 0 && options_.moe.decode_combine_in_norm &&
        moe_takes_decode_gemms(slots, w.num_experts)) {
      expect(p.x, DType::kBF16, "moe x");
      MX_RETURN_IF_ERROR(moe_experts_decode(p, /*leave_rows=*/true));
      MoeCombineNormParams m;
      m.y = ptr_of<const uint16_t>(scratch_.moe_y);
      m.topk_ids = ptr<const int32_t>(p.topk_ids);
      m.slots = static_cast<int>(slots);
      m.experts = static_cast<int>(w.num_experts);
      m.top_k = static_cast<int>(p.top_k);
      m.dependents_first = options_.moe.decode_norm_dependents_first;
      return launch_moe_combine_add_rms_norm(add_rms_norm_params(residual, p.out, weight, eps, out), m, stream());
    }
    if (w.layout == ExpertLayout::kMxfp4SwapAb && all_experts && slots > 0 && moe_wgmma_glue() == 2 &&
        !moe_takes_decode_gemms(slots, w.num_experts)) {
      const int64_t E = w.num_experts;
      const MoeWgmmaConfig cw = moe_wgmma_config(slots, E);
      const CudaMoePath path = options_.moe.path;
      const bool wgmma =
          cw.enabled && path != CudaMoePath::kGroupedMmaSync &&
          (path == CudaMoePath::kGrouped || (path == CudaMoePath::kAuto && use_grouped_moe(slots, E, true)));
      // Every wgmma form leaves y in the sorted order with slot_pos (the tiled ones, and the 96-, 128- and 256-token
      // tiles of prefill), written by a routing launch that ended before the first GEMM started.
      if (wgmma) {
        expect(p.x, DType::kBF16, "moe x");
        MX_RETURN_IF_ERROR(moe_experts_wgmma(p, cw, /*leave_rows=*/true));
        MoeCombineNormParams m;
        m.y = ptr_of<const uint16_t>(scratch_.moe_y);
        m.slot_pos = routing_scratch(E, slots, 0).slot_pos;
        m.slots = static_cast<int>(slots);
        m.experts = static_cast<int>(E);
        m.top_k = static_cast<int>(p.top_k);
        return launch_moe_combine_add_rms_norm(add_rms_norm_params(residual, p.out, weight, eps, out), m, stream());
      }
    }
    MX_RETURN_IF_ERROR(moe_experts(p));
    return add_rms_norm(residual, p.out, weight, eps, out);
  }

  // Whether the 96-token tiles' 64/96-column kernel runs on the copy engine (CudaMoeOptions::wgmma_bulk_mid).
  bool moe_wgmma_bulk_mid() const {
    return options_.moe.wgmma_bulk_mid != 0 ? options_.moe.wgmma_bulk_mid == 1 : kMoeWgmmaBulkMid;
  }
  // And the 256-token tiles (CudaMoeOptions::wgmma_bulk_wide), the 96-token tiles at 96/48 columns (wgmma_bulk_full).
  bool moe_wgmma_bulk_wide() const {
    return options_.moe.wgmma_bulk_wide != 0 ? options_.moe.wgmma_bulk_wide == 1 : kMoeWgmmaBulkWide;
  }
  // By default from kMoeWgmmaBulkFullMinTokensPerExpert tokens per expert.
  bool moe_wgmma_bulk_full(int64_t slots, int64_t experts) const {
    if (options_.moe.wgmma_bulk_full != 0) return options_.moe.wgmma_bulk_full == 1;
    return kMoeWgmmaBulkFull && slots >= kMoeWgmmaBulkFullMinTokensPerExpert * experts;
  }
  // And their tiles of at most 48 tokens two strips a warp (wgmma_bulk_two_strips).
  bool moe_wgmma_bulk_two_strips() const {
    return options_.moe.wgmma_bulk_two_strips != 0 ? options_.moe.wgmma_bulk_two_strips == 1 : kMoeWgmmaBulkTwoStrips;
  }
  // Whether moe_experts_wgmma reads its input tiled for config c at this step (`mid_width`: moe_wgmma_mid_width):
  // the warp-specialized kernel, or the copy engine's tiles (16 tokens, moe_wgmma_bulk_form; 32 only when forced; 96
  // at 64/96 columns, moe_wgmma_bulk_mid, at 96/48, moe_wgmma_bulk_full, and 256, moe_wgmma_bulk_wide, where the
  // routing and the tiled gather fit one launch: the two-kernel routing's one CTA would cost more than the copy engine
  // saves).
  bool moe_wgmma_tiled(const MoeWgmmaConfig& c, bool mid_width, int64_t slots, int64_t experts) {
    return c.warp_specialized || (moe_wgmma_bulk_form() >= 1 && c.tile_tokens == 16) ||
           (options_.moe.wgmma_bulk == 1 && c.tile_tokens == 32) ||
           (((c.tile_tokens == 96 && (mid_width ? moe_wgmma_bulk_mid() : moe_wgmma_bulk_full(slots, experts))) ||
             (c.tile_tokens == 256 && !c.persistent && moe_wgmma_bulk_wide())) &&
            moe_wgmma_glue() >= 1 && moe_route_gather_fits(slots, experts));
  }

  // Whether the 96-token tiles' GEMMs run the kernel of 64 and 96 columns (MoeGemmParams::mid_width) at this step.
  bool moe_wgmma_mid_width(int64_t slots, int64_t experts) const {
    if (options_.moe.wgmma_mid_width != 0) return options_.moe.wgmma_mid_width == 1;
    return kMoeWgmmaMidWidth && slots > kMoeWgmmaMidWidthMinTokensPerExpert * experts &&
           slots <= kMoeWgmmaMidWidthMaxTokensPerExpert * experts;
  }

  // Many tokens per expert on Hopper (moe_wgmma.cu): routing, x permuted into the wgmma k order (in the y
  // scratch, free until the second GEMM), the two GEMMs (h in the permuted order between them), combine.
  // Expert parallel: this backend holds experts [first, first + E) of the router's. Slots routed elsewhere go
  // to local expert 0 with weight 0 (they add exactly nothing), so every MoE path runs unchanged; the extra
  // work on expert 0 is the price until the kernels learn to skip slots.
  Status moe_experts_of_a_share(const MoeParams& p) {
    const int64_t slots = p.topk_ids.numel();
    MX_RETURN_IF_ERROR(ensure(scratch_.share_ids, slots * 4, "expert-parallel ids"));
    MX_RETURN_IF_ERROR(ensure(scratch_.share_weights, slots * 4, "expert-parallel weights"));
    LocalRoutingParams lr;
    lr.ids = ptr<const int32_t>(p.topk_ids);
    lr.weights = ptr<const float>(p.topk_weights);
    lr.slots = slots;
    lr.first_expert = static_cast<int32_t>(p.first_expert);
    lr.num_experts = static_cast<int32_t>(p.experts->num_experts);
    lr.local_ids = static_cast<int32_t*>(scratch_.share_ids.data());
    lr.local_weights = static_cast<float*>(scratch_.share_weights.data());
    MX_RETURN_IF_ERROR(launch_local_routing(lr, stream()));
    MoeParams local = p;
    local.topk_ids = scratch_.share_ids.view(DType::kI32, p.topk_ids.shape());
    local.topk_weights = scratch_.share_weights.view(DType::kF32, p.topk_weights.shape());
    local.routed_experts = 0;
    local.first_expert = 0;
    return moe_experts(local);
  }

  // `leave_rows`: the experts' rows stay in moe_y (sorted order, slot_pos) for the caller's combine.
  Status moe_experts_wgmma(const MoeParams& p, const MoeWgmmaConfig& c, bool leave_rows = false) {
    const ExpertWeights& w = *p.experts;
    const int64_t H = w.hidden, I = w.intermediate, E = w.num_experts, k = p.top_k, T = p.x.numel() / H;
    const int64_t slots = T * k, max_tiles = moe_max_tiles(slots, E, c.tile_tokens);
    // The warp-specialized and copy-engine kernels read x and h tiled: every routing tile padded to tile_tokens rows.
    // The copy engine's: the 16-token tiles (moe_wgmma_bulk_form), 32-token tiles only when forced, the 96-token tiles
    // at 64/96 columns (moe_wgmma_bulk_mid).
    const bool mid_width = moe_wgmma_mid_width(slots, E);
    const bool tiled = moe_wgmma_tiled(c, mid_width, slots, E), bulk = tiled && !c.warp_specialized;
    const bool warp_release = moe_wgmma_bulk_form() == 2 && c.tile_tokens != 96;
    const bool pairs = moe_wgmma_bulk_form() == 3 && c.tile_tokens == 16;
    const bool trim_rows = options_.moe.wgmma_bulk_rows != -1;
    const int64_t tiled_rows = tiled ? max_tiles * c.tile_tokens : 0;
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_h, std::max(slots, tiled_rows) * I * 2, "MoE h"));
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_y, std::max(slots, tiled_rows) * H * 2, "MoE y"));
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_meta, ((E + 1) + 2 * slots + 3 * max_tiles + 1) * 4, "MoE routing"));
    const MoeRouting r = routing_scratch(E, slots, max_tiles);
    const MoeRoutingParams rp{ptr<const int32_t>(p.topk_ids), r, slots, E, c.tile_tokens, max_tiles};
    uint16_t* x_in = ptr_of<uint16_t>(scratch_.moe_y);  // free until the second GEMM writes y
    const int wide_first = options_.moe.wgmma_wide_first;
    const int wide_over = wide_first == 1 || (wide_first == 0 && kMoeWgmmaWideTilesFirst)
                              ? moe_wide_tile_tokens(c.tile_tokens, mid_width)
                              : 0;
    if (tiled && moe_wgmma_glue() >= 1 && moe_route_gather_fits(slots, E)) {
      MX_RETURN_IF_ERROR(launch_moe_route_gather_tiled_wide_first(rp, ptr<const uint16_t>(p.x), x_in, H, k,
                                                                  c.warp_specialized ? 0 : wide_over, stream()));
    } else if (!tiled && moe_wgmma_glue() >= 1 && moe_route_permute_fits(slots, E)) {
      MX_RETURN_IF_ERROR(
          launch_moe_route_permute_wide_first(rp, ptr<const uint16_t>(p.x), x_in, T, H, k, wide_over, stream()));
    } else {
      MX_RETURN_IF_ERROR(launch_moe_routing(rp, stream()));
      MX_RETURN_IF_ERROR(tiled ? launch_moe_gather_tiled(ptr<const uint16_t>(p.x), r, x_in, max_tiles, c.tile_tokens, H,
                                                         k, stream())
                               : launch_moe_permute_k(ptr<const uint16_t>(p.x), x_in, T, H, stream()));
    }
    const int only = options_.moe.wgmma_glue_only;  // benchmarks only
    if (only == 1) return Status::ok();
    if (only != 2) {
      MoeGemmParams g1 = expert_gemm(p, r, /*first=*/true);
      g1.in = x_in;
      g1.max_tiles = max_tiles;
      g1.mid_width = mid_width;
      g1.two_strips = moe_wgmma_bulk_two_strips();
      MX_RETURN_IF_ERROR(bulk ? launch_moe_wgmma_bulk_gemm(g1, c, warp_release, pairs, trim_rows, stream())
                              : launch_moe_wgmma_gemm(g1, c, stream()));
      MoeGemmParams g2 = expert_gemm(p, r, /*first=*/false);
      g2.max_tiles = max_tiles;
      g2.mid_width = mid_width;
      g2.two_strips = g1.two_strips;
      MX_RETURN_IF_ERROR(bulk ? launch_moe_wgmma_bulk_gemm(g2, c, warp_release, pairs, trim_rows, stream())
                              : launch_moe_wgmma_gemm(g2, c, stream()));
    }
    if (leave_rows) return Status::ok();
    return launch_moe_combine({ptr_of<const uint16_t>(scratch_.moe_y), r.slot_pos, ptr<uint16_t>(p.out), T, H, k},
                              stream());
  }

  // Decode (moe_decode.cu): up to 32 routed tokens two launches (each CTA routes itself, the combine is in
  // the second GEMM, unless `leave_rows`: then the experts' rows stay in moe_y for the caller); more tokens add the
  // routing kernel before and the combine kernel after.
  Status moe_experts_decode(const MoeParams& p, bool leave_rows = false) {
    const ExpertWeights& w = *p.experts;
    const int64_t H = w.hidden, I = w.intermediate, E = w.num_experts, k = p.top_k, T = p.x.numel() / H;
    const int64_t slots = T * k;
    // kDecode keeps the batch-independent default split; kAuto's follows the batch and the GEMM (kernel_configs.h).
    const bool in_registers = options_.moe.decode_scales_in_registers;
    const auto k_tiles = [&](bool first) {
      const int forced = first ? options_.moe.decode_k_tiles_per_warp : options_.moe.decode_k_tiles_gemm2;
      if (forced != 0) return forced;
      if (!first && options_.moe.decode_k_tiles_per_warp != 0) return options_.moe.decode_k_tiles_per_warp;
      const int three = options_.moe.decode_three_warp_slots;
      return options_.moe.path == CudaMoePath::kAuto
                 ? moe_fused_auto_k_tiles_per_warp(slots, first, in_registers, three > 0 ? three : kMoeFusedAutoThreeWarpSlots)
                 : 0;
    };
    MoeFusedConfig c1 = choose_moe_fused_config(dev_, H, k_tiles(true));
    MoeFusedConfig c2 = choose_moe_fused_config(dev_, I, k_tiles(false));
    c1.pdl = c1.pdl && options_.moe.decode_pdl;
    c2.pdl = c2.pdl && options_.moe.decode_pdl;
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_h, slots * I * 2, "MoE h"));
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_y, slots * H * 2, "MoE y"));
    const bool self_routed = use_fused_moe_routing(slots);
    MoeRouting r;
    if (!self_routed) {
      const int64_t max_tiles = moe_max_tiles(slots, E, kMoeFusedTileTokens);
      MX_RETURN_IF_ERROR(ensure(scratch_.moe_meta, ((E + 1) + 2 * slots + 3 * max_tiles + 1) * 4, "MoE routing"));
      r = routing_scratch(E, slots, max_tiles);
      MX_RETURN_IF_ERROR(launch_moe_routing(
          {ptr<const int32_t>(p.topk_ids), r, slots, E, kMoeFusedTileTokens, max_tiles}, stream()));
    } else {
      MX_RETURN_IF_ERROR(ensure(scratch_.moe_tickets, H / 16 * 4, "MoE tickets", /*zero=*/true));
    }
    // kAuto's staged GEMMs decode with shifts up to kMoeFusedShiftSlots (the same bits in any form).
    const int shift_slots = options_.moe.decode_shift_slots;
    const bool shifts = !in_registers && options_.moe.path == CudaMoePath::kAuto &&
                        slots <= (shift_slots == 0 ? kMoeFusedShiftSlots : shift_slots);
    const int forced_ring = options_.moe.decode_ring_gemm1;
    const int ring = forced_ring == 5                                                 ? 5
                     : forced_ring == 0 && options_.moe.path == CudaMoePath::kAuto ? moe_fused_auto_ring(slots)
                                                                                   : 0;
    MoeFusedParams f1;
    f1.g = expert_gemm(p, r, /*first=*/true);
    f1.topk_ids = self_routed ? ptr<const int32_t>(p.topk_ids) : nullptr;
    f1.slots = slots;
    f1.experts = E;
    f1.trace = self_routed ? options_.moe.decode_trace : nullptr;
    const int only = options_.moe.decode_only_gemm;  // benchmarks only
    if (only != 2)
      MX_RETURN_IF_ERROR(launch_moe_fused_gemm(f1, c1, in_registers, stream(), options_.moe.decode_mask_route, shifts,
                                                     ring));
    if (only == 1) return Status::ok();
    MoeFusedParams f2 = f1;
    f2.g = expert_gemm(p, r, /*first=*/false);
    if (f2.trace != nullptr) f2.trace += 8 * (f1.g.rows / 16) * moe_fused_max_tiles(slots, E);
    if (self_routed && !leave_rows) {
      f2.tickets = ptr_of<uint32_t>(scratch_.moe_tickets);
      f2.combined = ptr<uint16_t>(p.out);
    }
    MX_RETURN_IF_ERROR(launch_moe_fused_gemm(f2, c2, in_registers, stream(), /*mask_route=*/true, shifts));
    if (self_routed) return Status::ok();
    return launch_moe_combine({ptr_of<const uint16_t>(scratch_.moe_y), r.slot_pos, ptr<uint16_t>(p.out), T, H, k},
                              stream());
  }

  // The routing kernel's outputs, carved out of moe_meta (sized by the caller).
  MoeRouting routing_scratch(int64_t E, int64_t slots, int64_t max_tiles) {
    MoeRouting r;
    int32_t* meta = ptr_of<int32_t>(scratch_.moe_meta);
    r.offsets = meta;
    r.sorted_slots = r.offsets + E + 1;
    r.slot_pos = r.sorted_slots + slots;
    r.tile_expert = r.slot_pos + slots;
    r.tile_start = r.tile_expert + max_tiles;
    r.tile_rows = r.tile_start + max_tiles;
    r.num_tiles = r.tile_rows + max_tiles;
    return r;
  }

  // Operands of the first (x -> h, gated) or second (h -> y) expert GEMM; max_tiles left to the caller.
  MoeGemmParams expert_gemm(const MoeParams& p, const MoeRouting& r, bool first) {
    const ExpertWeights& w = *p.experts;
    MoeGemmParams g;
    g.r = r;
    g.top_k = p.top_k;
    g.swiglu_limit = p.swiglu_limit;
    g.swiglu_alpha = p.swiglu_alpha;
    g.gated = first;
    if (first) {
      g.blocks = ptr<const uint8_t>(w.w1_blocks);
      g.scales = ptr<const uint8_t>(w.w1_scales);
      g.bias = ptr<const uint16_t>(w.w1_bias);
      g.in = ptr<const uint16_t>(p.x);
      g.out = ptr_of<uint16_t>(scratch_.moe_h);
      g.rows = 2 * w.intermediate;
      g.k = w.hidden;
    } else {
      g.blocks = ptr<const uint8_t>(w.w2_blocks);
      g.scales = ptr<const uint8_t>(w.w2_scales);
      g.bias = ptr<const uint16_t>(w.w2_bias);
      g.in = ptr_of<const uint16_t>(scratch_.moe_h);
      g.out = ptr_of<uint16_t>(scratch_.moe_y);
      g.topk_weights = ptr<const float>(p.topk_weights);
      g.rows = w.hidden;
      g.k = w.intermediate;
    }
    return g;
  }

  Status gather_rows(const TensorView& x, const TensorView& rows, TensorView out) override {
    const int64_t row_bytes = x.bytes() / x.dim(0);
    return launch_gather_rows({ptr<const uint8_t>(x), ptr<const int32_t>(rows), ptr<uint8_t>(out), rows.numel(),
                               x.dim(0), row_bytes},
                              stream());
  }

  Status sample(const SampleParams& p) override {
    expect(p.logits, DType::kF32, "sample logits");
    MX_CHECK_EQ(p.logits.rank(), 2);
    const int64_t rows = p.logits.dim(0), vocab = p.logits.dim(1);
    expect(p.params, DType::kU8, "sample params");
    MX_CHECK_EQ(p.params.bytes(), rows * static_cast<int64_t>(sizeof(SampleRowParams)));
    expect(p.tokens, DType::kI32, "sample tokens");
    MX_CHECK_EQ(p.tokens.numel(), rows);
    if (!p.logprobs.empty()) {
      expect(p.logprobs, DType::kF32, "sample logprobs");
      MX_CHECK_EQ(p.logprobs.numel(), rows);
    }
    MX_CHECK_EQ(p.token_mask.empty(), p.mask_rows.empty());
    if (!p.token_mask.empty()) {
      expect(p.token_mask, DType::kI32, "sample token mask");
      expect(p.mask_rows, DType::kI32, "sample mask rows");
      MX_CHECK_EQ(p.token_mask.numel(), rows * sampling::mask_words(vocab));
      MX_CHECK_EQ(p.mask_rows.numel(), rows);
      MX_RETURN_IF_ERROR(launch_apply_token_mask(ptr<float>(p.logits), rows, vocab, ptr<const uint32_t>(p.token_mask),
                                                 ptr<const int32_t>(p.mask_rows), stream()));
    }
    const int64_t bytes = sample_scratch_bytes(rows, vocab);
    MX_RETURN_IF_ERROR(ensure(scratch_.sampling, bytes, "sampling"));
    SampleKernelParams k;
    k.logits = ptr<const float>(p.logits);
    k.params = ptr<const SampleRowParams>(p.params);
    k.tokens = ptr<int32_t>(p.tokens);
    k.logprobs = p.logprobs.empty() ? nullptr : ptr<float>(p.logprobs);
    k.scratch = scratch_.sampling.data();
    k.scratch_bytes = scratch_.sampling.bytes();
    k.rows = rows;
    k.vocab = vocab;
    return launch_sample(k, stream());
  }

  Status prepare(const WorkspaceSpec& s) override {
    // The side stream (begin_side) before any capture: a workspace's first few-token step may be a graph capture
    // (a process whose eager steps so far were all longer than CudaSideStreamOptions::max_tokens).
    if (!side_stream_ && !capturing_ && options_.side_stream.max_tokens > 0) MX_RETURN_IF_ERROR(make_side_stream());
    if (load_seconds_.repack + load_seconds_.copies > 0) {  // the model's upload has ended: where its experts' went
      MX_LOG(Info) << "MXFP4 experts uploaded: " << load_seconds_.repack << " s checking and repacking on the host, "
                   << load_seconds_.copies << " s copying" << (pinned_staging_ ? " (pinned)" : " (pageable)");
      load_seconds_ = {};
    }
    pinned_staging_.reset();
    pageable_staging_.reset();
    staging_bytes_ = 0;
    if (s.max_sample_rows > 0 && s.vocab > 0)
      MX_RETURN_IF_ERROR(ensure(scratch_.sampling, sample_scratch_bytes(s.max_sample_rows, s.vocab), "sampling"));
    const int64_t slots = s.max_tokens * s.top_k;
    // The warp-specialized wgmma kernel, where it would run, pads every routing tile (of at most 256 tokens); the
    // 16-token tiles on the copy engine (any call of up to `slots`) pad theirs to 16.
    const MoeWgmmaConfig cw =
        choose_moe_wgmma_config(dev_, slots, s.num_experts, 0, 0, options_.moe.wgmma_warp_specialized);
    const bool tiled = cw.enabled && cw.warp_specialized;
    const bool bulk = cw.enabled && moe_wgmma_bulk_form() >= 1;
    int64_t moe_rows = tiled ? std::max(slots, moe_max_tiles(slots, s.num_experts, 256) * 256) : slots;
    if (bulk) moe_rows = std::max(moe_rows, moe_max_tiles(slots, s.num_experts, 16) * 16);
    if (options_.moe.wgmma_bulk == 1) moe_rows = std::max(moe_rows, moe_max_tiles(slots, s.num_experts, 32) * 32);
    // The 96-token tiles on the copy engine pad theirs to 96, at most at the mid width's tokens per expert (where
    // forced at more, the call sizes its scratch itself, before any capture).
    if (cw.enabled && moe_wgmma_bulk_mid()) {
      const int64_t mid_slots = std::min(slots, kMoeWgmmaMidWidthMaxTokensPerExpert * s.num_experts);
      moe_rows = std::max(moe_rows, moe_max_tiles(mid_slots, s.num_experts, 96) * 96);
    }
    // The 96-token tiles at 96/48 columns on the copy engine pad theirs to 96 (at any tokens).
    if (cw.enabled && moe_wgmma_bulk_full(slots, s.num_experts)) moe_rows = std::max(moe_rows, moe_max_tiles(slots, s.num_experts, 96) * 96);
    // The 256-token tiles on the copy engine pad theirs to 256, where the workspace's largest step has them (>= 512
    // tokens per expert: no fewer tokens have them unless forced).
    if (cw.enabled && cw.tile_tokens == 256 && !cw.persistent && moe_wgmma_bulk_wide())
      moe_rows = std::max(moe_rows, moe_max_tiles(slots, s.num_experts, 256) * 256);
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_h, moe_rows * s.intermediate * 2, "MoE h"));
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_y, moe_rows * s.hidden * 2, "MoE y"));
    const int64_t max_tiles = moe_max_tiles(slots, s.num_experts, 8);
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_meta, ((s.num_experts + 1) + 2 * slots + 3 * max_tiles + 1) * 4, "MoE routing"));
    MX_RETURN_IF_ERROR(ensure(scratch_.tickets, kFusedRouterMaxTokens * 4, "router tickets", true));
    MX_RETURN_IF_ERROR(ensure(scratch_.moe_tickets, (s.hidden + 15) / 16 * 4, "MoE tickets", true));
    MX_RETURN_IF_ERROR(
        ensure(scratch_.gemma_router_tickets, gemma_router_tickets(s.max_tokens) * 4, "router tickets", true));
    // The fused bf16 experts' counters (Gemma-4 at a few tokens): a workspace's first fused step may be a capture.
    if (s.num_experts > 0)
      MX_RETURN_IF_ERROR(
          ensure(scratch_.moe_fused_counters, moe_bf16_fused_counters() * 4, "MoE fused counters", /*zero=*/true));
    if (router_cluster_ctas_ < 0) router_cluster_ctas_ = gemma_router_cluster_ctas();  // host queries: not in a capture
    if (router_split_ctas_ < 0) router_split_ctas_ = gemma_router_split_ctas();
    MX_RETURN_IF_ERROR(ensure_linear_scratch());
    if (fp8_slab_bytes_ > 0) MX_RETURN_IF_ERROR(ensure(scratch_.dense_fp8, fp8_slab_bytes_, "FP8 dense slab"));
    // Decode splits shrink as the batch grows: tokens * splits <= tokens + 3 * SMs (kernel_configs.cc).
    MX_RETURN_IF_ERROR(ensure(scratch_.partials, (s.max_tokens + 3 * dev_.sm_count + 1) * s.n_q * (s.head_dim + 2) * 4,
                              "attention partials"));
    return Status::ok();
  }

  Result<std::unique_ptr<ReplayGraph>> capture(const std::function<Status()>& body) override {
    MX_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_.get(), cudaStreamCaptureModeThreadLocal));
    capturing_ = true;
    const Status st = body();
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_.get(), &graph);
    CudaGraph graph_owner(graph);
    MX_RETURN_IF_ERROR(st.with_context("graph capture"));
    MX_CUDA_RETURN_IF_ERROR(end);
    cudaGraphExec_t exec = nullptr;
    MX_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
    return std::unique_ptr<ReplayGraph>(new CudaReplayGraph(CudaGraphExec(exec), stream_.get()));
  }

 private:
  CudaBackend() = default;

  template <typename T>
  static T* ptr_of(const Buffer& b) {
    return static_cast<T*>(b.data());
  }

  // The skinny kernel on `s`'s weights (bf16 w, or e4m3 w_fp8 with w_scale; n x k): x, bias, out and the
  // shapes filled in here, and the k-split scratch when the chosen config splits k.
  Status run_skinny_linear(SkinnyLinearParams s, const TensorView& x, const TensorView& bias, TensorView out,
                           int64_t n, int64_t k) {
    const CudaSkinnyLinearOptions& so = options_.skinny_linear;
    s.x = ptr<const uint16_t>(x);
    s.bias = bias.empty() ? nullptr : ptr<const uint16_t>(bias);
    s.out = out.data();
    s.m = x.numel() / k, s.n = n, s.k = k;
    s.out_f32 = out.dtype() == DType::kF32;
    s.inputs_first = so.inputs_first;
    // FP8 weights keep 16-row strips unless forced or fp8_even_strips (narrower ones were slower at o_proj alone).
    const int strip_rows = so.strip_rows > 0 ? so.strip_rows : s.w_fp8 != nullptr && !so.fp8_even_strips ? 16 : 0;
    SkinnyLinearConfig c = choose_skinny_linear_config(dev_, s.m, n, k, so.k_splits, so.chunks_in_flight, strip_rows);
    c.persistent = so.persistent;
    if (c.k_splits > 1) {
      MX_RETURN_IF_ERROR(ensure_linear_scratch());
      s.partials = ptr_of<float>(scratch_.linear_partials);
      s.tickets = ptr_of<uint32_t>(scratch_.linear_tickets);
    }
    const bool fp8 = s.w_fp8 != nullptr;
    const bool aligned = reinterpret_cast<uintptr_t>(fp8 ? static_cast<const void*>(s.w_fp8) : s.w) % 16 == 0;
    if (const int ctas = aligned ? staged_ctas(s.m, n, k, fp8) : 0; ctas > 0)
      return launch_skinny_linear_staged(s, c.strip_rows, stream(), ctas);
    return launch_skinny_linear(s, c, stream());
  }

  // Backend::begin_side's second stream and its fork and join events.
  Status make_side_stream() {
    cudaStream_t s = nullptr;
    MX_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    side_stream_ = CudaStream(s);
    for (CudaEvent* e : {&fork_event_, &join_event_}) {
      cudaEvent_t ev = nullptr;
      MX_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      *e = CudaEvent(ev);
    }
    return Status::ok();
  }

  // Whether run_skinny_linear takes the staged form for m x k times weights k x n (bf16, or FP8 with
  // CudaSkinnyLinearOptions::fp8_staged), and at how many CTAs an SM (0: not staged): where it fits in one wave, or in
  // up to CudaSkinnyLinearOptions::staged_waves waves the last of which is at least a third full, on Hopper
  // (measured there only; sm_100 would fit the same shapes); FP8 strips past kSkinnyLinearManyWaves waves (the
  // lm_head) at up to fp8_staged_head_rows tokens too, at skinny_linear_staged_head_ctas' CTAs an SM.
  int staged_ctas(int64_t m, int64_t n, int64_t k, bool fp8) const {
    const CudaSkinnyLinearOptions& so = options_.skinny_linear;
    const bool head = fp8 && m <= so.fp8_staged_head_rows;
    if (!so.staged || dev_.sm_major != 9 || (fp8 && !so.fp8_staged && !head)) return 0;
    // FP8 weights keep 16-row strips unless forced or fp8_even_strips (as run_skinny_linear).
    const int strip_rows = so.strip_rows > 0 ? so.strip_rows : fp8 && !so.fp8_even_strips ? 16 : 0;
    const SkinnyLinearConfig c = choose_skinny_linear_config(dev_, m, n, k, so.k_splits, so.chunks_in_flight, strip_rows);
    if (c.k_splits != 1 || c.n_tiles != 1) return 0;
    const int elem_bytes = fp8 ? 1 : 2;
    if (head && !skinny_linear_staged_fits(dev_, m, n, k, c.strip_rows, elem_bytes) &&
        (n + 15) / 16 >= kSkinnyLinearManyWaves * kSkinnyLinearCtasPerSm * dev_.sm_count)
      return skinny_linear_staged_head_ctas(dev_, m, k, c.strip_rows, elem_bytes);
    if (fp8 && !so.fp8_staged) return 0;
    // skinny_linear_staged_fits counts one wave of resident CTAs on dev.sm_count SMs: `waves` waves, scaled.
    auto fits = [&](int64_t sms) {
      DeviceInfo d = dev_;
      d.sm_count = static_cast<int>(sms);
      return skinny_linear_staged_fits(d, m, n, k, c.strip_rows, elem_bytes);
    };
    for (int64_t waves = 1; waves <= std::max(1, so.staged_waves); ++waves) {
      if (fits(waves * dev_.sm_count))
        return waves == 1 || !fits((waves - 1) * dev_.sm_count + dev_.sm_count / 3) ? kSkinnyLinearCtasPerSm : 0;
    }
    return 0;
  }

  // The skinny linear's k-split partials and per-strip tickets (fixed size, kernel_configs.h).
  Status ensure_linear_scratch() {
    MX_RETURN_IF_ERROR(ensure(scratch_.linear_partials, kSkinnyLinearPartialFloats * 4, "linear partials"));
    return ensure(scratch_.linear_tickets, kSkinnyLinearMaxSplitStrips * 4, "linear tickets", /*zero=*/true);
  }

  // Grows a scratch buffer outside capture; inside capture a too-small buffer is an error (prepare() sizes it).
  Status ensure(Buffer& b, int64_t bytes, const char* what, bool zero = false) {
    if (b.bytes() >= bytes && b.data()) return Status::ok();
    if (capturing_)
      return internal_error(std::string(what) + " scratch too small inside graph capture: call prepare() first");
    MX_RETURN_IF_ERROR(synchronize());  // both streams: the old buffer may be in use on either
    b = Buffer();
    MX_ASSIGN_OR_RETURN(b, allocate(bytes));
    if (zero) MX_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b.data(), 0, static_cast<size_t>(bytes), stream()));
    return Status::ok();
  }

  int device_ = 0;
  int64_t fp8_slab_bytes_ = 0;  // the largest slab an uploaded FP8 weight needs
  // The experts' repack destination while a model loads: pinned, so that its copies run at the bus's rate (pageable
  // ones went through the driver's staging at ~7 GB/s on an H200 host, W1 of session 20), grown to the largest matrix
  // and reused layer after layer; prepare() frees it. Pageable where pinning fails.
  struct FreeHost {
    void operator()(void* p) const { cudaFreeHost(p); }
  };
  std::unique_ptr<void, FreeHost> pinned_staging_;
  std::unique_ptr<uint8_t[]> pageable_staging_;
  size_t staging_bytes_ = 0;
  struct {
    double repack = 0, copies = 0;  // upload_experts' seconds: checked and repacked on the host, then copied
  } load_seconds_;
  const uint16_t* q_rope_source_ = nullptr;  // CudaRopeOptions::q_in_attention false: the qkv whose Q is in scratch
  DeviceInfo dev_;
  CudaBackendOptions options_;
  int router_cluster_ctas_ = -1;  // gemma_router_cluster_ctas() on this device, asked at the first decode router
  int router_split_ctas_ = -1;   // gemma_router_split_ctas() on this device, asked once as the one above
  CudaStream stream_;
  // Backend::begin_side's second stream and its fork and join events (made at the first side group).
  CudaStream side_stream_;
  CudaEvent fork_event_, join_event_;
  bool side_open_ = false, side_pending_ = false;  // between begin_side and end_side; between that and join_side
  // The stream an op launches on: the side stream inside a side group, else the main one.
  cudaStream_t stream() const { return side_open_ ? side_stream_.get() : stream_.get(); }
  std::unique_ptr<LtLinear> lt_;
  Scratch scratch_;
  bool capturing_ = false;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const CudaBackendOptions& options) {
  return CudaBackend::create(device, options);
}

namespace {

Result<CudaBackendOptions*> cuda_options_of(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) return invalid_argument("CUDA kernel options are for the CUDA backend, not " + backend.name());
  return &cuda->options();
}

// One group of a CUDA backend's options replaced (the set_cuda_*_options below).
template <typename Group>
Status set_option_group(Backend& backend, Group CudaBackendOptions::*group, const Group& value) {
  MX_ASSIGN_OR_RETURN(CudaBackendOptions * options, cuda_options_of(backend));
  options->*group = value;
  return Status::ok();
}

}  // namespace

Status set_cuda_moe_options(Backend& backend, const CudaMoeOptions& moe) {
  return set_option_group(backend, &CudaBackendOptions::moe, moe);
}

Result<CudaMoeOptions> cuda_moe_options(Backend& backend) {
  MX_ASSIGN_OR_RETURN(CudaBackendOptions * options, cuda_options_of(backend));
  return options->moe;
}

Result<CudaPlacement> cuda_placement(Backend& backend) {
  // Through decorators (profiling, probes) to the CUDA backend they wrap.
  if (auto* wrapper = dynamic_cast<ForwardingBackend*>(&backend)) return cuda_placement(wrapper->inner());
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) return invalid_argument("not a CUDA backend: " + backend.name());
  return cuda->placement();
}

Status set_cuda_skinny_linear_options(Backend& backend, const CudaSkinnyLinearOptions& skinny) {
  return set_option_group(backend, &CudaBackendOptions::skinny_linear, skinny);
}

Result<CudaSkinnyLinearOptions> cuda_skinny_linear_options(Backend& backend) {
  MX_ASSIGN_OR_RETURN(CudaBackendOptions * options, cuda_options_of(backend));
  return options->skinny_linear;
}

Status set_cuda_attention_options(Backend& backend, const CudaAttentionOptions& attention) {
  return set_option_group(backend, &CudaBackendOptions::attention, attention);
}

Status set_cuda_bf16_experts_options(Backend& backend, const CudaBf16ExpertsOptions& bf16_experts) {
  return set_option_group(backend, &CudaBackendOptions::bf16_experts, bf16_experts);
}

Status set_cuda_gemma_router_options(Backend& backend, const CudaGemmaRouterOptions& gemma_router) {
  return set_option_group(backend, &CudaBackendOptions::gemma_router, gemma_router);
}

Status set_cuda_side_stream_options(Backend& backend, const CudaSideStreamOptions& side_stream) {
  return set_option_group(backend, &CudaBackendOptions::side_stream, side_stream);
}

Status set_cuda_l2_prefetch_options(Backend& backend, const CudaL2PrefetchOptions& l2_prefetch) {
  return set_option_group(backend, &CudaBackendOptions::l2_prefetch, l2_prefetch);
}

Status set_cuda_rope_options(Backend& backend, const CudaRopeOptions& rope) {
  return set_option_group(backend, &CudaBackendOptions::rope, rope);
}

Status set_cuda_gemma_row_options(Backend& backend, const CudaGemmaRowOptions& gemma_rows) {
  return set_option_group(backend, &CudaBackendOptions::gemma_rows, gemma_rows);
}

}  // namespace mx
