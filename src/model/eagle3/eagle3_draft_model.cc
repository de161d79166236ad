#include "model/eagle3/eagle3_draft_model.h"

#include "model/gpt_oss/gpt_oss_model.h"

namespace mx {
namespace {

struct Eagle3DraftWorkspace : DraftWorkspace {
  std::unique_ptr<Eagle3Drafter> drafter;
  std::vector<Eagle3SequenceStep> steps;
  std::vector<std::vector<int32_t>> drafts;
};

}  // namespace

Result<std::unique_ptr<Eagle3DraftModel>> Eagle3DraftModel::load(const std::string& dir, const std::string& config_text,
                                                                 const GptOssModel& target) {
  const std::string source = dir + "/config.json";
  if (target.is_tensor_parallel_rank())
    return unimplemented(source + ": EAGLE-3 drafting runs on one device (no tensor parallel yet)");
  int64_t full_group = -1;
  const KvLayout& layout = target.kv_layout();
  for (int64_t g = 0; g < layout.num_groups() && full_group < 0; ++g)
    if (layout.groups[static_cast<size_t>(g)].window == 0) full_group = g;
  if (full_group < 0)
    return invalid_argument(source + ": the target has no full-attention layer whose pages the EAGLE-3 draft can share");
  MX_ASSIGN_OR_RETURN(Eagle3Config config, parse_eagle3_config(config_text, source));
  MX_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open_dir(dir));
  const Eagle3Target t{target.dims().num_layers, target.dims().hidden_size, target.dims().vocab_size,
                       target.embedding_table(), target.lm_head(), target.lm_head_scale()};
  auto model = Eagle3Model::from_checkpoint(std::move(config), std::move(checkpoint), target.backend(), t);
  if (!model.is_ok()) return model.status().with_context(dir);
  return std::unique_ptr<Eagle3DraftModel>(new Eagle3DraftModel(std::move(*model), full_group));
}

Result<std::unique_ptr<DraftWorkspace>> Eagle3DraftModel::make_workspace(int64_t max_seqs, int64_t max_target_tokens) const {
  auto ws = std::make_unique<Eagle3DraftWorkspace>();
  ws->max_seqs = max_seqs;
  MX_ASSIGN_OR_RETURN(ws->drafter, Eagle3Drafter::create(*model_, Eagle3DrafterLimits{max_target_tokens, max_seqs}));
  ws->steps.reserve(static_cast<size_t>(max_seqs));
  return std::unique_ptr<DraftWorkspace>(std::move(ws));
}

HiddenObserver Eagle3DraftModel::target_observer(DraftWorkspace& ws) const {
  return dynamic_cast<Eagle3DraftWorkspace&>(ws).drafter->capture_observer();
}

Status Eagle3DraftModel::draft(const DraftBatch& batch, const KvCache& kv, DraftWorkspace& workspace,
                               int64_t num_drafts, TensorView drafts) const {
  auto* ws = dynamic_cast<Eagle3DraftWorkspace*>(&workspace);
  if (!ws) return invalid_argument("EAGLE-3 draft given another draft model's workspace");
  const int64_t S = batch.num_seqs;
  if (static_cast<int64_t>(batch.drafting.size()) != S)
    return internal_error("EAGLE-3 draft: the batch carries no host rows of its sequences");
  const KvCacheShape& shape = kv.shape();
  MX_RETURN_IF_ERROR(ws->drafter->attach_pool(
      Eagle3DraftPool{shape.group_pages[static_cast<size_t>(full_group_)], shape.page_size}));
  if (!ws->graph_batch_sizes.empty() && !ws->drafter->chain_graphs_enabled())
    MX_RETURN_IF_ERROR(ws->drafter->enable_chain_graphs(ws->graph_batch_sizes, ws->max_pages_per_seq));
  // A sequence's rows pair each kept position p with token p + 1: the drafting ones end at the token the
  // target just sampled, prompt chunks at the next prompt token.
  ws->steps.clear();
  for (const auto* list : {&batch.drafting, &batch.extend_only}) {
    const int64_t wanted = list == &batch.drafting ? num_drafts : 0;
    for (const DraftSequenceRows& s : *list) {
      if (s.num_rows < 1 || s.first_position + s.num_rows >= static_cast<int64_t>(s.tokens.size()) ||
          static_cast<int64_t>(s.pages.size()) <= full_group_)
        return internal_error("EAGLE-3 draft: a sequence's rows, tokens and pages disagree");
      ws->steps.push_back({s.first_row, s.first_position,
                           s.tokens.subspan(static_cast<size_t>(s.first_position + 1), static_cast<size_t>(s.num_rows)),
                           s.pages[static_cast<size_t>(full_group_)], wanted});
    }
  }
  MX_RETURN_IF_ERROR(ws->drafter->step(ws->steps, &ws->drafts));
  (void)drafts;  // the drafts are on the host already (target ids): they stay there
  if (S == 0) return Status::ok();
  ws->host_drafts.resize(static_cast<size_t>(num_drafts * S));
  for (int64_t i = 0; i < S; ++i)
    for (int64_t j = 0; j < num_drafts; ++j)
      ws->host_drafts[static_cast<size_t>(j * S + i)] = ws->drafts[static_cast<size_t>(i)][static_cast<size_t>(j)];
  return Status::ok();
}

}  // namespace mx
