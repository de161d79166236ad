// RequestOutput delta merging and finish-reason names.
#include "runtime/request.h"

#include <iterator>

namespace mx {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "";
}

void RequestOutput::clear() {
  id = -1;
  token_ids.clear();
  logprobs.clear();
  text.clear();
  finish = FinishReason::kNone;
  stop_token = -1;
  stop_string.clear();
  error.clear();
  usage = Usage{};
  num_preemptions = 0;
  prompt_logits.clear();
  first_scheduled = {};
}

void RequestOutput::merge(RequestOutput&& next) {
  id = next.id;
  token_ids.insert(token_ids.end(), next.token_ids.begin(), next.token_ids.end());
  logprobs.insert(logprobs.end(), std::make_move_iterator(next.logprobs.begin()),
                  std::make_move_iterator(next.logprobs.end()));
  text += next.text;
  if (next.finished()) {
    finish = next.finish;
    stop_token = next.stop_token;
    stop_string = std::move(next.stop_string);
    error = std::move(next.error);
  }
  usage = next.usage;
  num_preemptions = next.num_preemptions;
  first_scheduled = next.first_scheduled;
  if (!next.prompt_logits.empty()) prompt_logits = std::move(next.prompt_logits);
}

}  // namespace mx
