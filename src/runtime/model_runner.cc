// One step on the device: stage -> forward (graph replay or eager) -> sample on the device (ids back) or
// logits to host -> sample per request. A replayed step graph holds the sample op (its inputs go up first).
// Start-up: memory plan and graph capture (see model_runner.h).
#include "runtime/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "backend/cpu/sampling.h"
#include "backend/cpu/thread_pool.h"
#include "backend/sampling_math.h"
#include "core/log.h"

namespace mx {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// What a sampled entry's rows need from the host: their draws (penalties, a forced test output: the sample op makes
// neither), their top logprobs alone (the sample op's draws stand; the host ranks the logits), or nothing.
enum class HostNeed { kNone, kTopLogprobs, kDraw };
HostNeed host_need(const Request& r) {
  const SamplingParams& p = r.input.sampling;
  if (p.has_penalties() || !r.input.forced_tokens.empty()) return HostNeed::kDraw;
  return p.top_logprobs > 0 ? HostNeed::kTopLogprobs : HostNeed::kNone;
}

// Every entry computes `rows` tokens and samples from each (rows 1: decode; k + 1: verify k drafts), with
// no prompt logits.
bool is_uniform_step(const ScheduledBatch& batch, int64_t rows) {
  for (const ScheduledEntry& e : batch.entries)
    if (e.num_tokens != rows || e.num_draft != rows - 1 || !e.sample || e.all_logits) return false;
  return !batch.entries.empty();
}

// The most the memory plan's warm-up may take beyond what the backend's allocate() counts (see plan_kv_pool).
constexpr int64_t kUncountedWarmupBytes = 1ll << 30;

}  // namespace

// One captured forward pass: replays read the staging buffers, which stage() fills at the same addresses
// for every batch of `size` sequences of `rows` tokens each.
struct ModelRunner::StepGraph {
  int64_t size = 0;
  int64_t rows = 1;
  BatchView view;
  TensorView hidden;  // where a replay leaves the final hidden rows (the draft model reads them)
  std::unique_ptr<ReplayGraph> graph;
};

ModelRunner::ModelRunner(const Model& model, int64_t vocab) : model_(model) {
  samplers_.push_back(std::make_unique<Sampler>(vocab));
}
ModelRunner::~ModelRunner() = default;

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(const Model& model, EngineConfig* config,
                                                         std::unique_ptr<DraftModel> draft_model) {
  Backend& backend = model.backend();
  const int64_t vocab = model.dims().vocab_size;
  std::unique_ptr<ModelRunner> r(new ModelRunner(model, vocab));
  // What was in use before the runner allocated anything: the baseline of the memory plan.
  const bool plan = config->num_kv_pages == 0;
  DeviceMemory before;
  const int64_t owned_before = backend.allocated_bytes();
  if (plan) {
    auto mem = backend.memory_info();
    if (!mem.is_ok())
      return invalid_argument("the KV pool size cannot be planned on the " + backend.name() +
                              " backend (" + mem.status().message() + "); give --num-kv-pages");
    before = *mem;
  }
  // Logits rows: one sampled row per running request (1 + k when it verifies k drafts), plus the
  // prompt-logits rows a step may carry.
  const int64_t draft_rows = config->speculative.enabled() ? config->speculative.num_draft_tokens : 0;
  const int64_t rows = config->max_running_requests * (1 + draft_rows) + config->max_prompt_logit_rows;
  const int64_t max_tokens = config->max_num_batched_tokens;
  const BatchLimits limits{max_tokens, config->max_running_requests,
                           (config->max_model_len + config->page_size - 1) / config->page_size, rows,
                           model.kv_layout().num_groups(), config->whole_page_table_uploads};
  MX_ASSIGN_OR_RETURN(r->staging_, BatchStaging::create(backend, limits));
  MX_ASSIGN_OR_RETURN(r->ws_, model.make_workspace(max_tokens, rows));
  MX_ASSIGN_OR_RETURN(r->logits_device_, backend.allocate(rows * vocab * static_cast<int64_t>(sizeof(float))));
  r->max_logit_rows_ = rows;
  MX_ASSIGN_OR_RETURN(r->sample_params_device_, backend.allocate(rows * static_cast<int64_t>(sizeof(SampleRowParams))));
  MX_ASSIGN_OR_RETURN(r->sample_out_device_, backend.allocate(2 * rows * 4));
  r->sample_params_host_.resize(static_cast<size_t>(rows));
  r->sample_out_host_.resize(static_cast<size_t>(2 * rows));
  const int64_t mask_words = sampling::mask_words(vocab);
  MX_ASSIGN_OR_RETURN(r->token_mask_device_, backend.allocate(rows * mask_words * 4));
  MX_ASSIGN_OR_RETURN(r->mask_rows_device_, backend.allocate(rows * 4));
  r->token_mask_host_.assign(static_cast<size_t>(rows * mask_words), 0u);
  r->mask_rows_host_.assign(static_cast<size_t>(rows), 0);
  r->logits_host_.assign(static_cast<size_t>(rows * vocab), 0.0f);
  r->seqs_.reserve(static_cast<size_t>(config->max_running_requests));
  if (draft_model) {  // before the plan: its buffers count as activations
    const int64_t S = config->max_running_requests, k = config->speculative.num_draft_tokens;
    const BatchLimits draft_limits{S, S, limits.max_pages_per_seq, 1, limits.num_kv_groups, limits.whole_tables};
    MX_ASSIGN_OR_RETURN(r->draft_ws_, draft_model->make_workspace(S, max_tokens));
    r->target_observer_ = draft_model->target_observer(*r->draft_ws_);  // before the warm-up and the graphs
    MX_ASSIGN_OR_RETURN(r->draft_queries_, BatchStaging::create(backend, draft_limits));
    MX_ASSIGN_OR_RETURN(r->draft_rows_device_, backend.allocate(2 * S * 4));
    MX_ASSIGN_OR_RETURN(r->drafts_device_, backend.allocate(k * S * 4));
    r->draft_rows_host_.reserve(static_cast<size_t>(2 * S));
    r->draft_last_tokens_.reserve(static_cast<size_t>(S));  // the staged rows' token spans point into it
    r->drafts_host_.resize(static_cast<size_t>(k * S));
    r->draft_model_ = std::move(draft_model);
  }

  const bool graphs = config->enable_cuda_graphs && backend.can_capture();
  if (plan) MX_RETURN_IF_ERROR(r->plan_kv_pool(before, owned_before, graphs, config));
  // After the plan: an auto max-running-requests is only known from it.
  const std::vector<int64_t> sizes = graphs ? cuda_graph_batch_sizes(*config) : std::vector<int64_t>{};
  r->config_ = *config;
  if (r->draft_ws_ && config->speculative.draft_graphs) {  // graphs of its own for the same buckets it holds
    for (int64_t size : sizes)
      if (size <= r->draft_ws_->max_seqs) r->draft_ws_->graph_batch_sizes.push_back(size);
    r->draft_ws_->max_pages_per_seq = limits.max_pages_per_seq;
  }
  // Each layer group's pool; with graphs, its scratch page sits after the pool's pages: the page pools never
  // hand it out.
  const KvCacheShape shape{model.kv_layout(), config->page_size, config->kv_group_pages};
  KvCacheShape with_scratch = shape;
  r->scratch_rows_.clear();
  for (int64_t& pages : with_scratch.group_pages) {
    r->scratch_rows_.push_back({static_cast<int32_t>(pages)});
    pages += sizes.empty() ? 0 : 1;
  }
  MX_ASSIGN_OR_RETURN(r->kv_, model.allocate_kv_cache(with_scratch));
  r->startup_.kv_pages = config->num_kv_pages;
  r->startup_.kv_bytes = shape.bytes(backend.kv_dtype());
  r->verify_drafts_ = draft_rows;
  r->padding_tokens_.assign(static_cast<size_t>(1 + draft_rows), 0);
  r->padding_pages_.clear();
  for (const auto& row : r->scratch_rows_)
    r->padding_pages_.push_back(std::vector<int32_t>(static_cast<size_t>(draft_rows / config->page_size + 1), row[0]));
  if (!sizes.empty()) MX_RETURN_IF_ERROR(r->capture_graphs(sizes));
  return r;
}

Status ModelRunner::plan_kv_pool(const DeviceMemory& before, int64_t owned_before, bool graphs, EngineConfig* config) {
  Backend& b = model_.backend();
  const int64_t P = config->page_size;
  // Worst case: the whole token budget in one step, as few sequences as the context length allows, on a
  // throwaway pool just big enough. Backend scratch grows to its peak here too.
  const int64_t budget = config->max_num_batched_tokens;
  std::vector<int32_t> tokens(static_cast<size_t>(budget), 0);
  std::vector<int64_t> lengths;
  for (int64_t done = 0; done < budget && static_cast<int64_t>(lengths.size()) < config->max_running_requests;) {
    lengths.push_back(std::min(budget - done, config->max_model_len));
    done += lengths.back();
  }
  std::vector<std::vector<int32_t>> page_ids(lengths.size());
  int64_t next_page = 0, start = 0;
  seqs_.clear();
  for (size_t i = 0; i < lengths.size(); ++i) {
    page_ids[i].resize(static_cast<size_t>((lengths[i] + P - 1) / P));
    std::iota(page_ids[i].begin(), page_ids[i].end(), static_cast<int32_t>(next_page));
    next_page += static_cast<int64_t>(page_ids[i].size());
    seqs_.push_back({std::span<const int32_t>(tokens).subspan(static_cast<size_t>(start), static_cast<size_t>(lengths[i])),
                     0, page_ids[i], false, false});
    start += lengths[i];
  }
  int64_t temp_kv_bytes = 0, owned_after = -1;
  DeviceMemory after;
  {
    const KvCacheShape shape = KvCacheShape::uniform(model_.kv_layout(), next_page, P);
    MX_ASSIGN_OR_RETURN(KvCache temp, model_.allocate_kv_cache(shape));
    temp_kv_bytes = shape.bytes(b.kv_dtype()) / model_.kv_devices();  // the share on this device
    MX_ASSIGN_OR_RETURN(BatchView view, staging_.stage(seqs_));
    const TensorView logits = logits_device_.view(DType::kF32, {view.num_logit_rows, model_.dims().vocab_size});
    MX_RETURN_IF_ERROR(forward(view, temp, logits).with_context("memory-plan warm-up pass"));
    MX_RETURN_IF_ERROR(b.synchronize());
    MX_ASSIGN_OR_RETURN(after, b.memory_info());
    owned_after = b.allocated_bytes();
  }
  // The activations: what the device lost over the runner's buffers and the warm-up. Where the backend counts
  // its allocations, that loss is held between what this process allocated in that time and that plus
  // kUncountedWarmupBytes (kernels loaded on first launch, their local memory, library workspaces): another
  // process freeing or allocating memory meanwhile moves neither the pool nor the plan's failure.
  int64_t activation_bytes = before.free_bytes - after.free_bytes - temp_kv_bytes;
  if (owned_before >= 0 && owned_after >= 0) {
    const int64_t owned = owned_after - owned_before - temp_kv_bytes;
    const int64_t held = std::clamp(activation_bytes, owned, owned + kUncountedWarmupBytes);
    if (held != activation_bytes)
      MX_LOG(Info) << "memory plan: the device lost " << activation_bytes << " bytes in the warm-up and this process "
                   << "allocated " << owned << ": activations " << held << " (another process moved memory meanwhile)";
    activation_bytes = held;
  }
  auto inputs = [&] {
    KvMemoryInputs in = kv_memory_inputs(*config, model_.kv_layout(), b.kv_dtype(), model_.kv_devices());
    in.scratch_pages = graphs ? 1 : 0;
    in.device_bytes = before.total_bytes;
    in.weights_bytes = model_.device_weight_bytes();
    in.activation_bytes = std::max<int64_t>(0, activation_bytes);
    in.other_bytes = std::max<int64_t>(0, before.total_bytes - before.free_bytes - in.weights_bytes);
    return in;
  };
  KvMemoryInputs in = inputs();
  // The warm-up ran with buffers for the most requests; the batch is what the pool can hold (window groups'
  // pages shrink with it, so the plan is made again).
  if (config->auto_max_running_requests) {
    config->max_running_requests = auto_max_running_requests(in, *config);
    in = inputs();
  }
  MX_ASSIGN_OR_RETURN(KvMemoryPlan plan, plan_kv_memory(in));
  set_kv_pool_pages(config, plan.num_pages);
  startup_.planned = true;
  startup_.memory = in;
  startup_.plan = plan;
  MX_LOG(Info) << describe_kv_memory_plan(in, plan);
  if (const std::string split = model_.parallel_summary(); !split.empty()) {
    MX_LOG(Info) << "memory plan: " << split;
  }
  return Status::ok();
}

void ModelRunner::add_padding(int64_t size, int64_t rows) {
  const std::span<const int32_t> tokens = std::span<const int32_t>(padding_tokens_).first(static_cast<size_t>(rows));
  while (static_cast<int64_t>(seqs_.size()) < size)
    seqs_.push_back({tokens, 0, {}, rows > 1, false, rows > 1 ? padding_pages_ : scratch_rows_});
}

Result<std::vector<std::unique_ptr<ModelRunner::StepGraph>>> ModelRunner::capture_step_graphs(const std::vector<int64_t>& sizes,
                                                                                              int64_t rows) {
  Backend& b = model_.backend();
  std::vector<std::unique_ptr<StepGraph>> graphs;
  for (int64_t size : sizes) {
    seqs_.clear();
    add_padding(size, rows);
    MX_ASSIGN_OR_RETURN(BatchView view, staging_.stage(seqs_));
    const TensorView logits = logits_device_.view(DType::kF32, {view.num_logit_rows, model_.dims().vocab_size});
    // The step's sample op is part of the graph (its inputs go up before the replay, so nothing runs on the
    // host between the forward pass and sampling): every row's params, logprobs always, grammar masks
    // always (rows flagged 0 keep their logits).
    const SampleParams sample = graph_sample_params(logits);
    // An eager pass first: backend scratch and library plans are set up outside capture.
    MX_RETURN_IF_ERROR(forward(view, kv_, logits));
    const TensorView hidden = step_hidden_;
    MX_RETURN_IF_ERROR(b.sample(sample));
    // The body by value: a backend may keep it (a CPU test double replays it for real).
    MX_ASSIGN_OR_RETURN(auto graph, b.capture([this, view, logits, sample] {
      MX_RETURN_IF_ERROR(forward(view, kv_, logits));
      return model_.backend().sample(sample);
    }));
    graphs.push_back(std::make_unique<StepGraph>(StepGraph{size, rows, view, hidden, std::move(graph)}));
  }
  return graphs;
}

Status ModelRunner::capture_graphs(const std::vector<int64_t>& sizes) {
  Backend& b = model_.backend();
  const auto start = std::chrono::steady_clock::now();
  auto before = b.memory_info();
  // What the warm-up samples read: greedy params and no masks in every row.
  std::fill(sample_params_host_.begin(), sample_params_host_.end(), SampleRowParams{});
  std::fill(mask_rows_host_.begin(), mask_rows_host_.end(), 0);
  const int64_t rows = max_logit_rows_;
  MX_RETURN_IF_ERROR(b.copy_from_host(sample_params_device_.view(DType::kU8, {rows * static_cast<int64_t>(sizeof(SampleRowParams))}),
                                      sample_params_host_.data()));
  MX_RETURN_IF_ERROR(b.copy_from_host(mask_rows_device_.view(DType::kI32, {rows}), mask_rows_host_.data()));
  MX_ASSIGN_OR_RETURN(graphs_, capture_step_graphs(sizes, 1));
  // Verify steps of k = 1 .. K drafts (drafters may propose fewer than K: n-gram matches, the end of
  // max_tokens): the buckets whose k + 1 rows per sequence fit one step. A failed capture leaves
  // verification eager (slower, still correct) rather than failing start-up.
  for (int64_t k = 1; k <= verify_drafts_; ++k) {
    std::vector<int64_t> verify_sizes = sizes;
    std::erase_if(verify_sizes, [&](int64_t size) { return size * (1 + k) > config_.max_num_batched_tokens; });
    auto verify = capture_step_graphs(verify_sizes, 1 + k);
    if (!verify.is_ok()) {
      MX_LOG(Warning) << "verify steps run eagerly: their graph capture failed: " << verify.status().to_string();
      verify_graphs_.clear();
      startup_.verify_graph_batch_sizes.clear();
      startup_.verify_graphs = 0;
      break;
    }
    startup_.verify_graphs += static_cast<int64_t>(verify->size());
    verify_graphs_.push_back(std::move(*verify));
    if (k == verify_drafts_) startup_.verify_graph_batch_sizes = verify_sizes;
  }
  MX_RETURN_IF_ERROR(b.synchronize());
  startup_.graph_batch_sizes = sizes;
  startup_.capture_seconds = seconds_since(start);
  auto after = b.memory_info();
  if (before.is_ok() && after.is_ok()) startup_.graph_bytes = std::max<int64_t>(0, before->free_bytes - after->free_bytes);
  MX_LOG(Info) << "captured " << sizes.size() << " decode graphs (batch " << sizes.front() << ".." << sizes.back()
               << ") and " << startup_.verify_graphs << " verify graphs (1.." << verify_drafts_ << " drafts) in " << static_cast<int64_t>(startup_.capture_seconds * 1000) << " ms, "
               << mib(startup_.graph_bytes) << " of device memory";
  return Status::ok();
}

Status ModelRunner::forward(const BatchView& view, const KvCache& kv, const TensorView& logits) {
  MX_ASSIGN_OR_RETURN(const ForwardOutput out,
                      model_.forward(view, kv, *ws_, logits, target_observer_ ? &target_observer_ : nullptr));
  step_hidden_ = out.hidden;
  return Status::ok();
}

const ModelRunner::StepGraph* ModelRunner::graph_for(const ScheduledBatch& batch) const {
  const std::vector<std::unique_ptr<StepGraph>>* graphs = nullptr;
  const int64_t k = batch.entries.empty() ? 0 : batch.entries.front().num_draft;
  if (k == 0 && is_uniform_step(batch, 1)) graphs = &graphs_;
  else if (k > 0 && k <= static_cast<int64_t>(verify_graphs_.size()) && is_uniform_step(batch, 1 + k))
    graphs = &verify_graphs_[static_cast<size_t>(k - 1)];
  if (!graphs) return nullptr;
  const auto n = static_cast<int64_t>(batch.entries.size());
  for (const auto& g : *graphs)
    if (g->size >= n) return g.get();
  return nullptr;
}

ModelRunner::SampleRows ModelRunner::sample_rows(const ScheduledBatch& batch) const {
  bool op = false, host = false;  // rows the sample op can draw; rows that need the host
  for (const ScheduledEntry& e : batch.entries) {
    if (e.all_logits) return SampleRows::kHost;  // its rows come to the host, and the logits rows are not the samples
    if (!e.sample) continue;
    const HostNeed need = host_need(*e.request);
    op |= need != HostNeed::kDraw;
    host |= need != HostNeed::kNone;
  }
  if (!host) return SampleRows::kOp;
  return op && !whole_batch_host_sampling_ ? SampleRows::kSplit : SampleRows::kHost;
}

// The sample op's buffers for `logits`' rows (without prompt logits the logits rows are the sampling entries
// in order, then any padding rows): params, tokens then logprobs in sample_out_device_, grammar masks.
SampleParams ModelRunner::graph_sample_params(const TensorView& logits) const {
  const int64_t rows = logits.dim(0);
  const TensorView out = sample_out_device_.view(DType::kI32, {2 * rows});
  return SampleParams{logits, sample_params_device_.view(DType::kU8, {rows, static_cast<int64_t>(sizeof(SampleRowParams))}),
                      out.rows(0, rows), TensorView(out.rows(rows, 2 * rows).data(), DType::kF32, {rows}, out.device()),
                      token_mask_device_.view(DType::kI32, {rows, sampling::mask_words(logits.dim(1))}),
                      mask_rows_device_.view(DType::kI32, {rows})};
}

// Params of every sampled row (when `op`; else none are read) and, when `masked`, the masks; the device's
// mask flags are zeroed once after a masked step, so that a graph's sample op leaves later logits alone.
Status ModelRunner::upload_sample_inputs(const ScheduledBatch& batch, int64_t rows, bool op, bool masked) {
  Backend& b = model_.backend();
  if (rows < batch.num_samples) return internal_error("fewer logits rows than sampled entries");
  const SampleParams sp = graph_sample_params(logits_device_.view(DType::kF32, {rows, model_.dims().vocab_size}));
  if (op) {
    std::fill(sample_params_host_.begin(), sample_params_host_.begin() + rows, SampleRowParams{});
    int64_t k = 0;
    for (const ScheduledEntry& e : batch.entries)
      if (e.sample)
        for (int64_t i = 0; i <= e.num_draft; ++i)  // a verify row i takes the draw its token will have
          sample_params_host_[static_cast<size_t>(k++)] = sample_row_params(e.request->input.sampling, e.request->rng.ahead(static_cast<uint64_t>(i)));
    MX_RETURN_IF_ERROR(b.copy_from_host(sp.params, sample_params_host_.data()));
  }
  if (masked) {  // rows past the sampled entries (padding) keep flag 0
    MX_RETURN_IF_ERROR(b.copy_from_host(sp.token_mask, token_mask_host_.data()));
    MX_RETURN_IF_ERROR(b.copy_from_host(sp.mask_rows, mask_rows_host_.data()));
    device_mask_rows_ = std::max(device_mask_rows_, rows);
  } else if (device_mask_rows_ > 0) {
    const std::vector<int32_t> zeros(static_cast<size_t>(device_mask_rows_), 0);
    MX_RETURN_IF_ERROR(b.copy_from_host(mask_rows_device_.view(DType::kI32, {device_mask_rows_}), zeros.data()));
    device_mask_rows_ = 0;
  }
  return Status::ok();
}

Status ModelRunner::read_sampled(const ScheduledBatch& batch, int64_t rows, bool split, std::vector<SampledToken>* sampled) {
  const auto wait_start = std::chrono::steady_clock::now();
  MX_RETURN_IF_ERROR(model_.backend().copy_to_host(sample_out_host_.data(), sample_out_device_.view(DType::kI32, {2 * rows})));
  results_read_ = std::chrono::steady_clock::now();
  device_wait_seconds_ += std::chrono::duration<double>(*results_read_ - wait_start).count();
  sampled->resize(static_cast<size_t>(batch.num_samples));
  int64_t k = 0;
  for (const ScheduledEntry& e : batch.entries) {
    if (!e.sample) continue;
    for (int64_t i = 0; i <= e.num_draft; ++i, ++k) {
      SampledToken& t = (*sampled)[static_cast<size_t>(k)];
      t.token = sample_out_host_[static_cast<size_t>(k)];
      std::memcpy(&t.logprob, &sample_out_host_[static_cast<size_t>(rows + k)], sizeof(float));
      t.top.clear();
    }
    // A verify entry's draws are taken by the tokens it keeps; one the host draws for moves its stream there.
    if (e.num_draft == 0 && !(split && host_need(*e.request) == HostNeed::kDraw)) e.request->rng.advance();
  }
  ++sample_op_steps_;
  return Status::ok();
}

Status ModelRunner::execute(const ScheduledBatch& batch, std::vector<SampledToken>* sampled) {
  MX_RETURN_IF_ERROR(launch(batch));
  return complete(batch, sampled);
}

Status ModelRunner::complete(const ScheduledBatch& batch, std::vector<SampledToken>* sampled) {
  if (launched_rows_ >= 0) return read_sampled(batch, launched_rows_, false, sampled);
  sampled->swap(launched_sampled_);  // both keep their capacity
  return Status::ok();
}

// A step: stage -> forward (graph replay or eager) -> sample (device op, or logits to the host: prompt
// logits copied out, then each row sampled). Verification steps and grammar masks enter between these. The
// sample op's tokens are read back by complete(); a host-sampled step's are in launched_sampled_.
Status ModelRunner::launch(const ScheduledBatch& batch) {
  launched_rows_ = -1;
  MX_RETURN_IF_ERROR(prepare(batch));
  return launch_prepared(batch);
}

Status ModelRunner::prepare(const ScheduledBatch& batch) {
  prepared_.reset();
  if (step_observer_) step_observer_(batch);
  MX_ASSIGN_OR_RETURN(StagedStep step, stage_step(batch));
  prepared_ = std::move(step);
  return Status::ok();
}

Status ModelRunner::launch_prepared(const ScheduledBatch& batch) {
  launched_rows_ = -1;
  if (!prepared_) return internal_error("launch without a prepared step");
  const StagedStep step = *prepared_;
  prepared_.reset();
  std::vector<SampledToken>* sampled = &launched_sampled_;
  MX_RETURN_IF_ERROR(staging_.upload());
  MX_RETURN_IF_ERROR(copy_tokens_from_samples(batch, step.view));
  const int64_t rows = step.view.num_logit_rows;
  const TensorView logits = logits_device_.view(DType::kF32, {rows, model_.dims().vocab_size});
  last_sample_seconds_ = 0;
  const SampleRows how = rows > 0 ? sample_rows(batch) : SampleRows::kHost;
  const bool op = how != SampleRows::kHost;
  // A split step reads the sample op's tokens, then draws the host's rows from their logits (the op masked them in
  // place where their entries are constrained, as the host would), all before launch returns.
  auto finish_split = [&](bool masked) {
    ++split_sample_steps_;
    MX_RETURN_IF_ERROR(read_sampled(batch, rows, true, sampled));
    return sample_logits_on_host(batch, step, masked, true, sampled);
  };
  // A replayed step graph samples too (padding rows last: sampled greedily and ignored): its params and
  // masks go up before the replay and the tokens come back after it, with nothing on the host in between.
  // Steps sampled on the host replay it as well and read the logits (the graph's samples go unread).
  if (replay_ && step.graph && !profile_capture_) {
    const bool masked = op && fill_token_masks(batch);
    MX_RETURN_IF_ERROR(upload_sample_inputs(batch, rows, op, masked));
    count_idle_until_launch();
    MX_RETURN_IF_ERROR(run_forward(step, logits));
    if (!op) return sample_logits_on_host(batch, step, fill_token_masks(batch), false, sampled);
    ++graph_sampled_steps_;
    if (how == SampleRows::kSplit) return finish_split(masked);
    launched_rows_ = rows;  // the device is still running it: complete() reads the tokens
    return Status::ok();
  }
  count_idle_until_launch();
  MX_RETURN_IF_ERROR(run_forward(step, logits));
  // Grammar masks are computed here, while a device backend still runs the forward pass just launched.
  const bool masked = fill_token_masks(batch);
  if (!op) return sample_logits_on_host(batch, step, masked, false, sampled);
  MX_RETURN_IF_ERROR(upload_sample_inputs(batch, rows, true, masked));
  bool want_logprobs = false;
  for (const ScheduledEntry& e : batch.entries) want_logprobs |= e.sample && e.request->input.sampling.logprobs;
  SampleParams sp = graph_sample_params(logits);
  if (!want_logprobs) sp.logprobs = TensorView();
  if (!masked) sp.token_mask = sp.mask_rows = TensorView();
  MX_RETURN_IF_ERROR(model_.backend().sample(sp));
  if (how == SampleRows::kSplit) return finish_split(masked);
  launched_rows_ = rows;  // as a graph's: complete() reads them, and the next step may take them on the device
  return Status::ok();
}

// Entries of an overlapped step compute the previous step's samples, which never went through the host:
// device copies from its sample output into this step's token ids, one per run of consecutive rows.
Status ModelRunner::copy_tokens_from_samples(const ScheduledBatch& batch, const BatchView& view) {
  const TensorView samples = sample_out_device_.view(DType::kI32, {max_logit_rows_});
  int64_t t = 0;  // the entry's first token row
  bool copied = false;
  for (size_t i = 0; i < batch.entries.size();) {
    const ScheduledEntry& e = batch.entries[i];
    if (e.token_from_row < 0) {
      t += e.num_tokens;
      ++i;
      continue;
    }
    int64_t n = 1;
    while (i + n < batch.entries.size() && batch.entries[i + n].token_from_row == e.token_from_row + n) ++n;
    MX_RETURN_IF_ERROR(model_.backend().copy(view.token_ids.rows(t, t + n), samples.rows(e.token_from_row, e.token_from_row + n)));
    t += n;  // overlapped entries compute one token each
    i += static_cast<size_t>(n);
    copied = true;
  }
  // Tensor-parallel ranks read the batch from this backend's memory on their own streams: the ids must be
  // in place before any rank starts, as the synchronous uploads' are.
  return copied ? model_.backend().synchronize() : Status::ok();
}

void ModelRunner::count_idle_until_launch() {
  if (results_read_) idle_seconds_ += seconds_since(*results_read_);
  results_read_.reset();
}

// Host path: the real rows' logits to the host (padding rows come last and stay), prompt logits into their
// requests, then each row sampled. A split step's host rows come back in runs of consecutive entries, each to
// its own place in logits_host_.
Status ModelRunner::sample_logits_on_host(const ScheduledBatch& batch, const StagedStep& step, bool masked,
                                          bool host_only, std::vector<SampledToken>* sampled) {
  const int64_t vocab = model_.dims().vocab_size;
  const TensorView device = logits_device_.view(DType::kF32, {max_logit_rows_, vocab});
  auto copy_rows = [&](int64_t first, int64_t last) {
    return first < last ? model_.backend().copy_to_host(logits_host_.data() + first * vocab, device.rows(first, last))
                        : Status::ok();
  };
  const auto wait_start = std::chrono::steady_clock::now();
  if (!host_only) {
    MX_RETURN_IF_ERROR(copy_rows(0, step.view.num_logit_rows - step.padding_rows));
  } else {
    int64_t row = 0, first = 0;  // the run [first, row) waits to be copied
    for (const ScheduledEntry& e : batch.entries) {
      if (!e.sample || host_need(*e.request) == HostNeed::kNone) {
        MX_RETURN_IF_ERROR(copy_rows(first, row));
        first = row + e.logit_rows();
      }
      row += e.logit_rows();
    }
    MX_RETURN_IF_ERROR(copy_rows(first, row));
  }
  results_read_ = std::chrono::steady_clock::now();
  device_wait_seconds_ += std::chrono::duration<double>(*results_read_ - wait_start).count();
  const auto sample_start = std::chrono::steady_clock::now();
  copy_prompt_logits(batch);
  sample_on_host(batch, masked, host_only, sampled);
  last_sample_seconds_ = seconds_since(sample_start);
  return Status::ok();
}

Result<ModelRunner::StagedStep> ModelRunner::stage_step(const ScheduledBatch& batch) {
  seqs_.clear();
  for (const ScheduledEntry& e : batch.entries) {
    const Request& r = *e.request;
    BatchSequence s;
    // An overlapped entry's token is still on the device: a placeholder now, copy_tokens_from_samples later.
    static constexpr int32_t kPendingToken = 0;
    if (e.token_from_row >= 0) s.tokens = std::span<const int32_t>(&kPendingToken, 1);
    else if (e.num_draft > 0) s.tokens = std::span<const int32_t>(r.verify_tokens);
    else s.tokens = std::span<const int32_t>(r.tokens).subspan(static_cast<size_t>(e.start), static_cast<size_t>(e.num_tokens));
    s.start_position = e.start;
    s.group_pages = r.pages;
    s.all_logits = e.all_logits || e.num_draft > 0;
    s.no_logits = !e.all_logits && !e.sample;
    seqs_.push_back(s);
  }
  StagedStep step;
  step.graph = graph_for(batch);
  if (step.graph) {
    step.padding_rows = (step.graph->size - static_cast<int64_t>(seqs_.size())) * step.graph->rows;
    add_padding(step.graph->size, step.graph->rows);
    ++num_padded_steps_;
  }
  MX_ASSIGN_OR_RETURN(step.view, staging_.pack(seqs_));  // uploaded by launch_prepared
  if (step.view.num_logit_rows > max_logit_rows_) return internal_error("step needs more logits rows than allocated");
  return step;
}

Status ModelRunner::run_forward(const StagedStep& step, const TensorView& logits) {
  const StepGraph* graph = replay_ ? step.graph : nullptr;
  if (!graph) return forward(step.view, kv_, logits);
  if (profile_capture_) {
    MX_ASSIGN_OR_RETURN(const bool profiled, run_profiled(*graph, step.view, logits));
    if (profiled) return Status::ok();
  }
  const BatchView& view = step.view;
  const BatchView& g = graph->view;
  bool same_tables = view.num_kv_groups == g.num_kv_groups;
  for (int64_t k = 0; same_tables && k < view.num_kv_groups; ++k)
    same_tables = view.page_tables[k].data() == g.page_tables[k].data();
  if (view.token_ids.data() != g.token_ids.data() || !same_tables || view.logit_rows.data() != g.logit_rows.data() ||
      view.num_tokens != g.num_tokens)
    return internal_error("step staged away from its graph's buffers");
  MX_RETURN_IF_ERROR(graph->graph->replay());
  step_hidden_ = graph->hidden;
  ++num_graph_replays_;
  num_verify_replays_ += graph->rows > 1 ? 1 : 0;
  return Status::ok();
}

Status ModelRunner::draft(const ScheduledBatch& batch, const std::function<bool(const Request&)>& may_speculate) {
  if (!draft_model_) return Status::ok();
  const auto start = std::chrono::steady_clock::now();
  draft_requests_.clear();
  draft_rows_host_.clear();
  draft_last_tokens_.clear();
  DraftBatch& db = draft_batch_;
  db.drafting.clear();
  db.extend_only.clear();
  const bool own_kv = draft_model_->keeps_own_kv();
  // The row that produced each request's last token: the one at position num_computed - 1 (a verify entry's
  // last accepted row; a prefill's or decode's last row). A draft with KV of its own also gets every kept row
  // of each drafting request and the rows of prompt chunks that sample nothing.
  int64_t offset = 0;
  for (const ScheduledEntry& e : batch.entries) {
    Request* r = e.request;
    const int64_t row = r->num_computed - 1 - e.start;
    if (e.sample && row >= 0 && row < e.num_tokens && may_speculate(*r)) {
      draft_requests_.push_back(r);
      draft_rows_host_.push_back(static_cast<int32_t>(offset + row));
      draft_last_tokens_.push_back(r->tokens.back());
      if (own_kv) db.drafting.push_back({offset, row + 1, e.start, r->tokens, r->pages});
    } else if (own_kv && !e.sample && e.num_tokens > 0 && r->finish == FinishReason::kNone) {
      db.extend_only.push_back({offset, e.num_tokens, e.start, r->tokens, r->pages});
    }
    offset += e.num_tokens;
  }
  const auto S = static_cast<int64_t>(draft_requests_.size());
  if (S == 0 && db.extend_only.empty()) return Status::ok();
  draft_seqs_.clear();
  for (int64_t i = 0; i < S; ++i) {
    const Request& r = *draft_requests_[static_cast<size_t>(i)];
    draft_seqs_.push_back({std::span<const int32_t>(&draft_last_tokens_[static_cast<size_t>(i)], 1), r.num_computed, {},
                           false, true, r.pages});
  }
  Backend& b = model_.backend();
  db.num_seqs = S;
  if (S > 0 && !own_kv) {
    MX_ASSIGN_OR_RETURN(db.queries, draft_queries_.stage(draft_seqs_));
    // The context rows are the query rows one position back: the same views but the positions, which go up
    // behind the hidden rows in one copy (each upload synchronizes the stream; a second staging took five).
    for (const BatchSequence& s : draft_seqs_) draft_rows_host_.push_back(static_cast<int32_t>(s.start_position - 1));
    const TensorView rows = draft_rows_device_.view(DType::kI32, {2 * S});
    MX_RETURN_IF_ERROR(b.copy_from_host(rows, draft_rows_host_.data()));
    db.hidden_rows = rows.rows(0, S);
    db.context = db.queries;
    db.context.positions = rows.rows(S, 2 * S);
    db.context.max_position = db.queries.max_position - 1;
  }
  db.target_hidden = step_hidden_;
  const int64_t k = config_.speculative.num_draft_tokens;
  const TensorView drafts = drafts_device_.view(DType::kI32, {k, S});
  draft_ws_->host_drafts.clear();
  MX_RETURN_IF_ERROR(draft_model_->draft(db, kv_, *draft_ws_, k, drafts));
  if (static_cast<int64_t>(draft_ws_->host_drafts.size()) == k * S)
    std::copy(draft_ws_->host_drafts.begin(), draft_ws_->host_drafts.end(), drafts_host_.begin());
  else
    MX_RETURN_IF_ERROR(b.copy_to_host(drafts_host_.data(), drafts));
  for (int64_t i = 0; i < S; ++i) {
    Request& r = *draft_requests_[static_cast<size_t>(i)];
    r.draft_tokens.clear();
    for (int64_t j = 0; j < k; ++j) r.draft_tokens.push_back(drafts_host_[static_cast<size_t>(j * S + i)]);
    r.drafts_for_tokens = r.num_tokens();
  }
  last_draft_values_ = k * S;
  ++num_draft_calls_;
  draft_seconds_ += seconds_since(start);
  return Status::ok();
}

Result<bool> ModelRunner::run_profiled(const StepGraph& graph, const BatchView& view, const TensorView& logits) {
  // A failed profiling capture must not fail the step: report it and replay the engine's own graph.
  auto once = model_.backend().capture([&] { return forward(view, kv_, logits); });
  Status profiled = once.is_ok() ? (*once)->replay() : once.status();  // first launch of a fresh graph: upload costs
  if (profiled.is_ok()) profiled = (*once)->replay();                  // the measured one
  profile_status_ = profiled;
  profile_graph_ms_ = 0;
  if (!profiled.is_ok()) return false;
  // The engine's own graph between two marks: the baseline of the profiled graph's per-op marks.
  auto timer = model_.backend().make_timer(2);
  if (timer.is_ok()) {
    MX_RETURN_IF_ERROR((*timer)->mark(0));
    MX_RETURN_IF_ERROR(graph.graph->replay());
    MX_RETURN_IF_ERROR((*timer)->mark(1));
    MX_ASSIGN_OR_RETURN(auto ms, (*timer)->read(2));
    profile_graph_ms_ = ms[1];
  }
  return true;
}

// Rows are positions start .. start + n - 1 of an all_logits entry; the prompt's are kept, once
// (recomputation repeats them).
void ModelRunner::copy_prompt_logits(const ScheduledBatch& batch) {
  const int64_t vocab = model_.dims().vocab_size;
  int64_t row = 0;
  for (const ScheduledEntry& e : batch.entries) {
    Request& r = *e.request;
    if (!e.all_logits) {
      row += e.logit_rows();
      continue;
    }
    const int64_t first = std::max(e.start, r.prompt_logits_filled);
    const int64_t last = std::min(e.start + e.num_tokens, r.prompt_len);
    for (int64_t pos = first; pos < last; ++pos) {
      const float* src = logits_host_.data() + (row + pos - e.start) * vocab;
      std::copy(src, src + vocab, r.prompt_logits.begin() + pos * vocab);
    }
    r.prompt_logits_filled = std::max(r.prompt_logits_filled, last);
    row += e.num_tokens;
  }
}

bool ModelRunner::fill_token_masks(const ScheduledBatch& batch) {
  const int64_t words = sampling::mask_words(model_.dims().vocab_size);
  bool any = false;
  int64_t k = 0;
  for (const ScheduledEntry& e : batch.entries) {
    if (!e.sample) continue;
    const std::shared_ptr<TokenConstraint>& c = e.request->input.constraint;
    const bool on = c && c->fill_mask(token_mask_host_.data() + k * words, model_.dims().vocab_size);
    mask_rows_host_[static_cast<size_t>(k)] = on ? 1 : 0;
    any |= on;
    ++k;
    for (int64_t i = 0; i < e.num_draft; ++i) mask_rows_host_[static_cast<size_t>(k++)] = 0;  // unconstrained verify rows
  }
  if (any) std::fill(mask_rows_host_.begin() + k, mask_rows_host_.end(), 0);
  return any;
}

// Each row's token depends on its own logits, parameters and stream alone, so the rows are drawn on up to
// kHostSampleThreads threads in contiguous runs, a Sampler each: ~2-10 ms a row of gpt-oss's 201,088 logits, and a
// step whose rows all come to the host (prompt logits, or every sampled entry needs the host) otherwise draws them
// one after another.
void ModelRunner::sample_on_host(const ScheduledBatch& batch, bool masked, bool host_only,
                                 std::vector<SampledToken>* sampled) {
  constexpr int kHostSampleThreads = 8;
  const int64_t vocab = model_.dims().vocab_size;
  sampled->resize(static_cast<size_t>(batch.num_samples));
  host_rows_.clear();
  verify_outputs_.clear();
  verify_outputs_.reserve(batch.entries.size());  // the rows' spans point into them: no reallocation
  int64_t row = 0, k = 0;
  for (const ScheduledEntry& e : batch.entries) {
    Request& r = *e.request;
    row += e.logit_rows();
    if (!e.sample) continue;
    const HostNeed need = host_only ? host_need(r) : HostNeed::kDraw;
    if (need == HostNeed::kNone) {  // the sample op's rows
      k += 1 + e.num_draft;
      continue;
    }
    const std::span<const int32_t> prompt = std::span<const int32_t>(r.tokens).first(static_cast<size_t>(r.prompt_len));
    if (e.num_draft == 0) {
      HostRow h;
      h.logits = logits_host_.data() + (row - 1) * vocab;  // the entry's last row
      if (masked && mask_rows_host_[static_cast<size_t>(k)] != 0)
        h.mask = token_mask_host_.data() + k * sampling::mask_words(vocab);
      h.request = &r;
      h.penalties = PenaltyContext{prompt, r.generated()};
      h.rng = r.rng;
      h.decode = true;
      h.drawn = need == HostNeed::kTopLogprobs;
      h.out = &(*sampled)[static_cast<size_t>(k++)];
      host_rows_.push_back(h);
      continue;
    }
    // Verify rows (never constrained: the scheduler drafts for no request with a constraint): row i as if
    // drafts 0..i-1 were accepted (they are part of the output penalties see), with the draw its token will
    // have; the request's stream moves when the scheduler keeps tokens.
    const bool penalties = r.input.sampling.has_penalties();
    if (penalties) {
      verify_outputs_.emplace_back(r.generated().begin(), r.generated().end());
      verify_outputs_.back().insert(verify_outputs_.back().end(), r.verify_tokens.begin() + 1,
                                    r.verify_tokens.begin() + 1 + e.num_draft);
    }
    for (int64_t i = 0; i <= e.num_draft; ++i) {
      HostRow h;
      h.logits = logits_host_.data() + (row - 1 - e.num_draft + i) * vocab;
      h.request = &r;
      const std::span<const int32_t> output =
          penalties ? std::span<const int32_t>(verify_outputs_.back()).first(r.generated().size() + static_cast<size_t>(i))
                    : r.generated();
      h.penalties = PenaltyContext{prompt, output};
      h.rng = r.rng.ahead(static_cast<uint64_t>(i));
      h.drawn = need == HostNeed::kTopLogprobs;
      h.out = &(*sampled)[static_cast<size_t>(k++)];
      host_rows_.push_back(h);
    }
  }
  const auto rows = static_cast<int64_t>(host_rows_.size());
  int64_t threads = 1;
  if (rows > 0) {
    if (!host_pool_) {
      const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      host_pool_ = std::make_unique<cpu::ThreadPool>(std::min(kHostSampleThreads, hw));
    }
    threads = std::min<int64_t>(rows, host_pool_->num_threads());
    while (static_cast<int64_t>(samplers_.size()) < threads) samplers_.push_back(std::make_unique<Sampler>(vocab));
  }
  host_sample_threads_ = threads;
  // Run t of `threads` draws rows [t * rows / threads, (t + 1) * rows / threads) with samplers_[t].
  auto draw_runs = [&](int64_t first_run, int64_t last_run) {
    for (int64_t t = first_run; t < last_run; ++t) {
      Sampler& sampler = *samplers_[static_cast<size_t>(t)];
      for (int64_t i = t * rows / threads; i < (t + 1) * rows / threads; ++i) {
        HostRow& h = host_rows_[static_cast<size_t>(i)];
        if (h.mask) cpu::apply_token_mask(h.logits, vocab, h.mask);
        const SamplingParams& params = h.request->input.sampling;
        // A row alone spreads its logprobs' passes over the pool instead (fill_logprobs: the same values).
        cpu::ThreadPool* pool = threads == 1 ? host_pool_.get() : nullptr;
        if (h.drawn) {  // the sample op's token (and stream) stand
          if (params.logprobs) sampler.fill_logprobs(h.logits, params, pool, h.out);
          continue;
        }
        const size_t g = static_cast<size_t>(h.request->num_generated());
        if (h.decode && g < h.request->input.forced_tokens.size()) {
          // A test-only forced output replaces the draw (its stream moves as a draw's would); its logprob and the
          // alternatives are the model's, as the sampler reports them.
          h.out->token = h.request->input.forced_tokens[g];
          h.rng.advance();
          if (params.logprobs) sampler.fill_logprobs(h.logits, params, pool, h.out);
          continue;
        }
        sampler.sample(h.logits, params, h.penalties, h.rng, h.out, pool);
      }
    }
  };
  if (threads > 1) host_pool_->parallel_for(threads, 1, draw_runs);
  else draw_runs(0, 1);
  for (const HostRow& h : host_rows_)
    if (h.decode) h.request->rng = h.rng;
}

}  // namespace mx
