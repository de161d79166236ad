#include "chat/harmony/harmony_parser.h"

#include "chat/harmony/harmony_tokens.h"

namespace mx {
namespace {

constexpr std::string_view kChannelMarker = "<|channel|>";
constexpr std::string_view kConstrainMarker = "<|constrain|>";
// A header is a handful of tokens ("<|channel|>commentary to=functions.x <|constrain|>json" is about ten).
// Past this, the "header" is really text the model wrote without one, and it is released as content.
constexpr int kMaxHeaderTokens = 32;
constexpr size_t kMaxHeaderBytes = 256;

bool is_end_token(int32_t id) {
  return id == harmony::kEnd || id == harmony::kReturn || id == harmony::kCall || id == harmony::kEndOfText;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// A channel name, tolerating junk before it (models have written "––commentary").
std::string known_channel(std::string_view word) {
  for (std::string_view name : {"analysis", "commentary", "final"}) {
    if (word == name) return std::string(name);
  }
  size_t i = 0;
  while (i < word.size() && !std::isalnum(static_cast<unsigned char>(word[i]))) ++i;
  for (std::string_view name : {"analysis", "commentary", "final"}) {
    if (word.substr(i) == name) return std::string(name);
  }
  return "";
}

bool is_tool_recipient(const std::string& r) { return !r.empty() && r != "assistant" && r != "user" && r != "all"; }

}  // namespace

void HarmonyStreamParser::push(std::span<const int32_t> ids, std::vector<HarmonyEvent>* events) {
  for (const int32_t id : ids) push(id, events);
}

void HarmonyStreamParser::push(int32_t id, std::vector<HarmonyEvent>* events) {
  if (tok_->is_special(id)) {
    on_special(id, events);
  } else {
    on_text(id, events);
  }
}

void HarmonyStreamParser::on_text(int32_t id, std::vector<HarmonyEvent>* events) {
  bytes_.clear();
  const bool known = tok_->append_token_bytes(id, &bytes_);
  switch (state_) {
    case State::kHeader:
      if (!known) {  // an id outside the vocabulary carries no text; drop it
        ++result_.unplaced_tokens;
        return;
      }
      header_.text += bytes_;
      header_.text_ids.push_back(id);
      if (++header_.tokens > kMaxHeaderTokens || header_.text.size() > kMaxHeaderBytes) {
        header_to_content(events);
        state_ = State::kBody;
        implicit_body_ = true;
        target_ = Target::kContent;
      }
      return;
    case State::kBetween:  // text with no message around it: an implicit content message
      ++result_.messages;
      state_ = State::kBody;
      implicit_body_ = true;
      target_ = Target::kContent;
      break;
    case State::kBody:
      break;
  }
  if (implicit_body_ || !known) ++result_.unplaced_tokens;
  std::string text;
  if (known) {
    utf8_.push(bytes_, &text);
  } else {
    utf8_.finish(&text);
    text.append(kReplacementChar);
  }
  emit(target_, std::move(text), events);
}

void HarmonyStreamParser::on_special(int32_t id, std::vector<HarmonyEvent>* events) {
  switch (state_) {
    case State::kHeader:
      if (id == harmony::kMessage) {
        begin_body(parse_header(header_), events);
      } else if (id == harmony::kChannel || id == harmony::kConstrain) {
        header_.text += id == harmony::kChannel ? kChannelMarker : kConstrainMarker;
        ++header_.tokens;
      } else if (id == harmony::kStart) {  // a new message before this one had a body
        header_to_content(events);
        start_header(/*role_known=*/false);
      } else if (is_end_token(id)) {
        // A header with no body. When it is a real header (say a tool call with no arguments), it is an empty
        // message; otherwise its text was content.
        const Parsed parsed = parse_header(header_);
        if (parsed.ok && (!parsed.channel.empty() || !parsed.recipient.empty())) {
          begin_body(parsed, events);
          end_message(id, events);
        } else {
          header_to_content(events);
          result_.last_end_token = id;
          state_ = State::kBetween;
        }
      } else {
        ++result_.unplaced_tokens;  // reserved and other specials have no place in a header
      }
      return;
    case State::kBody:
      if (is_end_token(id)) {
        end_message(id, events);
      } else if (id == harmony::kStart) {  // the end token was skipped
        end_message(-1, events);
        start_header(/*role_known=*/false);
      } else if (id == harmony::kChannel) {  // "<|start|>assistant" was skipped as well
        ++result_.unplaced_tokens;
        end_message(-1, events);
        start_header(/*role_known=*/true);
        header_.text += kChannelMarker;
        ++header_.tokens;
      } else {
        ++result_.unplaced_tokens;  // <|message|>, <|constrain|>, reserved ids: nothing to place
      }
      return;
    case State::kBetween:
      if (id == harmony::kStart) {
        start_header(/*role_known=*/false);
      } else if (id == harmony::kChannel) {
        ++result_.unplaced_tokens;
        start_header(/*role_known=*/true);
        header_.text += kChannelMarker;
        ++header_.tokens;
      } else if (id == harmony::kMessage) {  // a body with no header at all
        ++result_.unplaced_tokens;
        ++result_.messages;
        state_ = State::kBody;
        implicit_body_ = true;
        target_ = Target::kContent;
      } else {
        ++result_.unplaced_tokens;  // stray <|end|>, <|return|>, <|constrain|>, reserved ids
        if (is_end_token(id)) result_.last_end_token = id;
      }
      return;
  }
}

void HarmonyStreamParser::start_header(bool role_known) {
  header_ = Header();
  header_.role_known = role_known;
  state_ = State::kHeader;
}

HarmonyStreamParser::Parsed HarmonyStreamParser::parse_header(const Header& header) {
  Parsed p;
  // Split the header text into segments at the markers; each segment remembers the marker before it.
  enum Kind { kRole, kAfterChannel, kAfterConstrain };
  std::vector<std::pair<Kind, std::string_view>> segments;
  std::string_view rest = header.text;
  Kind kind = kRole;
  while (true) {
    const size_t c = rest.find(kChannelMarker);
    const size_t k = rest.find(kConstrainMarker);
    const size_t at = std::min(c, k);
    segments.push_back({kind, rest.substr(0, at)});
    if (at == std::string_view::npos) break;
    kind = at == c ? kAfterChannel : kAfterConstrain;
    rest.remove_prefix(at + (at == c ? kChannelMarker.size() : kConstrainMarker.size()));
  }
  bool role_pending = !header.role_known;
  bool other_role = false;
  auto leftover = [&](std::string_view word) {
    if (!p.leftover.empty()) p.leftover += " ";
    p.leftover.append(word);
    p.ok = false;
  };
  for (const auto& [seg_kind, seg] : segments) {
    bool first_in_segment = true;
    size_t i = 0;
    while (i < seg.size()) {
      while (i < seg.size() && is_space(seg[i])) ++i;
      size_t j = i;
      while (j < seg.size() && !is_space(seg[j])) ++j;
      if (j == i) break;
      const std::string_view word = seg.substr(i, j - i);
      i = j;
      const bool first = first_in_segment;
      first_in_segment = false;
      if (role_pending) {
        role_pending = false;
        if (word == "assistant") continue;
        other_role = true;  // a user/system/tool turn the model should not write: its text is content
        leftover(word);
        continue;
      }
      if (word.substr(0, 3) == "to=" && word.size() > 3 && p.recipient.empty()) {
        p.recipient = std::string(word.substr(3));
      } else if (seg_kind == kAfterChannel && first && p.channel.empty() && !known_channel(word).empty()) {
        p.channel = known_channel(word);
      } else if (seg_kind == kAfterConstrain && first && p.content_type.empty()) {
        p.content_type = std::string(kConstrainMarker) + std::string(word);
      } else if (p.content_type.empty() && (word == "json" || word == "code")) {
        p.content_type = std::string(word);
      } else {
        leftover(word);
      }
    }
  }
  if (other_role) {
    p.target = Target::kContent;
  } else if (is_tool_recipient(p.recipient)) {
    p.target = Target::kToolCall;
  } else if (p.channel == "analysis") {
    p.target = Target::kReasoning;
  } else {
    p.target = Target::kContent;  // final, commentary preambles, and messages with no channel
  }
  return p;
}

void HarmonyStreamParser::begin_body(const Parsed& parsed, std::vector<HarmonyEvent>* events) {
  result_.header_bytes += static_cast<int64_t>(header_.text.size());
  for (std::string_view marker : {kChannelMarker, kConstrainMarker}) {
    for (size_t at = header_.text.find(marker); at != std::string::npos; at = header_.text.find(marker, at + 1))
      result_.header_bytes -= static_cast<int64_t>(marker.size());
  }
  if (!parsed.ok) ++result_.unplaced_tokens;
  if (!parsed.leftover.empty()) {
    result_.header_bytes -= static_cast<int64_t>(parsed.leftover.size());
    emit(Target::kContent, utf8_make_valid(parsed.leftover), events);
  }
  ++result_.messages;
  state_ = State::kBody;
  implicit_body_ = false;
  target_ = parsed.target;
  utf8_ = Utf8StreamDecoder();
  if (target_ == Target::kToolCall) {
    HarmonyToolCall call;
    call.recipient = parsed.recipient;
    call.name = parsed.recipient.rfind("functions.", 0) == 0 ? parsed.recipient.substr(10) : parsed.recipient;
    call.channel = parsed.channel;
    call.content_type = parsed.content_type;
    tool_index_ = static_cast<int>(result_.tool_calls.size());
    result_.tool_calls.push_back(std::move(call));
    if (events)
      events->push_back({HarmonyEventType::kToolCallStart, utf8_make_valid(result_.tool_calls.back().name), tool_index_});
  }
  header_ = Header();
}

void HarmonyStreamParser::header_to_content(std::vector<HarmonyEvent>* events) {
  // Only the text tokens are released; markers inside the header were structure and are counted.
  std::string text;
  for (const int32_t id : header_.text_ids) tok_->append_token_bytes(id, &text);
  result_.unplaced_tokens += header_.tokens;
  if (!text.empty()) {
    if (state_ != State::kBody) ++result_.messages;
    emit(Target::kContent, utf8_make_valid(text), events);
  }
  header_ = Header();
}

void HarmonyStreamParser::end_message(int32_t end_token, std::vector<HarmonyEvent>* events) {
  std::string tail;
  utf8_.finish(&tail);
  emit(target_, std::move(tail), events);
  if (target_ == Target::kToolCall && tool_index_ >= 0) result_.tool_calls[tool_index_].closed = end_token >= 0;
  if (end_token >= 0) result_.last_end_token = end_token;
  if (events) events->push_back({HarmonyEventType::kMessageEnd, "", target_ == Target::kToolCall ? tool_index_ : -1, end_token});
  state_ = State::kBetween;
  implicit_body_ = false;
  target_ = Target::kContent;
  tool_index_ = -1;
}

void HarmonyStreamParser::emit(Target target, std::string text, std::vector<HarmonyEvent>* events) {
  if (text.empty()) return;
  HarmonyEventType type = HarmonyEventType::kContentDelta;
  int index = -1;
  switch (target) {
    case Target::kReasoning:
      result_.reasoning += text;
      type = HarmonyEventType::kReasoningDelta;
      break;
    case Target::kContent:
      result_.content += text;
      break;
    case Target::kToolCall:
      if (tool_index_ < 0) {  // cannot happen: a tool target always has a call; keep the text anyway
        result_.content += text;
        break;
      }
      result_.tool_calls[tool_index_].arguments += text;
      type = HarmonyEventType::kToolCallArgumentsDelta;
      index = tool_index_;
      break;
  }
  if (events) events->push_back({type, std::move(text), index});
}

void HarmonyStreamParser::finish(std::vector<HarmonyEvent>* events) {
  switch (state_) {
    case State::kHeader: {
      const Parsed parsed = parse_header(header_);
      if (header_.tokens > 0 && parsed.ok && (!parsed.channel.empty() || !parsed.recipient.empty())) {
        begin_body(parsed, events);  // e.g. cut off right after "<|channel|>final": an empty message
        end_message(-1, events);
      } else {
        header_to_content(events);
      }
      break;
    }
    case State::kBody:
      end_message(-1, events);
      break;
    case State::kBetween:
      break;
  }
  state_ = State::kBetween;
}

}  // namespace mx
