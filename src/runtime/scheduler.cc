// Scheduling, preemption and the per-step update. See scheduler.h for the policy.
#include "runtime/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "core/log.h"

namespace mx {

namespace {

std::vector<KvGroupPool> group_pools(const EngineConfig& c) {
  const std::vector<int64_t> pages = c.kv_group_pages.empty() ? kv_group_pages(c, c.num_kv_pages) : c.kv_group_pages;
  std::vector<KvGroupPool> groups;
  for (size_t g = 0; g < pages.size(); ++g)
    groups.push_back({c.kv_group_windows.empty() ? 0 : c.kv_group_windows[g], pages[g]});
  return groups;
}

}  // namespace

double mean_accepted_length(const SchedulerStats& s) {
  return s.spec_drafts > 0 ? 1.0 + static_cast<double>(s.spec_accepted_tokens) / static_cast<double>(s.spec_drafts) : 0.0;
}

std::string describe_speculation(const SchedulerStats& s) {
  char head[160];
  const double rate = s.spec_draft_tokens > 0 ? 100.0 * static_cast<double>(s.spec_accepted_tokens) / static_cast<double>(s.spec_draft_tokens) : 0.0;
  std::snprintf(head, sizeof(head), "speculation: %lld verify steps, %lld/%lld draft tokens accepted (%.1f%%), mean accepted length %.2f",
                static_cast<long long>(s.spec_drafts), static_cast<long long>(s.spec_accepted_tokens),
                static_cast<long long>(s.spec_draft_tokens), rate, mean_accepted_length(s));
  std::string out = head;
  out += ", accepted by position [";
  for (size_t i = 0; i < s.spec_accepted_per_pos.size(); ++i) out += (i ? " " : "") + std::to_string(s.spec_accepted_per_pos[i]);
  return out + "]";
}

Scheduler::Scheduler(const EngineConfig& config)
    : config_(config),
      token_budget_(config.max_num_batched_tokens),
      pools_(group_pools(config), config.page_size, config.enable_prefix_cache) {
  pools_.set_observer(config.prefix_cache_observer.get());
  speculating_ = config.speculative.enabled();
  drafter_ = make_drafter(config.speculative);
  stats_.spec_accepted_per_pos.assign(static_cast<size_t>(speculating_ ? config.speculative.num_draft_tokens : 0), 0);
  for (ScheduledBatch& b : batches_) b.entries.reserve(static_cast<size_t>(config.max_running_requests));
  running_.reserve(static_cast<size_t>(config.max_running_requests));
}

void Scheduler::add(Request* request) { waiting_.push_back(request); }

int64_t Scheduler::chunk_size(const Request& r, int64_t budget, int64_t rows_left) const {
  int64_t n = std::min(r.num_tokens() - r.num_computed, budget);
  // Prompt logits take one logits row per token of the chunk, up to the prompt's end.
  if (r.input.want_prompt_logits && r.num_computed < r.prompt_len) n = std::min(n, rows_left);
  return std::max<int64_t>(n, 0);
}

ScheduledBatch& Scheduler::fresh_batch() {
  ScheduledBatch& b = batches_[next_batch_];
  next_batch_ ^= 1;
  b.entries.clear();
  b.num_tokens = 0;
  b.num_samples = 0;
  return b;
}

void Scheduler::add_entry(Request* r, int64_t n, int64_t* budget, int64_t* rows_left) {
  ScheduledEntry e;
  e.request = r;
  e.start = r->num_computed;
  e.num_tokens = n;
  e.sample = e.start + n == r->num_tokens() && r->num_generated() < r->max_new_tokens;
  e.all_logits = r->input.want_prompt_logits && e.start < r->prompt_len;
  if (e.all_logits) *rows_left -= n;
  *budget -= n;
  batch_->entries.push_back(e);
  batch_->num_tokens += n;
  batch_->num_samples += e.sample ? 1 : 0;
}

bool Scheduler::may_speculate(const Request& r) const {
  if (!speculating_ || !r.running || r.finish != FinishReason::kNone || r.num_computed + 1 != r.num_tokens() ||
      r.input.want_prompt_logits || !r.input.forced_tokens.empty() || r.input.constraint)
    return false;
  return r.max_new_tokens - r.num_generated() - 1 > 0 && config_.max_model_len - r.num_tokens() - 1 > 0;
}

int64_t Scheduler::propose_drafts(Request* r, int64_t budget) {
  if (!may_speculate(*r)) return 0;
  // Every draft accepted plus the bonus token must stay within max_tokens and the context.
  const int64_t most = std::min({config_.speculative.num_draft_tokens, r->max_new_tokens - r->num_generated() - 1,
                                 config_.max_model_len - r->num_tokens() - 1, budget - 1});
  if (most <= 0) return 0;
  if (drafter_) {
    drafter_->propose(r->tokens, most, &r->verify_tokens);
  } else if (r->drafts_for_tokens == r->num_tokens()) {  // the draft model's, made for exactly these tokens
    const auto n = std::min<size_t>(static_cast<size_t>(most), r->draft_tokens.size());
    r->verify_tokens.assign(r->draft_tokens.begin(), r->draft_tokens.begin() + static_cast<std::ptrdiff_t>(n));
  } else {
    r->verify_tokens.clear();
  }
  const auto k = static_cast<int64_t>(r->verify_tokens.size());
  if (k == 0 || !pools_.allocate(r->num_tokens() + k, &r->pages)) {
    r->verify_tokens.clear();
    return 0;
  }
  r->verify_tokens.insert(r->verify_tokens.begin(), r->tokens.back());
  return k;
}

const ScheduledBatch& Scheduler::schedule() {
  batch_ = &fresh_batch();
  int64_t budget = token_budget_;
  int64_t rows_left = config_.max_prompt_logit_rows;
  bool preempted = false;

  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    const int64_t n = chunk_size(*r, budget, rows_left);
    if (n == 0) {
      ++i;
      continue;
    }
    if (n == 1) {
      if (const int64_t k = propose_drafts(r, budget); k > 0) {
        add_entry(r, 1 + k, &budget, &rows_left);
        batch_->entries.back().num_draft = k;  // add_entry saw 1 + k tokens past the end: not a sampling entry
        batch_->entries.back().sample = true;
        batch_->num_samples += 1 + k;
        ++i;
        continue;
      }
    }
    bool self_preempted = false;
    while (!pools_.allocate(r->num_computed + n, &r->pages)) {
      Request* victim = running_.back();
      preempt(victim);
      preempted = true;
      if (victim == r) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // r was the newest: nothing after it is left to schedule
    add_entry(r, n, &budget, &rows_left);
    ++i;
  }

  while (!preempted && !waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < config_.max_running_requests) {
    Request* r = waiting_.front();
    int64_t hit = 0;
    if (!r->input.want_prompt_logits)
      hit = pools_.acquire_prefix(r->tokens, (r->num_tokens() - 1) / config_.page_size, &r->pages);
    r->num_computed = hit * config_.page_size;
    r->num_registered_pages = hit;
    const int64_t n = chunk_size(*r, budget, rows_left);
    if (n == 0 || !pools_.allocate(r->num_computed + n, &r->pages)) {
      pools_.release(&r->pages);
      r->num_computed = 0;
      r->num_registered_pages = 0;
      break;
    }
    if (!r->admitted_once) {
      r->usage.cached_prompt_tokens = std::min(r->num_computed, r->prompt_len);
      r->first_scheduled = std::chrono::steady_clock::now();
    }
    r->admitted_once = true;
    stats_.prefix_hit_tokens += r->num_computed;
    if (config_.enable_prefix_cache && !r->input.want_prompt_logits) stats_.prefix_query_tokens += r->num_tokens();
    waiting_.pop_front();
    r->running = true;
    running_.push_back(r);
    add_entry(r, n, &budget, &rows_left);
  }
  if (!batch_->empty()) {
    ++stats_.steps;
    stats_.computed_tokens += batch_->num_tokens;
  }
  return *batch_;
}

const ScheduledBatch* Scheduler::schedule_ahead(const ScheduledBatch& inflight) {
  if (speculating_ || (!waiting_.empty() && static_cast<int64_t>(running_.size()) < config_.max_running_requests))
    return nullptr;
  // Every running request has the in-flight batch's one decode row (finished ones may be listed too).
  size_t live = 0;
  for (const ScheduledEntry& e : inflight.entries) {
    const Request* r = e.request;
    if (e.num_tokens != 1 || !e.sample || e.num_draft != 0 || e.all_logits || r->input.constraint) return nullptr;
    if (r->finish != FinishReason::kNone) continue;
    if (live >= running_.size() || running_[live] != r) return nullptr;
    ++live;
  }
  if (live != running_.size() || static_cast<int64_t>(live) > token_budget_) return nullptr;
  if (&inflight == &batches_[next_batch_]) next_batch_ ^= 1;  // never overwrite the batch in flight
  batch_ = &fresh_batch();
  for (size_t row = 0; row < inflight.entries.size(); ++row) {
    Request* r = inflight.entries[row].request;
    if (r->finish != FinishReason::kNone) continue;
    // After the in-flight update: one token more, all computed but that one, which the next step computes.
    const int64_t tokens = r->num_tokens() + 1;
    if (r->num_generated() + 1 >= r->max_new_tokens || tokens >= config_.max_model_len) continue;  // ends by length
    if (!pools_.allocate(tokens, &r->pages)) return nullptr;  // the pages stay: the next schedule() needs them too
    ScheduledEntry e;
    e.request = r;
    e.start = tokens - 1;
    e.num_tokens = 1;
    e.sample = true;
    e.token_from_row = static_cast<int64_t>(row);  // one sampled row per entry in flight
    batch_->entries.push_back(e);
    ++batch_->num_tokens;
    ++batch_->num_samples;
  }
  if (batch_->empty()) return nullptr;
  ++stats_.steps;
  ++stats_.overlapped_steps;
  stats_.computed_tokens += batch_->num_tokens;
  return batch_;
}

void Scheduler::drop_ahead(const ScheduledBatch& batch) {
  --stats_.steps;
  --stats_.overlapped_steps;
  stats_.computed_tokens -= batch.num_tokens;
}

void Scheduler::preempt(Request* r) {
  MX_CHECK(!running_.empty() && running_.back() == r) << "only the newest running request is preempted";
  running_.pop_back();
  pools_.release(&r->pages);
  r->num_computed = 0;
  r->num_registered_pages = 0;
  r->running = false;
  ++r->num_preemptions;
  ++stats_.preemptions;
  waiting_.push_front(r);
  MX_LOG(Debug) << "request " << r->id << ": preempted (KV pool full), " << r->num_tokens() << " tokens to recompute";
}

void Scheduler::register_full_pages(Request* r) {
  if (!pools_.prefix_cache_enabled()) return;
  const int64_t full = r->num_computed / config_.page_size;
  pools_.register_pages(r->pages, r->tokens, r->num_registered_pages, full);
  r->num_registered_pages = std::max(r->num_registered_pages, full);
}

void Scheduler::finish(Request* r, FinishReason reason) {
  r->finish = reason;
  if (r->has_matcher) r->stop_matcher.finish();
  pools_.release(&r->pages);
  r->running = false;
  r->touched = true;
  ++stats_.finished;
}

void Scheduler::append_token(Request* r, const SampledToken& s) {
  r->tokens.push_back(s.token);
  if (r->input.constraint) r->input.constraint->accept(s.token);
  if (r->input.sampling.logprobs) r->logprobs.push_back(s);
  r->usage.completion_tokens = r->num_generated();
  r->touched = true;
  ++stats_.generated_tokens;
  const auto& eos = *config_.eos_token_ids;
  const auto& extra = r->input.stop_token_ids;
  const bool is_eos = !r->input.ignore_eos && std::find(eos.begin(), eos.end(), s.token) != eos.end();
  if (is_eos || std::find(extra.begin(), extra.end(), s.token) != extra.end()) {
    r->stop_token = s.token;
    finish(r, FinishReason::kStop);
    return;
  }
  if (r->has_matcher && r->stop_matcher.append(r->generated())) {
    finish(r, FinishReason::kStop);
    return;
  }
  if (r->num_generated() >= r->max_new_tokens || r->num_tokens() >= config_.max_model_len)
    finish(r, FinishReason::kLength);
}

void Scheduler::update(const ScheduledBatch& batch, std::span<const SampledToken> sampled) {
  size_t k = 0;
  for (const ScheduledEntry& e : batch.entries) {
    Request* r = e.request;
    if (r->finish != FinishReason::kNone) {  // ended while this overlapped step ran: its rows are dropped
      k += e.sample ? static_cast<size_t>(1 + e.num_draft) : 0;
      continue;
    }
    if (e.num_draft > 0) {
      MX_CHECK(k + 1 + static_cast<size_t>(e.num_draft) <= sampled.size()) << "fewer sampled tokens than verify rows";
      update_verified(e, sampled.subspan(k, static_cast<size_t>(1 + e.num_draft)));
      k += static_cast<size_t>(1 + e.num_draft);
      if (r->touched && r->finish == FinishReason::kNone) touched_.push_back(r);
      continue;
    }
    r->num_computed += e.num_tokens;
    register_full_pages(r);
    // The next query is at num_computed: window groups let go of what it cannot see (after registering,
    // so the released pages stay cached).
    pools_.release_below_window(r->num_computed, &r->pages);
    if (e.sample) {
      MX_CHECK(k < sampled.size()) << "fewer sampled tokens than sampling entries";
      append_token(r, sampled[k++]);
    } else if (r->num_computed == r->num_tokens() && r->num_generated() >= r->max_new_tokens) {
      finish(r, FinishReason::kLength);  // max_tokens 0: the prompt ran (for its logits), nothing to sample
    }
    if (r->touched && r->finish == FinishReason::kNone) touched_.push_back(r);
  }
  // Finished requests leave the running list (order kept) and are reported once.
  size_t kept = 0;
  for (Request* r : running_) {
    if (r->finish == FinishReason::kNone) running_[kept++] = r;
    else touched_.push_back(r);
  }
  running_.resize(kept);
}

void Scheduler::update_verified(const ScheduledEntry& e, std::span<const SampledToken> rows) {
  Request* r = e.request;
  const auto drafts = std::span<const int32_t>(r->verify_tokens).subspan(1, static_cast<size_t>(e.num_draft));
  int64_t accepted = 0;
  while (accepted < e.num_draft && rows[static_cast<size_t>(accepted)].token == drafts[static_cast<size_t>(accepted)]) ++accepted;
  if (config_.speculative.accept_all) accepted = e.num_draft;  // benchmarks: the drafts stand (drafter.h)
  ++stats_.spec_drafts;
  stats_.spec_draft_tokens += e.num_draft;
  stats_.spec_accepted_tokens += accepted;
  for (int64_t i = 0; i < accepted; ++i) ++stats_.spec_accepted_per_pos[static_cast<size_t>(i)];
  // Row i computed the KV of position start + i, which holds the token appended before it (row 0: the last
  // token): it stays once that token is in `tokens`. The sample of row i is the token after it.
  for (int64_t i = 0; i <= accepted && r->finish == FinishReason::kNone; ++i) {
    r->num_computed = e.start + 1 + i;
    register_full_pages(r);
    pools_.release_below_window(r->num_computed, &r->pages);
    r->rng.advance();  // the runner sampled row i with draw step + i and left the stream alone
    const SampledToken& row = rows[static_cast<size_t>(i)];
    if (i < accepted && row.token != drafts[static_cast<size_t>(i)]) {  // accept_all only
      SampledToken forced = row;
      forced.token = drafts[static_cast<size_t>(i)];
      append_token(r, forced);
    } else {
      append_token(r, row);
    }
  }
  // Rollback: positions past num_computed hold rejected drafts' KV; pages with nothing else are freed (the
  // rest is overwritten when those positions are computed again, and was never registered: only full
  // pages of computed tokens are).
  if (r->finish == FinishReason::kNone) pools_.truncate(r->num_computed, &r->pages);
  r->verify_tokens.clear();
}

void Scheduler::abort(Request* r) {
  if (r->finish != FinishReason::kNone) return;
  if (r->running) {
    running_.erase(std::find(running_.begin(), running_.end(), r));
  } else {
    auto it = std::find(waiting_.begin(), waiting_.end(), r);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  finish(r, FinishReason::kAbort);
  ++stats_.aborted;
  touched_.push_back(r);
}

void Scheduler::fail(const ScheduledBatch& batch, const std::string& message) {
  for (const ScheduledEntry& e : batch.entries) {
    Request* r = e.request;
    if (r->finish != FinishReason::kNone) continue;
    running_.erase(std::find(running_.begin(), running_.end(), r));
    r->error = message;
    finish(r, FinishReason::kError);
    touched_.push_back(r);
  }
}

void Scheduler::take_touched(std::vector<Request*>* out) {
  out->insert(out->end(), touched_.begin(), touched_.end());
  touched_.clear();  // keeps its capacity: no allocation per step
}

Status Scheduler::check_invariants() const {
  if (static_cast<int64_t>(running_.size()) > config_.max_running_requests)
    return internal_error("more running requests than max_running_requests");
  std::vector<const PageRows*> rows;
  for (const Request* r : running_) {
    const std::string id = "request " + std::to_string(r->id);
    if (!r->running || r->finish != FinishReason::kNone) return internal_error(id + " is listed as running but is not");
    if (static_cast<int64_t>(r->pages.size()) != pools_.num_groups()) return internal_error(id + " lacks page-table rows");
    for (int64_t g = 0; g < pools_.num_groups(); ++g) {
      const std::vector<int32_t>& row = r->pages[static_cast<size_t>(g)];
      if (pools_.pages_for_tokens(r->num_computed) > static_cast<int64_t>(row.size()))
        return internal_error(id + " computed tokens beyond its pages");
      if (static_cast<int64_t>(row.size()) > pools_.pages_for_tokens(r->num_tokens()))
        return internal_error(id + " holds more pages than its tokens need");
      const int64_t lo = pools_.first_needed_page(g, r->num_computed);
      for (int64_t i = 0; i < static_cast<int64_t>(row.size()); ++i)
        if ((row[static_cast<size_t>(i)] == kNoPage) != (i < lo))
          return internal_error(id + " layer group " + std::to_string(g) + " page " + std::to_string(i) +
                                (i < lo ? " is held below the window" : " is missing"));
    }
    rows.push_back(&r->pages);
  }
  for (const Request* r : waiting_) {
    bool holds = false;
    for (const auto& row : r->pages) holds |= !row.empty();
    if (r->running || r->finish != FinishReason::kNone || holds || r->num_computed != 0)
      return internal_error("waiting request " + std::to_string(r->id) + " holds pages or progress");
  }
  return pools_.check(rows);
}

}  // namespace mx
