#include "grammar/stack_walker.h"

namespace mx::grammar {

namespace {

uint64_t mix(int32_t node, int32_t parent) {
  uint64_t h = (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) | static_cast<uint32_t>(parent);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

}  // namespace

StackPool::StackPool() : table_(1024, -1) {}

size_t StackPool::slot_of(int32_t node, int32_t parent) const {
  const size_t mask = table_.size() - 1;
  size_t i = mix(node, parent) & mask;
  while (table_[i] >= 0) {
    const Entry& e = entries_[table_[i]];
    if (e.node == node && e.parent == parent) return i;
    i = (i + 1) & mask;
  }
  return i;
}

void StackPool::grow() {
  table_.assign(table_.size() * 2, -1);
  const size_t mask = table_.size() - 1;
  for (size_t id = 0; id < entries_.size(); ++id) {  // insertion order: LIFO removal stays valid
    size_t i = mix(entries_[id].node, entries_[id].parent) & mask;
    while (table_[i] >= 0) i = (i + 1) & mask;
    table_[i] = static_cast<int32_t>(id);
  }
}

int32_t StackPool::intern(int32_t node, int32_t parent) {
  size_t i = slot_of(node, parent);
  if (table_[i] >= 0) return table_[i];
  if ((entries_.size() + 1) * 2 > table_.size()) {
    grow();
    i = slot_of(node, parent);
  }
  const int32_t id = static_cast<int32_t>(entries_.size());
  entries_.push_back(Entry{node, parent});
  table_[i] = id;
  return id;
}

void StackPool::truncate(int64_t mark) {
  // A key's probe chain only crosses keys inserted before it, so clearing the newest slots first is exact.
  while (static_cast<int64_t>(entries_.size()) > mark) {
    const Entry e = entries_.back();
    table_[slot_of(e.node, e.parent)] = -1;
    entries_.pop_back();
  }
}

void StackWalker::begin_round() {
  ++round_;
  if (round_ == 0) {  // wrapped: forget every mark
    std::fill(seen_.begin(), seen_.end(), 0);
    round_ = 1;
  }
}

void StackWalker::start(int32_t s, StepResult* out) {
  out->clear();
  begin_round();
  expand(s, out);
}

void StackWalker::advance(const std::vector<int32_t>& tops, uint8_t byte, StepResult* out) {
  out->clear();
  begin_round();
  for (int32_t s : tops) {
    const int32_t n = pool_->node(s);
    for (const ByteEdge* e = a_.byte_edges_begin(n); e != a_.byte_edges_end(n); ++e) {
      if (byte >= e->lo && byte <= e->hi) expand(pool_->intern(e->target, pool_->parent(s)), out);
    }
  }
}

void StackWalker::expand(int32_t s, StepResult* out) {
  if (static_cast<int64_t>(seen_.size()) <= s) seen_.resize(static_cast<size_t>(pool_->size()) * 2 + 64, 0);
  if (seen_[s] == round_) return;
  seen_[s] = round_;
  const int32_t n = pool_->node(s);
  if (a_.has_byte_edges(n)) out->tops.push_back(s);
  for (const CallEdge* c = a_.call_edges_begin(n); c != a_.call_edges_end(n); ++c) {
    const int32_t ret = pool_->intern(c->ret, pool_->parent(s));
    expand(pool_->intern(a_.rule_start(c->rule), ret), out);
  }
  if (a_.node(n).final) finish_rule(pool_->parent(s), out);
}

void StackWalker::finish_rule(int32_t parent, StepResult* out) {
  if (parent >= 0) {
    expand(parent, out);
    return;
  }
  if (parent == kBottom) {
    out->can_end = true;
    return;
  }
  const int32_t sentinel_rule = -2 - parent;
  const int32_t ret = a_.unique_return(sentinel_rule);
  if (sentinel_rule == a_.root()) {
    if (ret == kNoCallSite) {
      out->can_end = true;
    } else {
      out->left_context = true;  // the root calls itself: below it may be the end or a caller
    }
    return;
  }
  if (ret >= 0) {
    const int32_t caller = a_.node(ret).rule;
    expand(pool_->intern(ret, context_sentinel(caller)), out);
  } else {
    out->left_context = true;
  }
}

}  // namespace mx::grammar
