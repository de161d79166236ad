// A Grammar compiled to a byte-level pushdown automaton: every rule becomes an epsilon-free NFA whose
// nodes consume a byte (byte edges: a range and a target node), call another rule (call edges: the rule
// and the node to return to) or end the rule (final). A match is a stack of nodes (matcher.h): the top
// consumes bytes, calls push, finishing a rule pops to the return node below. Left recursion is refused
// at compile time (a rule that could call itself before consuming a byte would grow the stack forever),
// and so are grammars larger than CompileLimits: compile time and memory stay bounded for any input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"

namespace mx::grammar {

struct CompileLimits {
  int64_t max_nodes = 400000;  // NFA nodes (before and after epsilon removal); bounds time and memory
};

struct ByteEdge {
  uint8_t lo = 0;
  uint8_t hi = 0;
  int32_t target = 0;
};

struct CallEdge {
  int32_t rule = 0;
  int32_t ret = 0;  // the node of the calling rule to continue at once `rule` has finished
};

struct AutomatonNode {
  int32_t rule = 0;
  bool final = false;
  int32_t byte_begin = 0, byte_end = 0;  // [begin, end) into Automaton::byte_edges
  int32_t call_begin = 0, call_end = 0;  // [begin, end) into Automaton::call_edges
};

// Where a rule returns to when it finishes, if that is known from the grammar alone.
inline constexpr int32_t kNoCallSite = -1;     // never called (the root): finishing ends the match
inline constexpr int32_t kManyCallSites = -2;  // called from several places: the stack decides

class Automaton {
 public:
  static Result<Automaton> compile(const Grammar& grammar, const CompileLimits& limits = {});

  int32_t root() const { return root_; }
  int32_t num_rules() const { return static_cast<int32_t>(rule_start_.size()); }
  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }
  const AutomatonNode& node(int32_t n) const { return nodes_[n]; }
  int32_t rule_start(int32_t rule) const { return rule_start_[rule]; }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  // The one return node of every call of `rule`, or kNoCallSite / kManyCallSites.
  int32_t unique_return(int32_t rule) const { return unique_return_[rule]; }
  const ByteEdge* byte_edges_begin(int32_t n) const { return byte_edges_.data() + nodes_[n].byte_begin; }
  const ByteEdge* byte_edges_end(int32_t n) const { return byte_edges_.data() + nodes_[n].byte_end; }
  const CallEdge* call_edges_begin(int32_t n) const { return call_edges_.data() + nodes_[n].call_begin; }
  const CallEdge* call_edges_end(int32_t n) const { return call_edges_.data() + nodes_[n].call_end; }
  bool has_byte_edges(int32_t n) const { return nodes_[n].byte_end > nodes_[n].byte_begin; }

 private:
  friend class AutomatonBuilder;
  int32_t root_ = 0;
  std::vector<AutomatonNode> nodes_;
  std::vector<ByteEdge> byte_edges_;
  std::vector<CallEdge> call_edges_;
  std::vector<int32_t> rule_start_;
  std::vector<int32_t> unique_return_;
  std::vector<std::string> rule_names_;
};

}  // namespace mx::grammar
