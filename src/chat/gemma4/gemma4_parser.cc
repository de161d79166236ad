#include "chat/gemma4/gemma4_parser.h"

#include <algorithm>
#include <cctype>
#include <string_view>

#include <nlohmann/json.hpp>

namespace mx::gemma4 {
namespace {

constexpr std::string_view kQuote = "<|\"|>";
constexpr size_t kMaxLabelBytes = 32;  // a channel label longer than this is reasoning the model wrote unlabelled
constexpr int kMaxDepth = 64;          // nesting of {} and [] in arguments

// A reader of the template's value notation: {key:value,...}, [value,...], <|"|>text<|"|>, and bare
// words (numbers, true, false, null/None; any other bare word is read as a string).
class NotationReader {
 public:
  explicit NotationReader(std::string_view text) : s_(text) {}

  bool object(nlohmann::ordered_json* out, int depth) {
    if (depth > kMaxDepth || !eat('{')) return false;
    *out = nlohmann::ordered_json::object();
    skip_space();
    if (eat('}')) return true;
    while (true) {
      skip_space();
      std::string key;
      if (starts(kQuote)) {
        if (!quoted(&key)) return false;
      } else {
        const size_t colon = s_.find(':', pos_);
        if (colon == std::string_view::npos) return false;
        key = trim(s_.substr(pos_, colon - pos_));
        if (key.empty() || key.find_first_of("{}[],") != std::string::npos) return false;
        pos_ = colon;
      }
      skip_space();
      if (!eat(':')) return false;
      nlohmann::ordered_json v;
      if (!value(&v, depth + 1)) return false;
      (*out)[key] = std::move(v);
      skip_space();
      if (eat('}')) return true;
      if (!eat(',')) return false;
    }
  }

  bool at_end() {
    skip_space();
    return pos_ == s_.size();
  }

 private:
  bool value(nlohmann::ordered_json* out, int depth) {
    skip_space();
    if (pos_ >= s_.size()) return false;
    if (starts(kQuote)) {
      std::string text;
      if (!quoted(&text)) return false;
      *out = std::move(text);
      return true;
    }
    if (s_[pos_] == '{') return object(out, depth);
    if (s_[pos_] == '[') {
      if (depth > kMaxDepth) return false;
      ++pos_;
      *out = nlohmann::ordered_json::array();
      skip_space();
      if (eat(']')) return true;
      while (true) {
        nlohmann::ordered_json item;
        if (!value(&item, depth + 1)) return false;
        out->push_back(std::move(item));
        skip_space();
        if (eat(']')) return true;
        if (!eat(',')) return false;
      }
    }
    const size_t end = s_.find_first_of(",}]", pos_);
    const std::string word = trim(s_.substr(pos_, end == std::string_view::npos ? std::string_view::npos : end - pos_));
    if (word.empty()) return false;
    pos_ = end == std::string_view::npos ? s_.size() : end;
    if (word == "true" || word == "True") *out = true;
    else if (word == "false" || word == "False") *out = false;
    else if (word == "null" || word == "None") *out = nullptr;
    else {
      auto number = nlohmann::ordered_json::parse(word, nullptr, /*allow_exceptions=*/false);
      if (!number.is_discarded() && number.is_number()) *out = std::move(number);
      else *out = word;
    }
    return true;
  }

  bool quoted(std::string* out) {
    pos_ += kQuote.size();
    const size_t close = s_.find(kQuote, pos_);
    if (close == std::string_view::npos) return false;
    *out = std::string(s_.substr(pos_, close - pos_));
    pos_ = close + kQuote.size();
    return true;
  }

  static std::string trim(std::string_view t) {
    const size_t b = t.find_first_not_of(" \t\r\n");
    if (b == std::string_view::npos) return "";
    const size_t e = t.find_last_not_of(" \t\r\n");
    return std::string(t.substr(b, e - b + 1));
  }
  bool starts(std::string_view p) const { return s_.substr(pos_, p.size()) == p; }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

}  // namespace

bool parse_tool_call(const std::string& body, std::string* name, std::string* arguments_json) {
  std::string_view s = body;
  const size_t first = s.find_first_not_of(" \n");
  if (first == std::string_view::npos) return false;
  s.remove_prefix(first);
  if (s.substr(0, 5) != "call:") return false;
  s.remove_prefix(5);
  const size_t brace = s.find('{');
  if (brace == std::string_view::npos || !valid_name(s.substr(0, brace))) return false;
  NotationReader reader(s.substr(brace));
  nlohmann::ordered_json args;
  if (!reader.object(&args, 0) || !reader.at_end()) return false;
  *name = std::string(s.substr(0, brace));
  *arguments_json = args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return true;
}

bool StreamParser::is_end(int32_t id) const {
  return std::find(ids_.ends.begin(), ids_.ends.end(), id) != ids_.ends.end();
}

void StreamParser::emit(ChatEventType type, std::string text, std::vector<ChatEvent>* events) {
  if (text.empty() || !events) return;
  if (!events->empty() && events->back().type == type && type != ChatEventType::kToolCallStart) {
    events->back().text += text;
    return;
  }
  events->push_back({type, std::move(text)});
}

void StreamParser::emit_reasoning(std::string text, std::vector<ChatEvent>* events) {
  if (text.empty()) return;
  if (held_newline_) text.insert(text.begin(), '\n');
  held_newline_ = text.back() == '\n';
  if (held_newline_) text.pop_back();
  emit(ChatEventType::kReasoningDelta, std::move(text), events);
}

void StreamParser::end_tool_call(bool closed, std::vector<ChatEvent>* events) {
  std::string name, args;
  // A call the stream ended before <tool_call|> still counts when what it holds is complete.
  if (parse_tool_call(call_, &name, &args)) {
    if (events) {
      events->push_back({ChatEventType::kToolCallStart, name, tool_index_});
      events->push_back({ChatEventType::kToolCallArgumentsDelta, args, tool_index_});
    }
    ++tool_index_;
  } else {  // not a call after all: what the model wrote is content
    ++unplaced_;
    emit(ChatEventType::kContentDelta, "<|tool_call>" + call_ + (closed ? "<tool_call|>" : ""), events);
  }
  call_.clear();
}

void StreamParser::close_open(std::vector<ChatEvent>* events) {
  std::string tail;
  utf8_.finish(&tail);
  switch (state_) {
    case State::kChannelLabel:  // a label cut off: what it held is reasoning
      emit_reasoning(label_ + tail, events);
      label_.clear();
      break;
    case State::kReasoning: emit_reasoning(std::move(tail), events); break;
    case State::kToolCall:
      call_ += tail;
      end_tool_call(/*closed=*/false, events);
      break;
    case State::kContent:
    case State::kEnded: emit(ChatEventType::kContentDelta, std::move(tail), events); break;
  }
  held_newline_ = false;
}

void StreamParser::push(int32_t id, std::vector<ChatEvent>* events) {
  if (state_ == State::kToolCall && id == ids_.quote) {
    call_ += kQuote;
    return;
  }
  if (state_ == State::kToolCall && id == ids_.tool_call_close) {
    std::string tail;
    utf8_.finish(&tail);
    call_ += tail;
    end_tool_call(/*closed=*/true, events);
    state_ = State::kContent;
    return;
  }
  if (is_end(id)) {
    close_open(events);
    state_ = State::kEnded;
    if (events) events->push_back({ChatEventType::kMessageEnd, "", -1, id});
    return;
  }
  if (id == ids_.channel_open && (state_ == State::kContent || state_ == State::kEnded)) {
    close_open(events);
    state_ = State::kChannelLabel;
    label_.clear();
    return;
  }
  if (id == ids_.channel_close && (state_ == State::kChannelLabel || state_ == State::kReasoning)) {
    std::string tail;
    utf8_.finish(&tail);
    if (state_ == State::kChannelLabel) {
      // "<|channel>thought<channel|>": an empty thought. Anything longer than a label is reasoning.
      label_ += tail;
      if (label_.find_first_of(" \n") != std::string::npos || label_.size() > kMaxLabelBytes) emit_reasoning(label_, events);
      label_.clear();
    } else {
      emit_reasoning(std::move(tail), events);
    }
    held_newline_ = false;  // the newline before <channel|> is the template's, not the thought's
    state_ = State::kContent;
    return;
  }
  if (id == ids_.tool_call_open && state_ != State::kToolCall) {
    close_open(events);
    state_ = State::kToolCall;
    call_.clear();
    return;
  }
  if (tok_->is_special(id)) {  // a control token out of place carries no text of the answer
    ++unplaced_;
    return;
  }
  on_text(id, events);
}

void StreamParser::on_text(int32_t id, std::vector<ChatEvent>* events) {
  bytes_.clear();
  if (!tok_->append_token_bytes(id, &bytes_)) {
    ++unplaced_;
    return;
  }
  std::string text;
  utf8_.push(bytes_, &text);
  switch (state_) {
    case State::kChannelLabel: {
      label_ += text;
      const size_t nl = label_.find('\n');
      if (nl != std::string::npos && nl <= kMaxLabelBytes && label_.find(' ') >= nl) {
        std::string rest = label_.substr(nl + 1);
        label_.clear();
        state_ = State::kReasoning;
        emit_reasoning(std::move(rest), events);
      } else if (label_.size() > kMaxLabelBytes || label_.find(' ') != std::string::npos || nl != std::string::npos) {
        std::string all = std::move(label_);  // no label: it was all reasoning
        label_.clear();
        state_ = State::kReasoning;
        emit_reasoning(std::move(all), events);
      }
      break;
    }
    case State::kReasoning: emit_reasoning(std::move(text), events); break;
    case State::kToolCall: call_ += text; break;
    case State::kEnded:  // text after the end: still the model's, still content
    case State::kContent: emit(ChatEventType::kContentDelta, std::move(text), events); break;
  }
}

void StreamParser::finish(std::vector<ChatEvent>* events) {
  if (state_ == State::kEnded) {
    close_open(events);
    return;
  }
  close_open(events);
  state_ = State::kEnded;
  if (events) events->push_back({ChatEventType::kMessageEnd, "", -1, -1});
}

}  // namespace mx::gemma4
