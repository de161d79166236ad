// EAGLE-3 as the engine's draft model (model/draft_model.h) for a gpt-oss target on one device: the target's
// forward passes (graphs included) copy its residual streams at the draft's three layers into the workspace
// (target_observer); after each step draft() extends the draft's KV over every row the target kept for each
// sequence, prompt chunks included, and runs the chain (eagle3_drafter.h; the math in eagle3_model.h).
// The draft's KV is allocated at the first draft() (the pool is planned after the workspaces): one layer on
// the target's full-attention pages plus one scratch page per sequence, outside the memory plan (for the
// published gpt-oss drafts 1/12 (20b) or 1/18 (120b) of the full-attention layers' KV).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/draft_model.h"
#include "model/eagle3/eagle3_drafter.h"
#include "model/eagle3/eagle3_model.h"

namespace mx {

class GptOssModel;

class Eagle3DraftModel : public DraftModel {
 public:
  // `config_text` is the draft's config.json (read by load_draft_model); the target must outlive the draft.
  static Result<std::unique_ptr<Eagle3DraftModel>> load(const std::string& dir, const std::string& config_text,
                                                        const GptOssModel& target);

  std::string name() const override { return "eagle3"; }
  Result<std::unique_ptr<DraftWorkspace>> make_workspace(int64_t max_seqs, int64_t max_target_tokens) const override;
  Status draft(const DraftBatch& batch, const KvCache& kv, DraftWorkspace& ws, int64_t num_drafts,
               TensorView drafts) const override;
  bool keeps_own_kv() const override { return true; }
  HiddenObserver target_observer(DraftWorkspace& ws) const override;

 private:
  Eagle3DraftModel(std::unique_ptr<Eagle3Model> model, int64_t full_group)
      : model_(std::move(model)), full_group_(full_group) {}

  std::unique_ptr<Eagle3Model> model_;
  int64_t full_group_ = 0;  // the target's first full-attention KV group: the draft's page numbering
};

}  // namespace mx
