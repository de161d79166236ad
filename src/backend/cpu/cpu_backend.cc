// The CPU backend: fp32 activations and KV cache, weights used in place from the checkpoint mmap.
// It is the reference implementation; speed matters only enough to keep tests quick.
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"

namespace mx {
namespace {

void free_host(void* p) { std::free(p); }

Status expect_host(const TensorView& t, const char* what) {
  if (t.device() != Device::kCpu) return internal_error(std::string(what) + " is not in host memory");
  return Status::ok();
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options) : pool_(options.num_threads) {}

  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }
  DType activation_dtype() const override { return DType::kF32; }
  DType kv_dtype() const override { return DType::kF32; }

  Result<Buffer> allocate(int64_t bytes) override {
    if (bytes < 0) return invalid_argument("negative allocation");
    const auto rounded = static_cast<size_t>((bytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) return resource_exhausted("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    return Buffer(p, bytes, Device::kCpu, free_host);
  }
  Status copy_from_host(TensorView dst, const void* src) override {
    std::memcpy(dst.data(), src, static_cast<size_t>(dst.bytes()));
    return Status::ok();
  }
  Status copy_to_host(void* dst, const TensorView& src) override {
    std::memcpy(dst, src.data(), static_cast<size_t>(src.bytes()));
    return Status::ok();
  }
  Status synchronize() override { return Status::ok(); }
  Status copy(TensorView dst, const TensorView& src) override {
    if (dst.bytes() != src.bytes()) return invalid_argument("copy: sizes differ");
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(src.bytes()));
    return Status::ok();
  }

  Result<TensorView> upload_weight(const TensorView& host, std::vector<Buffer>*) override {
    MX_RETURN_IF_ERROR(expect_host(host, "weight"));
    return host;
  }
  Result<ExpertWeights> upload_experts(const ExpertWeights& host, std::vector<Buffer>*) override {
    MX_RETURN_IF_ERROR(expect_host(host.w1_blocks, "expert weights"));
    return host;
  }

  Status embedding(const TensorView& table, const TensorView& token_ids, TensorView out) override {
    cpu::embedding(table, token_ids, out);
    return Status::ok();
  }
  Status rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView out) override {
    cpu::rms_norm(x, weight, eps, out);
    return Status::ok();
  }
  Status unit_rms_norm(const TensorView& x, float eps, TensorView out) override {
    cpu::rms_norm(x, TensorView{}, eps, out);
    return Status::ok();
  }
  Status soft_cap(TensorView x, float cap) override {
    if (!(cap > 0.0f)) return invalid_argument("soft_cap: cap must be > 0");
    cpu::soft_cap(x, cap);
    return Status::ok();
  }
  Status gelu_tanh_mul(const TensorView& gate, const TensorView& up, TensorView out) override {
    cpu::gelu_tanh_mul(gate, up, out);
    return Status::ok();
  }
  Status geglu(const TensorView& gate_up, TensorView out) override {
    if (gate_up.numel() != 2 * out.numel()) return invalid_argument("geglu: gate_up must hold twice out's values");
    cpu::geglu(gate_up, out);
    return Status::ok();
  }
  Status qkv_norms(const QkvNormParams& p) override {
    cpu::qkv_norms(p);
    return Status::ok();
  }
  Status moe_geglu_experts(const GegluMoeParams& p) override {
    cpu::moe_geglu_experts(pool_, p);
    return Status::ok();
  }
  Status silu_mul(const TensorView& gate, const TensorView& up, TensorView out) override {
    cpu::silu_mul(gate, up, out);
    return Status::ok();
  }
  Status convert(const TensorView& x, TensorView out) override {
    cpu::convert(x, out);
    return Status::ok();
  }
  Status scale_by(TensorView x, const TensorView& factor) override {
    cpu::scale_by(x, factor);
    return Status::ok();
  }
  Status gemma_attention_end(const GemmaAttentionEndParams& p) override {
    cpu::gemma_attention_end(p);
    return p.route ? router_topk(*p.route) : Status::ok();
  }
  Status gemma_layer_end(const GemmaLayerEndParams& p) override {
    cpu::gemma_layer_end(p);
    return Status::ok();
  }
  Status add_rms_norm(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                      TensorView out) override {
    cpu::add_rms_norm(residual, delta, weight, eps, out);
    return Status::ok();
  }
  Status linear(const TensorView& x, const TensorView& weight, const TensorView& bias, TensorView out) override {
    cpu::linear(pool_, x, weight, bias, out);
    return Status::ok();
  }
  Status linear_fp8(const TensorView& x, const TensorView& weight, const TensorView& scale, const TensorView& bias,
                    TensorView out) override {
    cpu::linear_fp8(pool_, x, weight, scale, bias, out);
    return Status::ok();
  }
  Status qkv_rope(const QkvRopeParams& p, const BatchView& batch) override {
    cpu::qkv_rope(p, batch);
    return Status::ok();
  }
  Status attention(const AttentionParams& p, const BatchView& batch) override {
    cpu::attention(pool_, p, batch);
    return Status::ok();
  }
  Status router_topk(const RouterParams& p) override {
    cpu::router_topk(p);
    return Status::ok();
  }
  Status moe_experts(const MoeParams& p) override {
    cpu::moe_experts(pool_, p);
    return Status::ok();
  }
  Status gather_rows(const TensorView& x, const TensorView& rows, TensorView out) override {
    cpu::gather_rows(x, rows, out);
    return Status::ok();
  }
  Status sample(const SampleParams& p) override {
    cpu::sample(pool_, p);
    return Status::ok();
  }

 private:
  cpu::ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace mx
