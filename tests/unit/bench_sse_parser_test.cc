// The SSE parser fed the same stream whole, split at every byte, and cut into random pieces: every way of
// splitting gives the same events (splits inside "data:", CRLF pairs and UTF-8 sequences included).
#include <gtest/gtest.h>

#include <random>

#include "tools/bench/sse_parser.h"

namespace mx::bench {
namespace {

// Every feature at once: BOM, comments, CRLF / LF / lone CR, an event type, fields without a space or
// without a colon, multi-line data, id carried over, retry and unknown fields, multi-byte UTF-8.
const std::string kStream =
    "\xEF\xBB\xBF: hello comment\r\n"
    "\r\n"
    "data: first\r\n\r\n"
    "event: update\ndata:no-space\ndata:  two spaces\n\n"
    "id: 7\rdata: cr only\r\r"
    "data\n\n"
    "data: {\"text\":\"h\xC3\xA9llo \xF0\x9F\x98\x80\"}\r\n\r\n"
    ": ping\n\n"
    "retry: 100\nunknown: x\ndata: [DONE]\n\n";

std::vector<SseEvent> expected_events() {
  return {
      {"", "first", ""},
      {"update", "no-space\n two spaces", ""},
      {"", "cr only", "7"},
      {"", "", "7"},
      {"", "{\"text\":\"h\xC3\xA9llo \xF0\x9F\x98\x80\"}", "7"},
      {"", "[DONE]", "7"},
  };
}

void expect_same(const std::vector<SseEvent>& got, const std::vector<SseEvent>& want, const std::string& how) {
  ASSERT_EQ(got.size(), want.size()) << how;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].event, want[i].event) << how << " event " << i;
    EXPECT_EQ(got[i].data, want[i].data) << how << " event " << i;
    EXPECT_EQ(got[i].id, want[i].id) << how << " event " << i;
  }
}

std::vector<SseEvent> parse_in_pieces(const std::string& stream, const std::vector<size_t>& cuts, int64_t* comments) {
  SseParser parser;
  std::vector<SseEvent> events;
  size_t from = 0;
  for (size_t cut : cuts) {
    EXPECT_TRUE(parser.feed(std::string_view(stream).substr(from, cut - from), &events));
    from = cut;
  }
  EXPECT_TRUE(parser.feed(std::string_view(stream).substr(from), &events));
  parser.finish(&events);
  if (comments) *comments = parser.comments();
  return events;
}

TEST(SseParser, WholeStream) {
  int64_t comments = 0;
  expect_same(parse_in_pieces(kStream, {}, &comments), expected_events(), "whole");
  EXPECT_EQ(comments, 2);
}

TEST(SseParser, EverySingleSplitPoint) {
  for (size_t cut = 0; cut <= kStream.size(); ++cut) expect_same(parse_in_pieces(kStream, {cut}, nullptr), expected_events(), "cut at " + std::to_string(cut));
}

TEST(SseParser, OneByteAtATimeAndRandomPieces) {
  std::vector<size_t> every;
  for (size_t i = 1; i < kStream.size(); ++i) every.push_back(i);
  expect_same(parse_in_pieces(kStream, every, nullptr), expected_events(), "byte at a time");
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<size_t> cuts;
    for (size_t at = 0;;) {
      at += 1 + rng() % 9;
      if (at >= kStream.size()) break;
      cuts.push_back(at);
    }
    expect_same(parse_in_pieces(kStream, cuts, nullptr), expected_events(), "trial " + std::to_string(trial));
  }
}

TEST(SseParser, CarriageReturnAtTheEndOfAReadThenLineFeed) {
  SseParser parser;
  std::vector<SseEvent> events;
  ASSERT_TRUE(parser.feed("data: a\r", &events));
  ASSERT_TRUE(parser.feed("\ndata: b\r", &events));
  ASSERT_TRUE(parser.feed("\n", &events));
  EXPECT_TRUE(events.empty());  // the LF after each CR is part of that line ending, not an empty line
  ASSERT_TRUE(parser.feed("\r\n", &events));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, "a\nb");
}

TEST(SseParser, CleanEndDispatchesTheLastEvent) {
  for (const std::string tail : {"data: [DONE]", "data: [DONE]\n", "data: [DONE]\r\n"}) {
    SseParser parser;
    std::vector<SseEvent> events;
    ASSERT_TRUE(parser.feed("data: x\n\n" + tail, &events));
    ASSERT_EQ(events.size(), 1u) << tail;
    parser.finish(&events);
    ASSERT_EQ(events.size(), 2u) << tail;
    EXPECT_EQ(events[1].data, "[DONE]");
  }
}

TEST(SseParser, OversizedEventIsAnError) {
  SseParser line_limit(64);
  std::vector<SseEvent> events;
  EXPECT_FALSE(line_limit.feed("data: " + std::string(100, 'x'), &events));
  EXPECT_NE(line_limit.error().find("larger than 64"), std::string::npos);
  EXPECT_FALSE(line_limit.feed("\n\n", &events));  // stays failed
  EXPECT_TRUE(events.empty());

  SseParser data_limit(64);
  std::string many;
  for (int i = 0; i < 10; ++i) many += "data: 0123456789\n";
  EXPECT_FALSE(data_limit.feed(many, &events));
  EXPECT_TRUE(events.empty());
}

TEST(SseParser, CommentsAndEmptyLinesAloneDispatchNothing) {
  SseParser parser;
  std::vector<SseEvent> events;
  ASSERT_TRUE(parser.feed(": ping\n\n\n\r\n:\n\n", &events));
  parser.finish(&events);
  EXPECT_TRUE(events.empty());
  EXPECT_EQ(parser.comments(), 2);
}

}  // namespace
}  // namespace mx::bench
