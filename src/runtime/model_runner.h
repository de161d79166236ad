// The model runner: turns a ScheduledBatch into one forward pass and samples the next tokens. It owns the
// device side of the engine (KV cache storage, batch staging, activation workspace, logits) sized once at
// start-up for the largest step, so running a step allocates nothing. It makes no policy decisions: what
// to run comes from the scheduler, how to sample from each request's own parameters.
//
// Start-up on a device (CUDA): staging and workspace first; then, when no --num-kv-pages was given, a
// worst-case warm-up pass on a throwaway pool measures activation memory and the KV pool is sized by
// plan_kv_memory; then the pool (plus one scratch page); then one graph per decode batch-size bucket and,
// when the engine speculates with up to K drafts, one verify graph per bucket and k = 1..K (k + 1 rows per
// sequence).
// A decode-only step of n requests is padded to the smallest bucket >= n with rows that read and write
// only the scratch page (their logits are ignored) and replays that bucket's graph; a verify-only step
// whose every entry verifies the same k drafts likewise, with padding sequences of k + 1 rows. A step graph
// ends with the backend's sample op over all its rows (params and grammar masks uploaded before the replay,
// ids and logprobs read after it: nothing runs on the host between forward pass and sampling). Mixed and
// prefill steps, verify steps whose entries carry different draft counts, and steps above the largest bucket run eagerly. Graph
// kernels take every size from the bucket or from device memory, never from the step (decode attention
// splits by page-table capacity; prefill attention, which verify rows take, by token count).
// Draft-model speculation (model/draft_model.h): after a step, draft() runs the draft model for the requests
// that will decode next, from the step's final hidden rows and the KV cache, and leaves k drafts in each
// (Request::draft_tokens) for the next schedule(). With SpeculativeConfig::draft_graphs (the default) the
// draft model gets the decode graph buckets (DraftWorkspace::graph_batch_sizes) and replays graphs of its
// own (EAGLE-3: its chain passes).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/kv_cache.h"
#include "model/draft_model.h"
#include "model/model.h"
#include "runtime/batch_staging.h"
#include "runtime/engine_config.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace mx::cpu {
class ThreadPool;
}  // namespace mx::cpu

namespace mx {

// What start-up measured, for the log and `mxserve bench latency`.
struct RunnerStartup {
  bool planned = false;       // the KV pool came from the memory plan
  KvMemoryInputs memory;      // planned only
  KvMemoryPlan plan;          // planned only
  int64_t kv_pages = 0;       // usable pages (the scratch page not counted)
  int64_t kv_bytes = 0;
  std::vector<int64_t> graph_batch_sizes;
  // Buckets with a verify graph for the configured k drafts per sequence (fewer drafts: these and any other
  // bucket whose rows fit a step).
  std::vector<int64_t> verify_graph_batch_sizes;
  int64_t verify_graphs = 0;  // verify graphs over every k
  double capture_seconds = 0;
  int64_t graph_bytes = 0;    // device memory the graphs and their warm-up took (0 where unknown)
};

class ModelRunner {
 public:
  // Fills config->num_kv_pages (and caps max_model_len) when the pool is planned here. `draft_model` (may be
  // null) drafts for draft-model speculation; its buffers are allocated before the pool is planned.
  static Result<std::unique_ptr<ModelRunner>> create(const Model& model, EngineConfig* config,
                                                     std::unique_ptr<DraftModel> draft_model = nullptr);
  ~ModelRunner();

  // Runs `batch` and writes one SampledToken per entry with `sample`, in entry order. Copies prompt logits
  // into the requests that asked for them.
  Status execute(const ScheduledBatch& batch, std::vector<SampledToken>* sampled);
  // execute() in two halves, for a caller with host work to do while the device computes: launch stages
  // `batch` and starts it (a replayed step graph, sample op included, is still running on return);
  // complete waits for its tokens. Steps that sample on the host or run eagerly do all their work in
  // launch. complete must follow launch with the same batch and no other call between.
  Status launch(const ScheduledBatch& batch);
  Status complete(const ScheduledBatch& batch, std::vector<SampledToken>* sampled);
  // launch() in two halves, for overlapped steps (EngineCore): prepare does the step's host work (its
  // inputs packed for upload) while the device still runs the previous step; launch_prepared uploads them
  // and starts it. Entries whose token is the previous step's sample (ScheduledEntry::token_from_row) get
  // it by a device copy from that step's sample output, so the previous step's complete() must come
  // between the two (before this step's sample op overwrites those samples).
  Status prepare(const ScheduledBatch& batch);
  Status launch_prepared(const ScheduledBatch& batch);
  // The launched step's samples are on the device until complete() reads them (the backend's sample op ran;
  // steps with host-sampled rows have theirs on the host): the next step can take its tokens from there.
  bool samples_on_device() const { return launched_rows_ >= 0; }

  bool has_draft_model() const { return draft_model_ != nullptr; }
  // After `batch` ran and the scheduler applied it: drafts for each of its sampled requests that
  // `may_speculate` (Scheduler::may_speculate) from the step's hidden rows. Requests without drafts decode
  // plainly; an error leaves them so.
  Status draft(const ScheduledBatch& batch, const std::function<bool(const Request&)>& may_speculate);
  int64_t num_draft_calls() const { return num_draft_calls_; }
  double draft_seconds() const { return draft_seconds_; }  // host wall time in draft() (device work included)
  // The last draft call's drafts, step-major [k, S] in the order of its sequences (tests check them).
  std::span<const int32_t> last_drafts() const { return {drafts_host_.data(), static_cast<size_t>(last_draft_values_)}; }

  // Off: decode steps are still padded to their bucket but run eagerly (op-by-op profiling; tests that
  // tell graph replay apart from padding). No effect without graphs.
  void set_graph_replay(bool on) { replay_ = on; }
  // Tests: called with each step's batch before its forward pass (which request owns which rows, e.g. to
  // attribute a recording backend's per-row records to request positions). Empty: none.
  void set_step_observer(std::function<void(const ScheduledBatch&)> observer) { step_observer_ = std::move(observer); }
  // Profiling: a decode step that would replay captures a one-off graph of its forward pass instead (with
  // whatever the backend records during capture, e.g. ProfilingBackend's timer marks) and replays it twice;
  // the second replay recomputes the same KV entries and logits, so the step's outcome is unchanged.
  void set_profile_capture(bool on) { profile_capture_ = on, profile_status_ = Status::ok(); }
  // Why the last profiling capture failed (the step then replayed the engine's graph), else ok.
  const Status& profile_status() const { return profile_status_; }
  // GPU milliseconds of the engine's own graph for the last profiled step (replayed once more between two
  // timer marks: the baseline the profiled graph's per-op marks are compared with); 0 when unknown.
  double profile_graph_ms() const { return profile_graph_ms_; }
  const RunnerStartup& startup() const { return startup_; }
  // Host time the last step spent sampling on the host (0 when the backend's sample op ran).
  double last_sample_seconds() const { return last_sample_seconds_; }
  // Host wall time spent waiting for steps' results to come back from the device, over all steps (the rest
  // of a step's time is host work while the device idles: the serving loop's overhead, per the engine's log).
  double device_wait_seconds() const { return device_wait_seconds_; }
  // Host wall time from each step's results reaching the host to the next step's launch: what the host did
  // while the device had nothing queued (the serving loop's overhead, per the engine's log), over all steps.
  double idle_seconds() const { return idle_seconds_; }
  bool profile_capture() const { return profile_capture_; }
  int64_t max_logit_rows() const { return max_logit_rows_; }
  int64_t sample_op_steps() const { return sample_op_steps_; }  // steps sampled by the backend's op
  // ... of which some rows were drawn on the host (penalties, top logprobs: SampleRows::kSplit)
  int64_t split_sample_steps() const { return split_sample_steps_; }
  // The form before 2026-11-29 (bench latency's comparison): one row that needs the host sampler takes every row of
  // its step to the host.
  void set_whole_batch_host_sampling(bool on) { whole_batch_host_sampling_ = on; }
  // Threads the last host-sampled step's rows were spread over (sample_on_host; 0 before any).
  int64_t host_sample_threads() const { return host_sample_threads_; }
  int64_t graph_sampled_steps() const { return graph_sampled_steps_; }  // ... of which inside a step graph
  int64_t num_graph_replays() const { return num_graph_replays_; }  // decode and verify graphs
  int64_t num_verify_replays() const { return num_verify_replays_; }
  int64_t num_padded_steps() const { return num_padded_steps_; }  // decode and verify steps padded to a bucket

 private:
  struct StepGraph;
  // A step's batch on the device: the view, the graph it replays (null: eager) and its padding rows.
  struct StagedStep {
    BatchView view;
    const StepGraph* graph = nullptr;
    int64_t padding_rows = 0;
  };

  // The steps of execute(), in order.
  Result<StagedStep> stage_step(const ScheduledBatch& batch);  // host only: the batch packed, not uploaded
  Status copy_tokens_from_samples(const ScheduledBatch& batch, const BatchView& view);
  // Adds the time since the last step's results were read to idle_seconds_ (nothing when none were).
  void count_idle_until_launch();
  Status run_forward(const StagedStep& step, const TensorView& logits);
  // Profiling: captures and replays a one-off graph of the step (see set_profile_capture); false when the
  // capture failed and the engine's own graph should run instead.
  Result<bool> run_profiled(const StepGraph& graph, const BatchView& view, const TensorView& logits);
  // Host path (logits_host_ holds the step's real rows): prompt logits into their requests, then sampling.
  void copy_prompt_logits(const ScheduledBatch& batch);
  // `host_only`: only the entries that need the host sampler (the rest came from the sample op).
  void sample_on_host(const ScheduledBatch& batch, bool masked, bool host_only, std::vector<SampledToken>* sampled);
  // One row sample_on_host draws: its logits (masked in place first where its entry is constrained), parameters,
  // penalty context, stream (a copy: a decode row's is stored back after the draw) and output.
  struct HostRow {
    float* logits = nullptr;
    const uint32_t* mask = nullptr;
    Request* request = nullptr;
    PenaltyContext penalties;
    Rng rng;
    bool decode = false;  // the entry's one row: its stream advances, its forced token applies
    bool drawn = false;   // the sample op drew it (top logprobs alone): only its logprobs here
    SampledToken* out = nullptr;
  };

  // How a step's rows are sampled. Backend::sample draws every row it can and brings back only ids and logprobs;
  // the logits of rows that need more come back (kSplit: those rows alone): the host Sampler draws the rows with
  // penalties or forced test outputs (the same algorithm), and ranks the top logprobs of rows that ask for them
  // (the op's draws stand). Every row goes to the host when prompt logits come back anyway, when every row needs
  // the host's draw, or with whole_batch_host_sampling_ (the form before 2026-11-29).
  enum class SampleRows { kOp, kSplit, kHost };
  SampleRows sample_rows(const ScheduledBatch& batch) const;
  // Asks each sampled entry's constraint for its mask: row k of token_mask_host_ for the k-th sampled entry.
  // False when no entry is constrained this step.
  bool fill_token_masks(const ScheduledBatch& batch);
  // The sample op's device buffers for `logits`' rows (all of them set: what a step graph captures).
  SampleParams graph_sample_params(const TensorView& logits) const;
  Status upload_sample_inputs(const ScheduledBatch& batch, int64_t rows, bool op, bool masked);
  // The sample op's tokens and logprobs of `rows` logits rows into `sampled`; advances the requests' streams (with
  // `split`, only those of the entries the sample op drew for).
  Status read_sampled(const ScheduledBatch& batch, int64_t rows, bool split, std::vector<SampledToken>* sampled);
  // Host path: the step's real logits rows to the host, prompt logits into their requests, then sampling. With
  // `host_only` (a split step, the sample op's tokens already in `sampled`): only the rows of the entries that need
  // the host sampler come back and are drawn.
  Status sample_logits_on_host(const ScheduledBatch& batch, const StagedStep& step, bool masked, bool host_only,
                               std::vector<SampledToken>* sampled);

  ModelRunner(const Model& model, int64_t vocab);
  // The model on the runner's workspace: logits for the batch's logit rows.
  Status forward(const BatchView& view, const KvCache& kv, const TensorView& logits);
  Status plan_kv_pool(const DeviceMemory& before, int64_t owned_before, bool graphs, EngineConfig* config);
  Status capture_graphs(const std::vector<int64_t>& sizes);
  // One graph per bucket of sequences with `rows` tokens each (1: decode; k + 1: verify k drafts).
  Result<std::vector<std::unique_ptr<StepGraph>>> capture_step_graphs(const std::vector<int64_t>& sizes, int64_t rows);
  // Sequences that fill a batch up to `size` sequences: `rows` tokens each at positions 0 .. rows - 1 of the
  // scratch page (every logical page maps to it), logits for every row when rows > 1 (as a verify entry).
  void add_padding(int64_t size, int64_t rows = 1);
  const StepGraph* graph_for(const ScheduledBatch& batch) const;

  const Model& model_;
  EngineConfig config_;
  KvCache kv_;
  BatchStaging staging_;
  std::unique_ptr<ModelWorkspace> ws_;
  Buffer logits_device_;             // f32 [max_logit_rows, vocab]
  std::vector<float> logits_host_;   // the same on the host
  int64_t max_logit_rows_ = 0;
  std::vector<BatchSequence> seqs_;
  // Host sampling: a Sampler per thread of host_pool_ (made on the first host-sampled step).
  std::vector<std::unique_ptr<Sampler>> samplers_;
  std::unique_ptr<cpu::ThreadPool> host_pool_;
  std::vector<HostRow> host_rows_;
  std::vector<std::vector<int32_t>> verify_outputs_;  // per verify entry with penalties: generated + its drafts
  int64_t host_sample_threads_ = 0;
  Buffer sample_params_device_;  // u8 [max_logit_rows, sizeof(SampleRowParams)]
  Buffer sample_out_device_;     // i32 tokens [max_logit_rows], then f32 logprobs [max_logit_rows]
  std::vector<SampleRowParams> sample_params_host_;
  std::vector<int32_t> sample_out_host_;
  // Grammar masks of the sampled rows (SampleParams::token_mask / mask_rows), filled on the host while the
  // forward pass runs on the device.
  Buffer token_mask_device_;               // i32 [max_logit_rows, ceil(vocab / 32)]
  Buffer mask_rows_device_;                // i32 [max_logit_rows]
  std::vector<uint32_t> token_mask_host_;  // [max_logit_rows, ceil(vocab / 32)]
  std::vector<int32_t> mask_rows_host_;    // [max_logit_rows]
  int64_t sample_op_steps_ = 0, graph_sampled_steps_ = 0, split_sample_steps_ = 0;
  bool whole_batch_host_sampling_ = false;
  int64_t device_mask_rows_ = 0;  // mask_rows_device_ rows that may hold a nonzero flag (from a masked step)
  std::vector<std::unique_ptr<StepGraph>> graphs_;         // decode, ascending batch size
  // verify_graphs_[k - 1]: steps verifying k drafts per entry, ascending batch size (k = 1 .. verify_drafts_)
  std::vector<std::vector<std::unique_ptr<StepGraph>>> verify_graphs_;
  int64_t verify_drafts_ = 0;  // the configured k
  std::vector<std::vector<int32_t>> scratch_rows_;         // per layer group: {index of its scratch page}
  std::vector<std::vector<int32_t>> padding_pages_;        // per layer group: the scratch page, once per logical page
  std::vector<int32_t> padding_tokens_;
  bool replay_ = true;
  std::function<void(const ScheduledBatch&)> step_observer_;
  bool profile_capture_ = false;
  Status profile_status_ = Status::ok();
  double profile_graph_ms_ = 0;
  RunnerStartup startup_;
  double last_sample_seconds_ = 0;
  double device_wait_seconds_ = 0;
  double idle_seconds_ = 0;
  std::optional<std::chrono::steady_clock::time_point> results_read_;  // the last device wait's end, until a launch
  std::optional<StagedStep> prepared_;  // prepare()'s step, until launch_prepared
  // Between launch and complete: the rows of a replayed graph's samples to read back, or -1 when launch
  // left the tokens in launched_sampled_.
  int64_t launched_rows_ = -1;
  std::vector<SampledToken> launched_sampled_;
  TensorView step_hidden_;  // the last forward pass's final hidden rows (ForwardOutput::hidden)
  // Draft-model speculation: the model and its workspace, and each draft call's rows: queries at the last
  // token's position p, context rows at p - 1 (draft_model.h), each row's target hidden row, the drafts.
  std::unique_ptr<DraftModel> draft_model_;
  std::unique_ptr<DraftWorkspace> draft_ws_;
  HiddenObserver target_observer_;  // the draft model's, passed to every target forward pass (empty: none)
  DraftBatch draft_batch_;          // reused: its host rows keep their capacity
  BatchStaging draft_queries_;
  Buffer draft_rows_device_;  // i32 [2, max_running_requests]: each row's target hidden row, then its p - 1
  Buffer drafts_device_;      // i32 [k, max_running_requests]
  std::vector<int32_t> draft_rows_host_, draft_last_tokens_, drafts_host_;
  std::vector<Request*> draft_requests_;
  std::vector<BatchSequence> draft_seqs_;
  int64_t num_draft_calls_ = 0;
  int64_t last_draft_values_ = 0;  // k * S of the last draft call
  double draft_seconds_ = 0;
  int64_t num_graph_replays_ = 0, num_verify_replays_ = 0, num_padded_steps_ = 0;
};

}  // namespace mx
