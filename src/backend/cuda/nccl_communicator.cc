#include "backend/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/all_reduce.h"

namespace mx {
namespace {

// The NCCL entry points mxserve uses, from the library found at run time.
struct NcclLibrary {
  void* handle = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;

  static Result<const NcclLibrary*> get() {
    static const Result<NcclLibrary> lib = load();
    if (!lib.is_ok()) return lib.status();
    return &*lib;
  }

 private:
  static Result<NcclLibrary> load() {
    NcclLibrary l;
    l.handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!l.handle)
      return unimplemented(std::string("tensor parallel on CUDA needs NCCL (libnccl.so.2 on the library path): ") + dlerror());
    auto sym = [&](const char* name) { return dlsym(l.handle, name); };
    l.comm_init_all = reinterpret_cast<decltype(l.comm_init_all)>(sym("ncclCommInitAll"));
    l.comm_destroy = reinterpret_cast<decltype(l.comm_destroy)>(sym("ncclCommDestroy"));
    l.comm_abort = reinterpret_cast<decltype(l.comm_abort)>(sym("ncclCommAbort"));
    l.all_reduce = reinterpret_cast<decltype(l.all_reduce)>(sym("ncclAllReduce"));
    l.all_gather = reinterpret_cast<decltype(l.all_gather)>(sym("ncclAllGather"));
    l.error_string = reinterpret_cast<decltype(l.error_string)>(sym("ncclGetErrorString"));
    if (!l.comm_init_all || !l.comm_destroy || !l.comm_abort || !l.all_reduce || !l.all_gather || !l.error_string)
      return unimplemented("libnccl.so.2 lacks the entry points mxserve needs (NCCL 2.x)");
    return l;
  }
};

Status nccl_status(const NcclLibrary& lib, ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::ok();
  return internal_error(std::string(what) + ": " + lib.error_string(r));
}

// The one-shot all-reduce's exchange on every rank's device (kernels/all_reduce.h) and the host-mapped word
// its kernels poll to learn that the group aborted. Made only where every rank can reach every other's memory.
class PeerExchange {
 public:
  static Result<std::unique_ptr<PeerExchange>> make(const std::vector<int>& devices) {
    std::unique_ptr<PeerExchange> x(new PeerExchange());
    const auto ranks = static_cast<int64_t>(devices.size());
    const int64_t slot_bytes = 2 * ranks * cuda::kOneShotSlotBytes;
    const int64_t flag_bytes = cuda::kOneShotMaxBlocks * ranks * static_cast<int64_t>(sizeof(uint64_t));
    MX_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&x->abort_), sizeof(int),
                                          cudaHostAllocMapped | cudaHostAllocPortable));
    *x->abort_ = 0;
    for (int d : devices) {
      MX_CUDA_RETURN_IF_ERROR(cudaSetDevice(d));
      x->devices_.push_back(d);
      void* slots = nullptr;
      void* flags = nullptr;
      void* state = nullptr;
      x->slots_.push_back(nullptr), x->flags_.push_back(nullptr), x->states_.push_back(nullptr);
      MX_CUDA_RETURN_IF_ERROR(cudaMalloc(&slots, static_cast<size_t>(slot_bytes)));
      x->slots_.back() = static_cast<uint8_t*>(slots);
      MX_CUDA_RETURN_IF_ERROR(cudaMalloc(&flags, static_cast<size_t>(flag_bytes)));
      x->flags_.back() = static_cast<uint64_t*>(flags);
      MX_CUDA_RETURN_IF_ERROR(cudaMalloc(&state, sizeof(cuda::OneShotState)));
      x->states_.back() = static_cast<cuda::OneShotState*>(state);
      MX_CUDA_RETURN_IF_ERROR(cudaMemset(flags, 0, static_cast<size_t>(flag_bytes)));
      MX_CUDA_RETURN_IF_ERROR(cudaMemset(state, 0, sizeof(cuda::OneShotState)));
      MX_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    }
    return x;
  }
  ~PeerExchange() {
    int current = 0;
    const bool restore = cudaGetDevice(&current) == cudaSuccess;
    for (size_t r = 0; r < devices_.size(); ++r) {
      cudaSetDevice(devices_[r]);
      cudaFree(slots_[r]), cudaFree(flags_[r]), cudaFree(states_[r]);
    }
    if (abort_) cudaFreeHost(abort_);
    if (restore) cudaSetDevice(current);
  }

  // The kernel's parameters for `rank`'s all-reduce of x.
  cuda::OneShotAllReduceParams params(int rank, const TensorView& x) const {
    cuda::OneShotAllReduceParams p;
    p.x = x.data();
    p.n = x.numel();
    p.bf16 = x.dtype() == DType::kBF16;
    p.rank = rank;
    p.ranks = static_cast<int>(devices_.size());
    for (size_t r = 0; r < devices_.size(); ++r) p.slots[r] = slots_[r], p.flags[r] = flags_[r];
    p.state = states_[static_cast<size_t>(rank)];
    p.abort = abort_;
    return p;
  }
  // Wakes every one-shot kernel waiting for a peer; they leave their outputs undefined.
  void abort() { __atomic_store_n(abort_, 1, __ATOMIC_SEQ_CST); }

 private:
  PeerExchange() = default;
  std::vector<int> devices_;
  std::vector<uint8_t*> slots_;              // [rank] u8 [2][ranks][kOneShotSlotBytes] on rank's device
  std::vector<uint64_t*> flags_;             // [rank] u64 [kOneShotMaxBlocks][ranks] on rank's device
  std::vector<cuda::OneShotState*> states_;  // [rank] on rank's device
  int* abort_ = nullptr;                     // host-mapped, readable from every device
};

// The NCCL communicators of one group and the one-shot exchange; destroyed when the last rank's communicator
// goes.
struct NcclGroup {
  const NcclLibrary* lib = nullptr;
  std::vector<ncclComm_t> comms;
  std::unique_ptr<PeerExchange> exchange;  // null where some rank cannot reach another's memory
  int64_t one_shot_max_bytes = 0;          // AllReduceOptions
  // Any rank's thread may abort while the others' threads run collectives (they read the flag), and two failing
  // ranks may abort at once: the lock makes the comms' ncclCommAbort, which frees each, run once. One abort
  // takes down every rank's comm.
  std::mutex abort_mutex;
  std::atomic<bool> aborted{false};
  ~NcclGroup() {
    if (aborted.load()) return;
    for (ncclComm_t c : comms)
      if (c) lib->comm_destroy(c);
  }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int rank, CudaPlacement where)
      : group_(std::move(group)), rank_(rank), where_(where) {}
  ~NcclCommunicator() override {
    for (void* p : gather_buffers_) cudaFree(p);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->comms.size()); }

  // Small messages one-shot over peer memory, the rest over NCCL (all_reduce_config.h): the same choice on every
  // rank, since every rank reduces the same shapes.
  Status all_reduce_sum(TensorView x) override {
    MX_RETURN_IF_ERROR(usable());
    ncclDataType_t type;
    if (x.dtype() == DType::kBF16) type = ncclBfloat16;
    else if (x.dtype() == DType::kF32) type = ncclFloat32;
    else return invalid_argument(std::string("all_reduce_sum of ") + dtype_name(x.dtype()));
    if (x.numel() == 0) return Status::ok();
    const int64_t bytes = dtype_bytes(x.dtype(), x.numel());
    if (cuda::use_one_shot_all_reduce(bytes, size(), group_->exchange != nullptr, group_->one_shot_max_bytes)) {
      MX_CUDA_RETURN_IF_ERROR(cudaSetDevice(where_.device));
      return cuda::launch_one_shot_all_reduce(group_->exchange->params(rank_, x), stream());
    }
    return nccl_status(*group_->lib,
                       group_->lib->all_reduce(x.data(), x.data(), static_cast<size_t>(x.numel()), type, ncclSum, comm(), stream()),
                       "ncclAllReduce");
  }

  // One kernel for both where the message goes one-shot and has at most kOneShotMaxNormRows rows the norm kernel
  // could take; the pair otherwise (same bits either way). The choice reads shapes only, never addresses: every
  // rank must launch the same kernel (a rank whose tensors the fused kernel cannot take fails, and the
  // tensor-parallel model's abort() frees the others).
  Status all_reduce_add_rms_norm(TensorView x, Backend& backend, TensorView residual, const TensorView& weight, float eps,
                                 TensorView out) override {
    MX_RETURN_IF_ERROR(usable());
    const int64_t hidden = residual.numel() > 0 ? residual.dim(-1) : 0;
    const bool fits = x.dtype() == DType::kBF16 && out.dtype() == DType::kBF16 && weight.dtype() == DType::kBF16 &&
                      (residual.dtype() == DType::kF32 || residual.dtype() == DType::kBF16) && hidden > 0 &&
                      hidden % 8 == 0 && hidden <= 8192 && weight.numel() == hidden && x.numel() == residual.numel() &&
                      out.numel() == residual.numel() && residual.numel() / hidden <= cuda::kOneShotMaxNormRows;
    if (!fits || !cuda::use_one_shot_all_reduce(x.bytes(), size(), group_->exchange != nullptr, group_->one_shot_max_bytes))
      return Communicator::all_reduce_add_rms_norm(x, backend, residual, weight, eps, out);
    cuda::OneShotAllReduceParams p = group_->exchange->params(rank_, x);
    p.norm.residual = residual.data();
    p.norm.residual_f32 = residual.dtype() == DType::kF32;
    p.norm.delta = x.ptr<const uint16_t>();
    p.norm.weight = weight.ptr<const uint16_t>();
    p.norm.out = out.ptr<uint16_t>();
    p.norm.rows = residual.numel() / hidden;
    p.norm.hidden = hidden;
    p.norm.eps = eps;
    MX_CUDA_RETURN_IF_ERROR(cudaSetDevice(where_.device));
    return cuda::launch_one_shot_all_reduce(p, stream());
  }

  // NCCL gathers equal blocks one after another: each rank's columns go out padded to the widest rank's
  // width, and each block lands in its columns of `out` with one strided copy.
  Status all_gather_columns(const TensorView& local, TensorView out) override {
    MX_RETURN_IF_ERROR(usable());
    if (local.dtype() != DType::kF32 || out.dtype() != DType::kF32 || local.shape().rank != 2 || out.shape().rank != 2)
      return invalid_argument("all_gather_columns takes f32 [R, n] blocks into f32 [R, N]");
    const int64_t rows = local.dim(0), total = out.dim(1), n = size();
    const auto [b0, b1] = split_range(total, rank_, static_cast<int>(n));
    if (out.dim(0) != rows || local.dim(1) != b1 - b0)
      return invalid_argument("all_gather_columns: this rank's block does not match its share of the columns");
    if (rows == 0) return Status::ok();
    const size_t block = gather_block(rows, total);
    MX_RETURN_IF_ERROR(reserve(block));
    cudaStream_t s = stream();
    const int64_t widest = split_range(total, 0, static_cast<int>(n)).second;
    MX_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(gather_in_, widest * sizeof(float), local.data(), local.dim(1) * sizeof(float),
                                              local.dim(1) * sizeof(float), rows, cudaMemcpyDeviceToDevice, s));
    MX_RETURN_IF_ERROR(nccl_status(*group_->lib, group_->lib->all_gather(gather_in_, gather_out_, block, ncclFloat32, comm(), s),
                                   "ncclAllGather"));
    for (int r = 0; r < n; ++r) {
      const auto [c0, c1] = split_range(total, r, static_cast<int>(n));
      MX_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(out.ptr<float>() + c0, total * sizeof(float),
                                                static_cast<float*>(gather_out_) + static_cast<size_t>(r) * block,
                                                widest * sizeof(float), (c1 - c0) * sizeof(float), rows,
                                                cudaMemcpyDeviceToDevice, s));
    }
    return Status::ok();
  }

  Status prepare_all_gather(int64_t rows, int64_t columns) override {
    if (rows <= 0 || columns <= 0) return Status::ok();
    return reserve(gather_block(rows, columns));
  }

  // NCCL cannot wake a rank whose GPU waits for a peer that never comes: the group is torn down instead,
  // and every later collective of it fails. One-shot kernels waiting for a peer see the exchange's abort word
  // and return.
  void abort() override {
    if (group_->exchange) group_->exchange->abort();
    const std::lock_guard<std::mutex> lock(group_->abort_mutex);
    if (group_->aborted.exchange(true)) return;
    for (ncclComm_t c : group_->comms)
      if (c) group_->lib->comm_abort(c);
  }

 private:
  ncclComm_t comm() const { return group_->comms[static_cast<size_t>(rank_)]; }
  cudaStream_t stream() const { return static_cast<cudaStream_t>(where_.stream); }
  Status usable() const {
    if (group_->aborted.load()) return internal_error(kTensorParallelAborted);
    return Status::ok();
  }
  // Floats of one rank's padded block when [rows, columns] are gathered: every block is the widest rank's.
  size_t gather_block(int64_t rows, int64_t columns) const {
    return static_cast<size_t>(rows * split_range(columns, 0, size()).second);
  }
  // Room for a gather of `block`-float blocks. Outgrown buffers are kept, not freed, until the communicator
  // goes: a graph captured earlier still reads and writes them (prepare_all_gather sizes them up front so
  // that this does not happen). Growing inside a capture is an error.
  Status reserve(size_t block) {
    if (block <= gather_block_) return Status::ok();
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MX_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream(), &capture));
    if (capture != cudaStreamCaptureStatusNone)
      return internal_error("all_gather_columns scratch too small inside graph capture: call prepare_all_gather first");
    void* in = nullptr;
    void* out = nullptr;
    MX_CUDA_RETURN_IF_ERROR(cudaMalloc(&in, block * sizeof(float)));
    gather_buffers_.push_back(in);
    MX_CUDA_RETURN_IF_ERROR(cudaMalloc(&out, block * static_cast<size_t>(size()) * sizeof(float)));
    gather_buffers_.push_back(out);
    gather_in_ = in, gather_out_ = out, gather_block_ = block;
    return Status::ok();
  }

  std::shared_ptr<NcclGroup> group_;
  const int rank_;
  const CudaPlacement where_;
  void* gather_in_ = nullptr;   // f32 [gather_block_]: this rank's padded block
  void* gather_out_ = nullptr;  // f32 [size, gather_block_]: every rank's
  size_t gather_block_ = 0;
  std::vector<void*> gather_buffers_;  // every buffer made, the outgrown ones included
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(const std::vector<Backend*>& ranks,
                                                                          const AllReduceOptions& options) {
  if (options.one_shot_max_bytes != cuda::kOneShotAutoMaxBytes &&
      (options.one_shot_max_bytes < 0 || options.one_shot_max_bytes > cuda::kOneShotSlotBytes))
    return invalid_argument("one_shot_max_bytes " + std::to_string(options.one_shot_max_bytes) + " is not in [0, " +
                            std::to_string(cuda::kOneShotSlotBytes) + "] (or automatic)");
  MX_ASSIGN_OR_RETURN(const NcclLibrary* lib, NcclLibrary::get());
  std::vector<CudaPlacement> where;
  std::vector<int> devices;
  for (Backend* b : ranks) {
    MX_ASSIGN_OR_RETURN(CudaPlacement p, cuda_placement(*b));
    for (int d : devices)
      if (d == p.device) return invalid_argument("two tensor-parallel ranks on CUDA device " + std::to_string(d));
    where.push_back(p);
    devices.push_back(p.device);
  }
  // Every rank's kernels read rank 0's staged batch (required); the one-shot all-reduce writes into every
  // rank's exchange (all pairs, else NCCL only).
  bool all_pairs = true;
  for (size_t r = 0; r < devices.size(); ++r) {
    MX_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[r]));
    for (size_t peer = 0; peer < devices.size(); ++peer) {
      if (peer == r) continue;
      int can = 0;
      MX_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, devices[r], devices[peer]));
      if (!can && peer == 0)
        return unimplemented("CUDA device " + std::to_string(devices[r]) + " cannot access device " +
                             std::to_string(devices[0]) + "'s memory (peer access), which tensor parallel needs");
      if (!can) {
        all_pairs = false;
        continue;
      }
      const cudaError_t e = cudaDeviceEnablePeerAccess(devices[peer], 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) MX_CUDA_RETURN_IF_ERROR(e);
      cudaGetLastError();
    }
  }
  std::unique_ptr<PeerExchange> exchange;
  if (all_pairs && devices.size() <= static_cast<size_t>(cuda::kOneShotMaxRanks) && options.one_shot_max_bytes != 0) {
    MX_ASSIGN_OR_RETURN(exchange, PeerExchange::make(devices));
  }
  MX_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[0]));
  // NVLink multicast (NVLS) stays off, whatever the environment says: on shared multi-GPU hosts a program using
  // it can put every GPU of the host out of service, and its buffers are device memory the KV plan does not see.
  // NCCL reads the variable when the communicators are made.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  auto group = std::make_shared<NcclGroup>();
  group->lib = lib;
  group->comms.assign(devices.size(), nullptr);
  group->exchange = std::move(exchange);
  group->one_shot_max_bytes = options.one_shot_max_bytes;
  MX_RETURN_IF_ERROR(nccl_status(*lib, lib->comm_init_all(group->comms.data(), static_cast<int>(devices.size()), devices.data()),
                                 "ncclCommInitAll"));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (size_t r = 0; r < devices.size(); ++r)
    comms.push_back(std::make_unique<NcclCommunicator>(group, static_cast<int>(r), where[r]));
  return comms;
}

}  // namespace mx
