// The model runner: turns a ScheduledBatch into one forward pass and samples the next tokens. It owns the
// device side of the engine (KV cache storage, batch staging, activation workspace, logits) sized once at
// start-up for the largest step, so running a step allocates nothing. It makes no policy decisions: what
// to run comes from the scheduler, how to sample from each request's own parameters.
#pragma once

#include <vector>

#include "backend/kv_cache.h"
#include "model/gpt_oss.h"
#include "runtime/batch_staging.h"
#include "runtime/engine_config.h"
#include "runtime/scheduler.h"

namespace mx {

class ModelRunner {
 public:
  static Result<std::unique_ptr<ModelRunner>> create(const GptOssModel& model, const EngineConfig& config);

  // Runs `batch` and writes one SampledToken per entry with `sample`, in entry order. Copies prompt logits
  // into the requests that asked for them.
  Status execute(const ScheduledBatch& batch, std::vector<SampledToken>* sampled);

  int64_t max_logit_rows() const { return max_logit_rows_; }
  int64_t sample_op_steps() const { return sample_op_steps_; }  // steps sampled by the backend's op

 private:
  // Steps whose sampled rows need nothing host-only (penalties, top logprobs, prompt logits, forced test
  // outputs) are sampled by Backend::sample and bring back only ids and logprobs; the host Sampler runs
  // the same algorithm.
  static bool can_use_sample_op(const ScheduledBatch& batch);
  Status sample_with_op(const ScheduledBatch& batch, const TensorView& logits, std::vector<SampledToken>* sampled);

  ModelRunner(const GptOssModel& model, const EngineConfig& config, KvCache kv, BatchStaging staging,
              ForwardWorkspace ws, Buffer logits)
      : model_(model), config_(config), kv_(std::move(kv)), staging_(std::move(staging)), ws_(std::move(ws)),
        logits_device_(std::move(logits)), sampler_(model.config().vocab_size) {}

  const GptOssModel& model_;
  const EngineConfig& config_;
  KvCache kv_;
  BatchStaging staging_;
  ForwardWorkspace ws_;
  Buffer logits_device_;             // f32 [max_logit_rows, vocab]
  std::vector<float> logits_host_;   // the same on the host
  int64_t max_logit_rows_ = 0;
  std::vector<BatchSequence> seqs_;
  Sampler sampler_;
  Buffer sample_params_device_;  // u8 [max_logit_rows, sizeof(SampleRowParams)]
  Buffer sample_out_device_;     // i32 tokens [max_logit_rows], then f32 logprobs [max_logit_rows]
  std::vector<SampleRowParams> sample_params_host_;
  std::vector<int32_t> sample_out_host_;
  int64_t sample_op_steps_ = 0;
};

}  // namespace mx
