// Chat stop strings, matched on the answer's content only. a model writes its reasoning and format headers
// before the answer; a stop string such as "\n\n" would end the request inside the reasoning if it were
// matched on all generated text, leaving no answer. Text that could still be the start of a stop string
// is held back until it cannot be.
#pragma once

#include <string>
#include <vector>

namespace mx::server {

class ContentStopMatcher {
 public:
  explicit ContentStopMatcher(std::vector<std::string> stops);

  bool active() const { return !stops_.empty(); }
  bool matched() const { return matched_; }
  // Takes more content; returns what may be sent now. After a match, the text before the stop string is
  // returned, matched() turns true and every later call returns "".
  std::string feed(const std::string& text);
  // The held-back tail, when no stop can follow it any more (another kind of output, or the end).
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
};

}  // namespace mx::server
