// GenerationStream: producer events -> formatter -> channel, on the connection's strand.
#include "server/generation_stream.h"

#include "server/http_server.h"

namespace mx::server {

using Clock = std::chrono::steady_clock;

GenerationStream::GenerationStream(std::shared_ptr<ResponseChannel> channel, std::unique_ptr<ResponseFormatter> formatter,
                                   bool streaming, ServerMetrics* metrics, std::function<void()> on_end)
    : channel_(std::move(channel)), formatter_(std::move(formatter)), streaming_(streaming), metrics_(metrics),
      on_end_(std::move(on_end)), arrival_(Clock::now()) {}

// A producer that drops the stream without ending it must not leak the admission slot, and the client
// must not hang: answer with an error (the strand is gone with us, so act directly on the channel).
GenerationStream::~GenerationStream() {
  if (ended_) return;
  const ApiError error = ApiError::internal("The request ended without a result.");
  if (headers_sent_) {
    channel_->write_chunk(formatter_->stream_error(error));
    channel_->end_stream();
  } else {
    channel_->respond(make_error_response(error, 11));
  }
  if (metrics_) metrics_->request_errors->add();
  if (on_end_) on_end_();
}

std::shared_ptr<GenerationStream> make_generation_stream(std::shared_ptr<ResponseChannel> channel,
                                                         std::unique_ptr<ResponseFormatter> formatter, bool streaming,
                                                         ServerMetrics* metrics, std::function<void()> on_end) {
  auto stream = std::make_shared<GenerationStream>(std::move(channel), std::move(formatter), streaming, metrics,
                                                   std::move(on_end));
  stream->start();
  return stream;
}

void GenerationStream::start() {
  // Weak: the channel must not keep the stream (and so the producer's request) alive.
  std::weak_ptr<GenerationStream> weak = weak_from_this();
  channel_->on_disconnect([weak] {
    if (auto self = weak.lock()) self->fire_cancel();
  });
}

void GenerationStream::fire_cancel() {  // strand
  cancelled_.store(true, std::memory_order_release);
  if (cancel_fn_) {
    auto fn = std::move(cancel_fn_);
    cancel_fn_ = nullptr;
    fn();
  }
}

void GenerationStream::on_cancel(std::function<void()> fn) {
  channel_->run([self = shared_from_this(), fn = std::move(fn)]() mutable {
    if (self->cancelled()) return fn();
    self->cancel_fn_ = std::move(fn);
  });
}

void GenerationStream::post(std::function<void()> fn) { channel_->run(std::move(fn)); }

void GenerationStream::cancel() {
  channel_->run([self = shared_from_this()] { self->fire_cancel(); });
}

void GenerationStream::begin_if_needed() {
  if (!streaming_ || headers_sent_) return;
  headers_sent_ = true;
  HttpResponse head{http::status::ok, 11};
  head.set(http::field::server, "mxserve");
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.set("X-Accel-Buffering", "no");  // nginx: do not buffer the stream
  channel_->begin_stream(std::move(head));
}

void GenerationStream::delta(GenerationDelta d) {
  channel_->run([self = shared_from_this(), d = std::move(d)] {
    if (self->ended_) return;
    if (d.num_tokens > 0) {
      const auto now = Clock::now();
      if (self->tokens_ == 0) {
        self->first_token_ = now;
        if (self->metrics_)
          self->metrics_->time_to_first_token->observe(std::chrono::duration<double>(self->first_token_ - self->arrival_).count());
      } else if (self->metrics_) {
        // A delta of n tokens closes n gaps since the previous one (the engine may release several at once).
        const double gap = std::chrono::duration<double>(now - self->last_token_).count() / static_cast<double>(d.num_tokens);
        for (int64_t i = 0; i < d.num_tokens; ++i) self->metrics_->inter_token_latency->observe(gap);
      }
      self->last_token_ = now;
      self->tokens_ += d.num_tokens;
    }
    std::string sse;
    self->formatter_->delta(d, &sse);
    if (!self->streaming_ || sse.empty()) return;
    self->begin_if_needed();
    self->channel_->write_chunk(std::move(sse));
  });
}

void GenerationStream::finish_choice(int64_t choice, FinishReason reason) {
  channel_->run([self = shared_from_this(), choice, reason] {
    if (self->ended_) return;
    self->last_reason_ = reason;
    std::string sse;
    self->formatter_->finish(choice, reason, &sse);
    if (!self->streaming_ || sse.empty()) return;
    self->begin_if_needed();
    self->channel_->write_chunk(std::move(sse));
  });
}

void GenerationStream::scheduled(std::chrono::steady_clock::time_point when) {
  channel_->run([self = shared_from_this(), when] {
    if (self->scheduled_ == Clock::time_point{} || when < self->scheduled_) self->scheduled_ = when;
  });
}

void GenerationStream::done(GenerationUsage usage) {
  channel_->run([self = shared_from_this(), usage] {
    if (self->ended_) return;
    std::string sse;
    self->formatter_->done(usage, &sse);
    self->channel_->set_log_note("prompt_tokens=" + std::to_string(usage.prompt_tokens) +
                                 " completion_tokens=" + std::to_string(usage.completion_tokens) +
                                 (self->streaming_ ? " stream" : ""));
    if (self->streaming_) {
      self->begin_if_needed();
      self->channel_->write_chunk(std::move(sse));
      self->channel_->end_stream();
    } else {
      self->channel_->respond(make_json_response(http::status::ok, self->formatter_->body(usage), 11));
    }
    if (ServerMetrics* m = self->metrics_) {
      const auto now = Clock::now();
      m->e2e_request_latency->observe(std::chrono::duration<double>(now - self->arrival_).count());
      if (self->scheduled_ != Clock::time_point{}) {
        m->request_queue_time->observe(std::chrono::duration<double>(self->scheduled_ - self->arrival_).count());
        if (self->tokens_ > 0) {
          m->request_prefill_time->observe(std::chrono::duration<double>(self->first_token_ - self->scheduled_).count());
          m->request_decode_time->observe(std::chrono::duration<double>(now - self->first_token_).count());
        }
      }
      if (self->tokens_ > 1)
        m->time_per_output_token->observe(std::chrono::duration<double>(now - self->first_token_).count() /
                                          static_cast<double>(self->tokens_ - 1));
      m->prompt_tokens->add(static_cast<double>(usage.prompt_tokens));
      m->generation_tokens->add(static_cast<double>(usage.completion_tokens));
      m->request_prompt_tokens->observe(static_cast<double>(usage.prompt_tokens));
      m->request_generation_tokens->observe(static_cast<double>(usage.completion_tokens));
      switch (self->last_reason_) {
        case FinishReason::kLength: m->success_length->add(), m->vllm_success_length->add(); break;
        case FinishReason::kToolCalls: m->success_tool_calls->add(), m->vllm_success_stop->add(); break;
        case FinishReason::kAbort: m->success_abort->add(), m->vllm_success_abort->add(); break;
        case FinishReason::kError: m->request_errors->add(), m->vllm_success_error->add(); break;
        case FinishReason::kStop: m->success_stop->add(), m->vllm_success_stop->add(); break;
      }
    }
    self->end();
  });
}

void GenerationStream::fail(ApiError error) {
  channel_->run([self = shared_from_this(), error = std::move(error)] {
    if (self->ended_) return;
    if (self->headers_sent_) {
      self->channel_->write_chunk(self->formatter_->stream_error(error));
      self->channel_->end_stream();
    } else {
      self->channel_->respond(make_error_response(error, 11));
    }
    if (self->metrics_) self->metrics_->request_errors->add();
    self->end();
  });
}

void GenerationStream::end() {
  ended_ = true;
  cancel_fn_ = nullptr;
  if (on_end_) {
    auto fn = std::move(on_end_);
    on_end_ = nullptr;
    fn();
  }
}

}  // namespace mx::server
