// Compilation in two passes per rule: a Thompson NFA (epsilon edges, bounded repetition unrolled as
// nested options so `x{0,n}` costs n copies, not n^2), then epsilon removal: a node per start state and
// per target of a consuming edge, carrying the byte and call edges of its epsilon closure.
#include "grammar/automaton.h"

#include <algorithm>
#include <map>
#include <utility>

namespace mx::grammar {

namespace {

struct ThompsonState {
  std::vector<int32_t> eps;
  std::vector<std::pair<ByteSet, int32_t>> bytes;
  std::vector<std::pair<int32_t, int32_t>> calls;  // (rule, target)
};

class ThompsonNfa {
 public:
  explicit ThompsonNfa(int64_t max_states) : max_states_(max_states) {}

  int32_t add() {
    states_.emplace_back();
    return static_cast<int32_t>(states_.size()) - 1;
  }
  bool too_large() const { return static_cast<int64_t>(states_.size()) > max_states_; }
  std::vector<ThompsonState>& states() { return states_; }

  // Adds states matching `e` from `from` to `to`. False once the state budget is spent.
  bool build(const Expr& e, int32_t from, int32_t to) {
    if (too_large()) return false;
    switch (e.kind) {
      case ExprKind::kBytes:
        if (!e.bytes.empty()) states_[from].bytes.emplace_back(e.bytes, to);
        return true;
      case ExprKind::kRule:
        states_[from].calls.emplace_back(e.rule, to);
        return true;
      case ExprKind::kAlt:
        for (const Expr& c : e.items) {
          if (!build(c, from, to)) return false;
        }
        return true;
      case ExprKind::kSeq: {
        if (e.items.empty()) {
          states_[from].eps.push_back(to);
          return true;
        }
        int32_t cur = from;
        for (size_t i = 0; i < e.items.size(); ++i) {
          const int32_t next = i + 1 == e.items.size() ? to : add();
          if (!build(e.items[i], cur, next)) return false;
          cur = next;
        }
        return true;
      }
      case ExprKind::kRepeat: {
        const Expr& item = e.items[0];
        int32_t cur = from;
        for (int32_t i = 0; i < e.min_count; ++i) {
          const int32_t next = add();
          if (!build(item, cur, next)) return false;
          cur = next;
        }
        if (e.max_count < 0) {  // a loop: cur -item-> cur, then leave
          const int32_t body_end = add();
          if (!build(item, cur, body_end)) return false;
          states_[body_end].eps.push_back(cur);
          states_[cur].eps.push_back(to);
          return true;
        }
        for (int32_t i = e.min_count; i < e.max_count; ++i) {  // each further copy is optional
          states_[cur].eps.push_back(to);
          const int32_t next = add();
          if (!build(item, cur, next)) return false;
          cur = next;
        }
        states_[cur].eps.push_back(to);
        return true;
      }
    }
    return true;
  }

 private:
  int64_t max_states_;
  std::vector<ThompsonState> states_;
};

// Byte edges of one node: per target, the union of the byte sets, written as maximal ranges.
void append_byte_ranges(const std::map<int32_t, ByteSet>& by_target, std::vector<ByteEdge>* out) {
  for (const auto& [target, set] : by_target) {
    int b = 0;
    while (b < 256) {
      if (!set.has(static_cast<uint8_t>(b))) {
        ++b;
        continue;
      }
      int e = b;
      while (e + 1 < 256 && set.has(static_cast<uint8_t>(e + 1))) ++e;
      out->push_back(ByteEdge{static_cast<uint8_t>(b), static_cast<uint8_t>(e), target});
      b = e + 1;
    }
  }
}

}  // namespace

class AutomatonBuilder {
 public:
  explicit AutomatonBuilder(const CompileLimits& limits) : limits_(limits) {}

  Result<Automaton> run(const Grammar& g) {
    if (g.root < 0 || g.root >= static_cast<int32_t>(g.rules.size())) return invalid_argument("grammar has no root rule");
    a_.root_ = g.root;
    a_.rule_start_.assign(g.rules.size(), -1);
    for (const Rule& r : g.rules) a_.rule_names_.push_back(r.name);
    for (int32_t r = 0; r < static_cast<int32_t>(g.rules.size()); ++r) MX_RETURN_IF_ERROR(compile_rule(g, r));
    MX_RETURN_IF_ERROR(check_left_recursion());
    find_call_sites();
    return std::move(a_);
  }

 private:
  Status compile_rule(const Grammar& g, int32_t r) {
    ThompsonNfa nfa(limits_.max_nodes);
    const int32_t start = nfa.add(), accept = nfa.add();
    if (!nfa.build(g.rules[r].body, start, accept)) return too_large();
    for (const auto& st : nfa.states()) {
      for (const auto& [callee, target] : st.calls) {
        if (callee < 0 || callee >= static_cast<int32_t>(g.rules.size())) {
          return invalid_argument("rule '" + g.rules[r].name + "' refers to an undefined rule");
        }
      }
    }
    auto& states = nfa.states();
    std::vector<int32_t> node_of(states.size(), -1);
    std::vector<int32_t> work;
    auto node_for = [&](int32_t s) {
      if (node_of[s] < 0) {
        node_of[s] = static_cast<int32_t>(a_.nodes_.size());
        a_.nodes_.push_back(AutomatonNode{r});
        work.push_back(s);
      }
      return node_of[s];
    };
    a_.rule_start_[r] = node_for(start);
    std::vector<int32_t> closure, stack;
    std::vector<uint32_t> seen(states.size(), 0);
    uint32_t stamp = 0;
    while (!work.empty()) {
      if (static_cast<int64_t>(a_.nodes_.size()) > limits_.max_nodes) return too_large();
      const int32_t s = work.back();
      work.pop_back();
      ++stamp;
      closure.clear();
      stack.assign(1, s);
      seen[s] = stamp;
      while (!stack.empty()) {
        const int32_t t = stack.back();
        stack.pop_back();
        closure.push_back(t);
        for (int32_t u : states[t].eps) {
          if (seen[u] != stamp) {
            seen[u] = stamp;
            stack.push_back(u);
          }
        }
      }
      std::map<int32_t, ByteSet> bytes_by_target;
      std::vector<CallEdge> calls;
      bool final = false;
      for (int32_t t : closure) {
        final |= t == accept;
        for (const auto& [set, target] : states[t].bytes) {
          ByteSet& acc = bytes_by_target[node_for(target)];
          for (int w = 0; w < 4; ++w) acc.bits[w] |= set.bits[w];
        }
        for (const auto& [callee, target] : states[t].calls) calls.push_back(CallEdge{callee, node_for(target)});
      }
      std::sort(calls.begin(), calls.end(),
                [](const CallEdge& x, const CallEdge& y) { return std::pair(x.rule, x.ret) < std::pair(y.rule, y.ret); });
      calls.erase(std::unique(calls.begin(), calls.end(),
                              [](const CallEdge& x, const CallEdge& y) { return x.rule == y.rule && x.ret == y.ret; }),
                  calls.end());
      AutomatonNode& node = a_.nodes_[node_of[s]];
      node.final = final;
      node.byte_begin = static_cast<int32_t>(a_.byte_edges_.size());
      append_byte_ranges(bytes_by_target, &a_.byte_edges_);
      node.byte_end = static_cast<int32_t>(a_.byte_edges_.size());
      node.call_begin = static_cast<int32_t>(a_.call_edges_.size());
      a_.call_edges_.insert(a_.call_edges_.end(), calls.begin(), calls.end());
      node.call_end = static_cast<int32_t>(a_.call_edges_.size());
    }
    return Status::ok();
  }

  Status too_large() const {
    return invalid_argument("grammar too large: more than " + std::to_string(limits_.max_nodes) +
                            " automaton states (bounded lengths and counts are unrolled; lower maxLength/maxItems)");
  }

  // Nodes of `rule` reachable from its start without consuming a byte (through calls of nullable rules).
  std::vector<int32_t> epsilon_reach(int32_t rule, const std::vector<bool>& nullable) const {
    std::vector<int32_t> out{a_.rule_start_[rule]}, stack{a_.rule_start_[rule]};
    while (!stack.empty()) {
      const int32_t n = stack.back();
      stack.pop_back();
      for (const CallEdge* c = a_.call_edges_begin(n); c != a_.call_edges_end(n); ++c) {
        if (nullable[c->rule] && std::find(out.begin(), out.end(), c->ret) == out.end()) {
          out.push_back(c->ret);
          stack.push_back(c->ret);
        }
      }
    }
    return out;
  }

  Status check_left_recursion() {
    const int32_t nr = a_.num_rules();
    std::vector<bool> nullable(nr, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t r = 0; r < nr; ++r) {
        if (nullable[r]) continue;
        for (int32_t n : epsilon_reach(r, nullable)) {
          if (a_.nodes_[n].final) {
            nullable[r] = true;
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<int32_t>> left_calls(nr);
    for (int32_t r = 0; r < nr; ++r) {
      for (int32_t n : epsilon_reach(r, nullable)) {
        for (const CallEdge* c = a_.call_edges_begin(n); c != a_.call_edges_end(n); ++c) left_calls[r].push_back(c->rule);
      }
    }
    std::vector<int> color(nr, 0);  // 0 unvisited, 1 on the path, 2 done
    for (int32_t r = 0; r < nr; ++r) {
      if (color[r] != 0) continue;
      std::vector<std::pair<int32_t, size_t>> path{{r, 0}};
      color[r] = 1;
      while (!path.empty()) {
        auto& [cur, i] = path.back();
        if (i == left_calls[cur].size()) {
          color[cur] = 2;
          path.pop_back();
          continue;
        }
        const int32_t next = left_calls[cur][i++];
        if (color[next] == 1) {
          return invalid_argument("grammar is left-recursive through rule '" + a_.rule_names_[next] +
                                  "' (it can reach itself before consuming any text)");
        }
        if (color[next] == 0) {
          color[next] = 1;
          path.emplace_back(next, 0);
        }
      }
    }
    return Status::ok();
  }

  void find_call_sites() {
    a_.unique_return_.assign(a_.num_rules(), kNoCallSite);
    for (const CallEdge& c : a_.call_edges_) {
      int32_t& u = a_.unique_return_[c.rule];
      if (u == kNoCallSite) {
        u = c.ret;
      } else if (u != c.ret) {
        u = kManyCallSites;
      }
    }
  }

  CompileLimits limits_;
  Automaton a_;
};

Result<Automaton> Automaton::compile(const Grammar& grammar, const CompileLimits& limits) {
  return AutomatonBuilder(limits).run(grammar);
}

}  // namespace mx::grammar
