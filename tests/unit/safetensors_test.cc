// Safetensors reading and writing: round trips, sharded checkpoints through the index, header validation.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "test_util.h"

namespace mx {
namespace {

using test::TempDir;

TEST(Safetensors, WriteThenReadRoundTrips) {
  TempDir dir;
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<int32_t> b = {7, 8, 9};
  ASSERT_TRUE(write_safetensors(dir.file("x.safetensors"),
                                {{"a", TensorView(a.data(), DType::kF32, {2, 3})},
                                 {"b", TensorView(b.data(), DType::kI32, {3})}},
                                {{"format", "pt"}})
                  .is_ok());
  auto file = SafetensorsFile::open(dir.file("x.safetensors"));
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  const TensorView va = (*file)->view("a");
  EXPECT_EQ(va.shape(), (Shape{2, 3}));
  EXPECT_EQ(va.dtype(), DType::kF32);
  EXPECT_EQ(std::memcmp(va.data(), a.data(), 24), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(va.data()) % 8, 0u);  // header padded to keep data aligned
  const TensorView vb = (*file)->view("b");
  EXPECT_EQ(std::memcmp(vb.data(), b.data(), 12), 0);
}

TEST(Safetensors, DuplicateNamesRejectedOnWrite) {
  TempDir dir;
  float x = 1;
  const TensorView v(&x, DType::kF32, {1});
  EXPECT_FALSE(write_safetensors(dir.file("x.safetensors"), {{"a", v}, {"a", v}}).is_ok());
}

TEST(Safetensors, ShardedCheckpointThroughIndex) {
  TempDir dir;
  float x[2] = {1, 2}, y[3] = {3, 4, 5};
  ASSERT_TRUE(write_safetensors(dir.file("model-00001-of-00002.safetensors"), {{"x", TensorView(x, DType::kF32, {2})}}).is_ok());
  ASSERT_TRUE(write_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"y", TensorView(y, DType::kF32, {3})}}).is_ok());
  test::write_file(dir.file("model.safetensors.index.json"),
                   R"({"metadata": {"total_size": 20}, "weight_map": {"x": "model-00001-of-00002.safetensors",
                       "y": "model-00002-of-00002.safetensors"}})");
  auto ckpt = Checkpoint::open_dir(dir.path());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  EXPECT_EQ(ckpt->names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(ckpt->get("y")->ptr<const float>()[2], 5.0f);
  EXPECT_EQ(ckpt->total_bytes(), 20);
  EXPECT_FALSE(ckpt->get("z").is_ok());
}

TEST(Safetensors, IndexNamingATensorItsShardLacks) {
  TempDir dir;
  float x[2] = {1, 2};
  ASSERT_TRUE(write_safetensors(dir.file("a.safetensors"), {{"x", TensorView(x, DType::kF32, {2})}}).is_ok());
  test::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map": {"x": "a.safetensors", "w": "a.safetensors"}})");
  auto ckpt = Checkpoint::open_dir(dir.path());
  ASSERT_FALSE(ckpt.is_ok());
  EXPECT_NE(ckpt.status().message().find("tensor 'w' is listed in the index"), std::string::npos);
}

TEST(Safetensors, IndexShardOutsideTheDirectory) {
  TempDir dir;
  test::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map": {"x": "../elsewhere.safetensors"}})");
  auto ckpt = Checkpoint::open_dir(dir.path());
  ASSERT_FALSE(ckpt.is_ok());
  EXPECT_NE(ckpt.status().message().find("must be a file in the model directory"), std::string::npos);
}

TEST(Safetensors, TensorInTwoShards) {
  TempDir dir;
  float x[2] = {1, 2};
  ASSERT_TRUE(write_safetensors(dir.file("a.safetensors"), {{"x", TensorView(x, DType::kF32, {2})}}).is_ok());
  ASSERT_TRUE(write_safetensors(dir.file("b.safetensors"), {{"x", TensorView(x, DType::kF32, {2})}}).is_ok());
  auto ckpt = Checkpoint::open_dir(dir.path());
  ASSERT_FALSE(ckpt.is_ok());
  EXPECT_NE(ckpt.status().message().find("appears in more than one file"), std::string::npos);
}

// Headers written by hand: every malformed variant is an error, none crashes.
std::string raw_file(const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(bytes.data(), &len, 8);
  return bytes + header + std::string(data_bytes, '\0');
}

TEST(Safetensors, MalformedHeadersAreErrors) {
  TempDir dir;
  const std::pair<std::string, std::string> cases[] = {
      {R"([])", "not a JSON object"},
      {R"({"a": 3})", "header entry is not an object"},
      {R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", "missing or non-string dtype"},
      {R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", "missing or non-array shape"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", "data_offsets must be [begin, end]"},
      {R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "shape entries must be integers"},
      {R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", "shape entries must be integers"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", "begin > end"},
      {R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 4]}})", "too large"},
      {R"({"a": {"dtype": "F32", "shape": [1,1,1,1,1,1,1], "data_offsets": [0, 4]}})", "rank 7 is too large"},
      {R"({"__metadata__": {"k": 1}})", "is not a string"},
  };
  for (const auto& [header, expected] : cases) {
    test::write_file(dir.file("x.safetensors"), raw_file(header, 4));
    auto file = SafetensorsFile::open(dir.file("x.safetensors"));
    ASSERT_FALSE(file.is_ok()) << header;
    EXPECT_NE(file.status().message().find(expected), std::string::npos) << header << " -> " << file.status().message();
  }
}

TEST(Safetensors, EmptyTensorsAreAllowed) {
  TempDir dir;
  test::write_file(dir.file("x.safetensors"),
                   raw_file(R"({"a": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]},
                               "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4));
  auto file = SafetensorsFile::open(dir.file("x.safetensors"));
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ((*file)->view("a").numel(), 0);
}

}  // namespace
}  // namespace mx
