// A CPU stand-in for graph capture: "captures" a body by keeping it and "replays" it by running it again,
// which is what a CUDA graph does with its buffers (the body reads whatever they hold at replay time). So
// code that captures graphs (the model runner's step graphs, EAGLE-3's chain graphs) runs its graph logic
// (buckets, padding, fixed addresses, which steps replay) on the CPU as on a GPU.
#pragma once

#include <functional>
#include <memory>

#include "backend/forwarding_backend.h"

namespace mx::test {

class ReplayingBackend final : public ForwardingBackend {
 public:
  explicit ReplayingBackend(Backend& inner) : ForwardingBackend(inner) {}
  bool can_capture() const override { return true; }
  Result<std::unique_ptr<ReplayGraph>> capture(const std::function<Status()>& body) override {
    ++captures;
    return std::unique_ptr<ReplayGraph>(new Replay(body, &replays));
  }
  Status copy_row_prefixes_from_host(TensorView dst, const void* src, int64_t prefix_bytes) override {
    ++row_prefix_copies;
    return ForwardingBackend::copy_row_prefixes_from_host(dst, src, prefix_bytes);
  }
  int64_t captures = 0, replays = 0, row_prefix_copies = 0;

 private:
  class Replay final : public ReplayGraph {
   public:
    Replay(std::function<Status()> body, int64_t* count) : body_(std::move(body)), count_(count) {}
    Status replay() override {
      ++*count_;
      return body_();
    }

   private:
    std::function<Status()> body_;
    int64_t* count_;
  };
};

}  // namespace mx::test
