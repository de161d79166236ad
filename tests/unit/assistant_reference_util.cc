// See assistant_reference_util.h.
#include "assistant_reference_util.h"

#include <algorithm>

#include "runtime/batch_staging.h"

namespace mx::test {

Result<DraftRound> run_draft_round(const Model& target, const Gemma4AssistantModel& assistant, const std::vector<int32_t>& ids,
                                   int64_t k) {
  Backend& b = target.backend();
  const int64_t P = 4, T = static_cast<int64_t>(ids.size()) - 1, vocab = target.dims().vocab_size;
  if (T < 1) return invalid_argument("a draft round needs a prompt and the target's next token");
  const int64_t num_pages = (T + 1 + P - 1) / P;
  // Pages handed out from the end, so that reading the wrong page shows.
  std::vector<int32_t> pages;
  for (int64_t i = 0; i < num_pages; ++i) pages.push_back(static_cast<int32_t>(num_pages - 1 - i));
  MX_ASSIGN_OR_RETURN(KvCache kv, KvCache::allocate(b, KvCacheShape::uniform(target.kv_layout(), num_pages, P)));
  MX_ASSIGN_OR_RETURN(BatchStaging prefill, BatchStaging::create(b, {T, 1, num_pages, 1}));
  MX_ASSIGN_OR_RETURN(BatchView view, prefill.stage({{std::span<const int32_t>(ids).first(static_cast<size_t>(T)), 0, pages}}));
  MX_ASSIGN_OR_RETURN(std::unique_ptr<ModelWorkspace> ws, target.make_workspace(T, 1));
  MX_ASSIGN_OR_RETURN(Buffer logits, b.allocate(vocab * 4));
  MX_ASSIGN_OR_RETURN(const ForwardOutput out, target.forward(view, kv, *ws, logits.view(DType::kF32, {1, vocab})));

  // One draft row: the next token at position T, its context (keys 0 .. T - 1) at T - 1.
  const int32_t next = ids.back();
  std::vector<BatchSequence> row = {{std::span<const int32_t>(&next, 1), T, pages, false, true}};
  MX_ASSIGN_OR_RETURN(BatchStaging queries, BatchStaging::create(b, {1, 1, num_pages, 1}));
  MX_ASSIGN_OR_RETURN(BatchStaging context, BatchStaging::create(b, {1, 1, num_pages, 1}));
  DraftBatch batch;
  batch.num_seqs = 1;
  MX_ASSIGN_OR_RETURN(batch.queries, queries.stage(row));
  row[0].start_position = T - 1;
  MX_ASSIGN_OR_RETURN(batch.context, context.stage(row));
  MX_ASSIGN_OR_RETURN(Buffer small, b.allocate(8));  // i32 hidden row, then i32 token
  batch.hidden_rows = TensorView(small.data(), DType::kI32, {1}, b.device());
  const TensorView token(static_cast<int32_t*>(small.data()) + 1, DType::kI32, {1}, b.device());
  const int32_t last_row = static_cast<int32_t>(T - 1);
  MX_RETURN_IF_ERROR(b.copy_from_host(batch.hidden_rows, &last_row));
  MX_RETURN_IF_ERROR(b.copy_from_host(token, &next));
  batch.target_hidden = out.hidden;

  MX_ASSIGN_OR_RETURN(std::unique_ptr<DraftWorkspace> draft_ws, assistant.make_workspace(1, T));
  auto& aws = dynamic_cast<Gemma4AssistantWorkspace&>(*draft_ws);
  MX_RETURN_IF_ERROR(assistant.load_target_state(batch, aws));
  DraftRound round;
  for (int64_t j = 0; j < k; ++j) {
    MX_RETURN_IF_ERROR(assistant.step(batch, kv, aws, token));
    std::vector<float> host(static_cast<size_t>(vocab));
    MX_RETURN_IF_ERROR(b.copy_to_host(host.data(), aws.logits.rows(0, 1)));
    const auto best = static_cast<int32_t>(std::max_element(host.begin(), host.end()) - host.begin());
    round.logits.push_back(std::move(host));
    round.tokens.push_back(best);
    MX_RETURN_IF_ERROR(b.copy_from_host(token, &best));
  }
  return round;
}

}  // namespace mx::test
