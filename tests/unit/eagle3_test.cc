// EAGLE-3 draft (model/eagle3): config parsing and its refusals, the loader's checks against the target,
// one forward pass against a plain fp32 reference written out here (the concatenation order, the residual,
// the chain's pre-norm hidden state, d2t), the drafter's chain (its passes feed each other on the device)
// against the model driven pass by pass from the host, the drafter's rollback: after rejected drafts its
// proposals equal those of a fresh drafter that saw only the kept tokens, and its chain graphs (replayed on
// the CPU) draft what its eager chain drafts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/eagle3/eagle3_drafter.h"
#include "model/eagle3/eagle3_model.h"
#include "model/eagle3/eagle3_synthetic.h"
#include "model/rope.h"
#include "model/synthetic_writer.h"
#include "replaying_backend.h"
#include "spec/drafter.h"
#include "test_util.h"

namespace mx {
namespace {

TEST(Eagle3Ops, SiluMulAndConvertOnTheCpu) {
  auto backend = make_cpu_backend(CpuBackendOptions{1});
  float gate[4] = {0.0f, 1.0f, -2.0f, 20.0f}, up[4] = {3.0f, 2.0f, 1.0f, 0.5f}, out[4];
  ASSERT_TRUE(backend->silu_mul(TensorView(gate, DType::kF32, {4}), TensorView(up, DType::kF32, {4}),
                                TensorView(out, DType::kF32, {4})).is_ok());
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(out[i], gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i], 1e-6) << i;
  // f32 -> bf16 rounds to nearest, ties to even; bf16 -> f32 is exact.
  float x[3] = {1.00390625f, 1.01171875f, -3.0f};  // 1 + 2^-8 (a tie: down to 1), 1 + 3 * 2^-8 (a tie: up)
  uint16_t b[3];
  ASSERT_TRUE(backend->convert(TensorView(x, DType::kF32, {3}), TensorView(b, DType::kBF16, {3})).is_ok());
  EXPECT_EQ(b[0], 0x3f80);
  EXPECT_EQ(b[1], 0x3f82);
  float back[3];
  ASSERT_TRUE(backend->convert(TensorView(b, DType::kBF16, {3}), TensorView(back, DType::kF32, {3})).is_ok());
  EXPECT_EQ(back[2], -3.0f);
  DType bool_type;
  ASSERT_TRUE(dtype_from_safetensors("BOOL", &bool_type));  // EAGLE-3's t2d
  EXPECT_EQ(bool_type, DType::kBool);
  EXPECT_EQ(dtype_bytes(DType::kBool, 5), 5);
}

const char* kPublishedStyleConfig = R"({
  "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 2880, "intermediate_size": 17280,
  "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 1,
  "vocab_size": 201088, "draft_vocab_size": 32000, "rms_norm_eps": 1e-05, "hidden_act": "silu",
  "max_position_embeddings": 131072, "rope_theta": 150000,
  "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                   "beta_fast": 32.0, "beta_slow": 1.0},
  "tie_word_embeddings": false, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 33]}})";

TEST(Eagle3Config, ParsesThePublishedLayout) {
  auto c = parse_eagle3_config(kPublishedStyleConfig, "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->hidden_size, 2880);
  EXPECT_EQ(c->target_hidden_size, 2880);  // defaults to hidden_size
  EXPECT_EQ(c->draft_vocab_size, 32000);
  EXPECT_FALSE(c->lm_head_from_target);
  EXPECT_EQ(c->q_dim(), 4096);
  EXPECT_TRUE(c->rope.truncate);  // transformers' YaRN default when the file does not say
  EXPECT_DOUBLE_EQ(c->rope.factor, 32.0);
  // Ids are outputs of layers (SGLang adds 1): the residual entering layers 2, 18, 34.
  auto idx = eagle3_aux_hidden_indices(*c, 36);
  ASSERT_TRUE(idx.is_ok());
  EXPECT_EQ(*idx, (std::array<int64_t, 3>{2, 18, 34}));
  EXPECT_FALSE(eagle3_aux_hidden_indices(*c, 24).is_ok());  // layer 33 is not in a 24-layer target
}

TEST(Eagle3Config, DefaultLayersAndTheTargetsLmHead) {
  std::string text = kPublishedStyleConfig;
  text = text.substr(0, text.find(R"(, "eagle_config")")) + "}";
  const std::string vocab_field = R"("draft_vocab_size": 32000, )";
  text.replace(text.find(vocab_field), vocab_field.size(), "");
  auto c = parse_eagle3_config(text, "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(c->lm_head_from_target);
  EXPECT_EQ(c->draft_vocab_size, c->vocab_size);
  auto idx = eagle3_aux_hidden_indices(*c, 24);
  ASSERT_TRUE(idx.is_ok());
  EXPECT_EQ(*idx, (std::array<int64_t, 3>{2, 12, 21}));
  EXPECT_FALSE(eagle3_aux_hidden_indices(*c, 4).is_ok());
}

TEST(Eagle3Config, RefusesWhatItDoesNotRunNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> edits = {
      {R"("num_hidden_layers": 1)", R"("num_hidden_layers": 2)"},
      {R"("hidden_act": "silu")", R"("hidden_act": "gelu")"},
      {R"("tie_word_embeddings": false)", R"("tie_word_embeddings": true, "norm_before_residual": false)"},
      {R"("tie_word_embeddings": false)", R"("norm_before_residual": true)"},
      {R"("tie_word_embeddings": false)", R"("attention_bias": true)"},
      {R"("rope_type": "yarn")", R"("rope_type": "llama3")"},
      {R"([1, 17, 33])", R"([1, 17])"},
      {R"("LlamaForCausalLMEagle3")", R"("LlamaForCausalLM")"},
      {R"("draft_vocab_size": 32000)", R"("draft_vocab_size": 300000)"},
  };
  const std::vector<std::string> names = {"num_hidden_layers", "hidden_act", "tie_word_embeddings",
                                          "norm_before_residual", "attention_bias", "llama3",
                                          "eagle_aux_hidden_state_layer_ids", "architectures", "draft_vocab_size"};
  for (size_t i = 0; i < edits.size(); ++i) {
    std::string text = kPublishedStyleConfig;
    const size_t at = text.find(edits[i].first);
    ASSERT_NE(at, std::string::npos) << edits[i].first;
    text.replace(at, edits[i].first.size(), edits[i].second);
    auto c = parse_eagle3_config(text, "draft/config.json");
    ASSERT_FALSE(c.is_ok()) << edits[i].second;
    EXPECT_NE(c.status().message().find(names[i]), std::string::npos) << c.status().to_string();
  }
}

TEST(Eagle3Config, RoundTripsThroughTheParser) {
  for (const std::string& name : eagle3_preset_names()) {
    auto preset = eagle3_preset(name);
    ASSERT_TRUE(preset.is_ok()) << name;
    auto parsed = parse_eagle3_config(eagle3_config_to_json(*preset), name);
    ASSERT_TRUE(parsed.is_ok()) << name << ": " << parsed.status().to_string();
    EXPECT_EQ(parsed->draft_vocab_size, preset->draft_vocab_size) << name;
    EXPECT_EQ(parsed->lm_head_from_target, preset->lm_head_from_target) << name;
    EXPECT_EQ(parsed->aux_layer_ids, preset->aux_layer_ids) << name;
    EXPECT_EQ(parsed->rope.truncate, preset->rope.truncate) << name;
    EXPECT_DOUBLE_EQ(parsed->rope.factor, preset->rope.factor) << name;
  }
}

// A stand-in target for the tiny-gpt-oss-eagle3 draft: 4 layers of H 256 over 1024 tokens, a random bf16
// embedding (host memory: the CPU backend reads it in place).
struct TinyTarget {
  std::vector<uint16_t> embed;
  Eagle3Target target;
  explicit TinyTarget(int64_t layers = 4, int64_t hidden = 256, int64_t vocab = 1024) {
    std::mt19937 rng(5);
    std::normal_distribution<float> n(0.0f, 1.0f);
    embed.resize(static_cast<size_t>(vocab * hidden));
    for (auto& e : embed) e = f32_to_bf16(n(rng));
    target = {layers, hidden, vocab, TensorView(embed.data(), DType::kBF16, {vocab, hidden}), TensorView(), TensorView()};
  }
};

Result<std::unique_ptr<Eagle3Model>> tiny_draft(Backend& backend, const Eagle3Target& target,
                                                const std::string& preset = "tiny-gpt-oss-eagle3") {
  MX_ASSIGN_OR_RETURN(Eagle3Config config, eagle3_preset(preset));
  MX_ASSIGN_OR_RETURN(Checkpoint ck, eagle3_checkpoint_in_memory(config, SyntheticOptions{}));
  return Eagle3Model::from_checkpoint(config, std::move(ck), backend, target);
}

// Writes a draft checkpoint whose tensors follow `fill` (by name; the preset's rule otherwise is not needed:
// every tensor gets `fill`) with `drop` left out and `extra` added.
Status write_draft(const std::string& dir, const Eagle3Config& config, const Eagle3OptionalTensors& present,
                   const std::function<SyntheticFill(const WeightSpec&)>& fill) {
  Eagle3Weights scratch;
  return write_synthetic_checkpoint(eagle3_weight_specs(config, present, scratch), fill,
                                    SyntheticConfigFiles{eagle3_config_to_json(config), "{}\n"}, dir, SyntheticOptions{});
}

SyntheticFill small_normal(const WeightSpec& spec) {
  if (spec.dtype == DType::kI64 || spec.dtype == DType::kBool) return {SyntheticFill::Kind::kConstantByte, 0, 0, 0};
  return {SyntheticFill::Kind::kNormal, 0, 0.05f, 0};
}

TEST(Eagle3Model, LoaderChecksTheDraftAgainstItsTarget) {
  auto backend = make_cpu_backend(CpuBackendOptions{2});
  TinyTarget tiny;
  auto config = eagle3_preset("tiny-gpt-oss-eagle3");
  ASSERT_TRUE(config.is_ok());
  {  // the preset loads; a target of another width or vocabulary is refused
    test::TempDir dir;
    ASSERT_TRUE(write_draft(dir.path(), *config, {true, true, false, false}, small_normal).is_ok());
    auto ok = Eagle3Model::load(dir.path(), *backend, tiny.target);
    ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
    EXPECT_EQ((*ok)->aux_indices(), (std::array<int64_t, 3>{1, 2, 3}));
    EXPECT_EQ((*ok)->target_id(5), 5);
    EXPECT_EQ((*ok)->target_id(600), -1);
    TinyTarget wide(4, 320, 1024), other_vocab(4, 256, 1500), shallow(2, 256, 1024);
    for (const Eagle3Target* t : {&wide.target, &other_vocab.target, &shallow.target})
      EXPECT_FALSE(Eagle3Model::load(dir.path(), *backend, *t).is_ok());
  }
  {  // no lm_head although config.json names a draft vocabulary
    test::TempDir dir;
    ASSERT_TRUE(write_draft(dir.path(), *config, {false, true, false, false}, small_normal).is_ok());
    auto r = Eagle3Model::load(dir.path(), *backend, tiny.target);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("lm_head.weight"), std::string::npos) << r.status().to_string();
  }
  {  // d2t sends a draft id outside the target's vocabulary
    test::TempDir dir;
    auto fill = [](const WeightSpec& s) {
      return s.name == "d2t" ? SyntheticFill{SyntheticFill::Kind::kConstantByte, 0, 0, 1} : small_normal(s);
    };
    ASSERT_TRUE(write_draft(dir.path(), *config, {true, true, false, false}, fill).is_ok());
    auto r = Eagle3Model::load(dir.path(), *backend, tiny.target);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("d2t"), std::string::npos) << r.status().to_string();
  }
  {  // t2d marks every target token, d2t only 600 of them
    test::TempDir dir;
    auto fill = [](const WeightSpec& s) {
      return s.name == "t2d" ? SyntheticFill{SyntheticFill::Kind::kConstantByte, 0, 0, 1} : small_normal(s);
    };
    ASSERT_TRUE(write_draft(dir.path(), *config, {true, true, true, false}, fill).is_ok());
    auto r = Eagle3Model::load(dir.path(), *backend, tiny.target);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("t2d"), std::string::npos) << r.status().to_string();
  }
  {  // a misshapen tensor is named
    test::TempDir dir;
    Eagle3Config narrow = *config;
    narrow.intermediate_size = 64;
    ASSERT_TRUE(write_draft(dir.path(), narrow, {true, true, false, false}, small_normal).is_ok());
    test::write_file(dir.file("config.json"), eagle3_config_to_json(*config));
    auto r = Eagle3Model::load(dir.path(), *backend, tiny.target);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("midlayer.mlp"), std::string::npos) << r.status().to_string();
  }
}

// The draft layer written out in fp32 from the checkpoint's tensors, one row at a time.
class ReferenceDraft {
 public:
  ReferenceDraft(const Eagle3Config& c, const Checkpoint& ck, const std::vector<uint16_t>& embed) : c_(c), embed_(embed) {
    for (const std::string& name : ck.names()) {
      const TensorView t = *ck.get(name);
      if (t.dtype() != DType::kBF16) continue;
      std::vector<float>& w = w_[name];
      for (int64_t i = 0; i < t.numel(); ++i) w.push_back(bf16_to_f32(t.ptr<const uint16_t>()[i]));
    }
    rope_ = compute_yarn_rope(c.rope, c.head_dim);
  }

  std::vector<float> fc(const std::vector<float>& fused) const { return matvec("fc.weight", fused, c_.hidden_size); }

  // One row: hidden input h, the embedded token, the position; returns the logits and sets g (pre-norm).
  std::vector<float> row(const std::vector<float>& h, int32_t token, int64_t pos, std::vector<float>* g) {
    const int64_t H = c_.hidden_size, hd = c_.head_dim;
    std::vector<float> e(static_cast<size_t>(H));
    for (int64_t i = 0; i < H; ++i) e[static_cast<size_t>(i)] = bf16_to_f32(embed_[static_cast<size_t>(token * H + i)]);
    std::vector<float> x = norm(e, "midlayer.input_layernorm.weight");
    const std::vector<float> hn = norm(h, "midlayer.hidden_norm.weight");
    x.insert(x.end(), hn.begin(), hn.end());
    std::vector<float> q = matvec("midlayer.self_attn.q_proj.weight", x, c_.q_dim());
    std::vector<float> k = matvec("midlayer.self_attn.k_proj.weight", x, c_.kv_dim());
    const std::vector<float> v = matvec("midlayer.self_attn.v_proj.weight", x, c_.kv_dim());
    for (int64_t head = 0; head < c_.num_heads; ++head) rotate(q.data() + head * hd, pos);
    for (int64_t head = 0; head < c_.num_kv_heads; ++head) rotate(k.data() + head * hd, pos);
    kv_[pos] = {k, v};
    std::vector<float> attn(static_cast<size_t>(c_.q_dim()));
    const int64_t group = c_.num_heads / c_.num_kv_heads;
    for (int64_t head = 0; head < c_.num_heads; ++head) {
      const int64_t kvh = head / group;
      std::vector<double> s;
      double mx = -1e300;
      for (const auto& [p, entry] : kv_) {
        if (p > pos) break;
        double dot = 0;
        for (int64_t i = 0; i < hd; ++i) dot += q[head * hd + i] * entry.first[kvh * hd + i];
        s.push_back(dot / std::sqrt(static_cast<double>(hd)));
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double& v2 : s) sum += (v2 = std::exp(v2 - mx));
      size_t j = 0;
      for (const auto& [p, entry] : kv_) {
        if (p > pos) break;
        for (int64_t i = 0; i < hd; ++i) attn[head * hd + i] += static_cast<float>(s[j] / sum) * entry.second[kvh * hd + i];
        ++j;
      }
    }
    std::vector<float> r = matvec("midlayer.self_attn.o_proj.weight", attn, H);
    for (int64_t i = 0; i < H; ++i) r[i] += h[i];
    const std::vector<float> m = norm(r, "midlayer.post_attention_layernorm.weight");
    std::vector<float> gate = matvec("midlayer.mlp.gate_proj.weight", m, c_.intermediate_size);
    const std::vector<float> up = matvec("midlayer.mlp.up_proj.weight", m, c_.intermediate_size);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    const std::vector<float> y = matvec("midlayer.mlp.down_proj.weight", gate, H);
    *g = r;
    for (int64_t i = 0; i < H; ++i) (*g)[i] += y[i];
    return matvec("lm_head.weight", norm(*g, "norm.weight"), c_.draft_vocab_size);
  }

 private:
  std::vector<float> matvec(const std::string& name, const std::vector<float>& x, int64_t rows) const {
    const std::vector<float>& w = w_.at(name);
    const auto cols = static_cast<int64_t>(x.size());
    std::vector<float> y(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      double acc = 0;
      for (int64_t i = 0; i < cols; ++i) acc += static_cast<double>(w[r * cols + i]) * x[i];
      y[r] = static_cast<float>(acc);
    }
    return y;
  }
  std::vector<float> norm(const std::vector<float>& x, const std::string& weight) const {
    double ms = 0;
    for (float v : x) ms += static_cast<double>(v) * v;
    const double inv = 1.0 / std::sqrt(ms / static_cast<double>(x.size()) + c_.rms_norm_eps);
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i] * inv) * w_.at(weight)[i];
    return y;
  }
  void rotate(float* x, int64_t pos) const {
    const int64_t half = c_.head_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(static_cast<float>(pos) * rope_.inv_freq[i]);
      const double cs = std::cos(angle) * rope_.attention_scale, sn = std::sin(angle) * rope_.attention_scale;
      const double a = x[i], b = x[i + half];
      x[i] = static_cast<float>(a * cs - b * sn);
      x[i + half] = static_cast<float>(b * cs + a * sn);
    }
  }

  Eagle3Config c_;
  const std::vector<uint16_t>& embed_;
  std::map<std::string, std::vector<float>> w_;
  RopeTables rope_;
  std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>> kv_;
};

std::vector<float> random_vector(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

int64_t argmax(const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); }

double max_abs_diff(const float* a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Extend over 5 positions of one sequence (the target's captured hidden states fed through the observer),
// then one chain step from the last row's g: logits, draft ids and g against the reference.
TEST(Eagle3Model, ForwardMatchesAPlainFp32Reference) {
  auto backend = make_cpu_backend(CpuBackendOptions{2});
  TinyTarget tiny;
  auto config = eagle3_preset("tiny-gpt-oss-eagle3");
  ASSERT_TRUE(config.is_ok());
  auto model = tiny_draft(*backend, tiny.target);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto ref_ck = eagle3_checkpoint_in_memory(*config, SyntheticOptions{});
  ASSERT_TRUE(ref_ck.is_ok());
  ReferenceDraft ref(*config, *ref_ck, tiny.embed);
  const Eagle3Config& c = *config;
  const int64_t Ht = c.target_hidden_size, T = 5, P = 4;

  auto ws = (*model)->make_workspace(8, 2);
  ASSERT_TRUE(ws.is_ok());
  auto kv = KvCache::allocate(*backend, KvCacheShape{KvLayout::from_layers({(*model)->kv_spec()}), P, {4}});
  ASSERT_TRUE(kv.is_ok());
  // The target's residual streams at its 4 layers' boundaries, T rows each; the draft reads indices 1, 2, 3.
  std::mt19937 rng(11);
  std::vector<std::vector<float>> streams;
  for (int64_t index = 0; index <= 4; ++index) streams.push_back(random_vector(rng, T * Ht));
  const int32_t next_tokens[T] = {17, 3, 999, 512, 40};
  const int32_t positions[T] = {0, 1, 2, 3, 4};
  const int32_t seqs[T] = {0, 0, 0, 0, 0};
  const int32_t pages[2] = {2, 0};  // logical page 0 -> physical 2, 1 -> 0
  int32_t captured_rows[3 * T], logit_rows[1] = {T - 1};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < 3; ++j) captured_rows[3 * t + j] = static_cast<int32_t>(j * 8 + t);

  // What the drafter's observer does, by hand: copy the three streams into the capture slots.
  for (int64_t j = 0; j < 3; ++j) {
    const int64_t index = (*model)->aux_indices()[static_cast<size_t>(j)];
    TensorView slot = (*ws)->captured.rows(j, j + 1).reshaped({8, Ht}).rows(0, T);
    std::copy(streams[static_cast<size_t>(index)].begin(), streams[static_cast<size_t>(index)].end(), slot.ptr<float>());
  }
  ASSERT_TRUE((*model)->fuse_captured(TensorView(captured_rows, DType::kI32, {3 * T}), **ws).is_ok());
  BatchView batch;
  batch.num_tokens = T;
  batch.num_seqs = 1;
  batch.token_ids = TensorView(const_cast<int32_t*>(next_tokens), DType::kI32, {T});
  batch.positions = TensorView(const_cast<int32_t*>(positions), DType::kI32, {T});
  batch.token_seq = TensorView(const_cast<int32_t*>(seqs), DType::kI32, {T});
  batch.page_tables[0] = TensorView(const_cast<int32_t*>(pages), DType::kI32, {1, 2});
  batch.logit_rows = TensorView(logit_rows, DType::kI32, {1});
  batch.num_logit_rows = 1;
  batch.max_position = 4;
  batch.max_seq_tokens = T;
  ASSERT_TRUE((*model)->forward(batch, kv->layer(0), **ws).is_ok());

  std::vector<float> g, logits;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> fused;
    for (int64_t j = 0; j < 3; ++j) {
      const std::vector<float>& s = streams[static_cast<size_t>((*model)->aux_indices()[static_cast<size_t>(j)])];
      fused.insert(fused.end(), s.begin() + t * Ht, s.begin() + (t + 1) * Ht);
    }
    logits = ref.row(ref.fc(fused), next_tokens[t], positions[t], &g);
  }
  const double scale = std::abs(logits[static_cast<size_t>(argmax(logits))]);
  EXPECT_LT(max_abs_diff((*ws)->logits.ptr<float>(), logits), 1e-4 * scale);
  EXPECT_LT(max_abs_diff((*ws)->next_hidden.ptr<float>(), g), 1e-4);
  const int32_t first = (*ws)->draft_ids.ptr<int32_t>()[0];
  EXPECT_EQ(first, argmax(logits));

  // Chain step: g and the first draft (as a target id) at position 5.
  ASSERT_TRUE((*model)->continue_chain(1, **ws).is_ok());
  const int32_t chain_token[1] = {(*model)->target_id(first)}, chain_pos[1] = {5}, chain_seq[1] = {0};
  int32_t chain_logit_rows[1] = {0};
  batch.num_tokens = 1;
  batch.token_ids = TensorView(const_cast<int32_t*>(chain_token), DType::kI32, {1});
  batch.positions = TensorView(const_cast<int32_t*>(chain_pos), DType::kI32, {1});
  batch.token_seq = TensorView(const_cast<int32_t*>(chain_seq), DType::kI32, {1});
  batch.logit_rows = TensorView(chain_logit_rows, DType::kI32, {1});
  batch.max_position = 5;
  batch.max_seq_tokens = 1;
  ASSERT_TRUE((*model)->forward(batch, kv->layer(0), **ws).is_ok());
  std::vector<float> g2;
  const std::vector<float> logits2 = ref.row(g, chain_token[0], 5, &g2);
  EXPECT_LT(max_abs_diff((*ws)->logits.ptr<float>(), logits2), 1e-4 * std::abs(logits2[static_cast<size_t>(argmax(logits2))]));
  EXPECT_EQ((*ws)->draft_ids.ptr<int32_t>()[0], argmax(logits2));
}

// A deterministic stand-in for the target's residual streams: row of (position, the token there).
std::vector<float> fake_stream(int64_t index, int64_t position, int32_t token, int64_t width) {
  std::mt19937 rng(static_cast<uint32_t>(index * 1000003 + position * 7919 + token));
  return random_vector(rng, width);
}

// Feeds the drafter's observer the fake streams of `rows` (position, token at that position) of one step.
void capture(const Eagle3Drafter& drafter, const std::vector<std::pair<int64_t, int32_t>>& rows, int64_t width) {
  for (int64_t index = 0; index <= 4; ++index) {
    std::vector<float> data;
    for (const auto& [pos, tok] : rows) {
      const std::vector<float> r = fake_stream(index, pos, tok, width);
      data.insert(data.end(), r.begin(), r.end());
    }
    drafter.capture_observer()(index, TensorView(data.data(), DType::kF32, {static_cast<int64_t>(rows.size()), width}));
  }
}

// Rewrites the int64 d2t tensor of the draft checkpoint in `dir` in place (the synthetic fills make it zero).
void set_d2t(const std::string& dir, const std::function<int64_t(int64_t)>& offset_of) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_bytes = 0;
    f.read(reinterpret_cast<char*>(&header_bytes), 8);
    std::string header(header_bytes, ' ');
    f.read(header.data(), static_cast<std::streamsize>(header_bytes));
    const nlohmann::json h = nlohmann::json::parse(header);
    if (!h.contains("d2t")) continue;
    const int64_t begin = h["d2t"]["data_offsets"][0], end = h["d2t"]["data_offsets"][1];
    std::vector<int64_t> d2t(static_cast<size_t>((end - begin) / 8));
    for (size_t d = 0; d < d2t.size(); ++d) d2t[d] = offset_of(static_cast<int64_t>(d));
    f.seekp(static_cast<std::streamoff>(8 + header_bytes + static_cast<uint64_t>(begin)));
    f.write(reinterpret_cast<const char*>(d2t.data()), end - begin);
  }
}

// The drafter's chain (each pass's drafts fed to the next on the device as draft-vocabulary ids, embedded
// through the draft vocabulary's table) against the model driven pass by pass with target ids from the
// host, under a d2t that reverses the vocabulary.
TEST(Eagle3Drafter, ChainEqualsPassByPassOnTheHost) {
  auto backend = make_cpu_backend(CpuBackendOptions{2});
  TinyTarget tiny;
  auto config = eagle3_preset("tiny-gpt-oss-eagle3");
  ASSERT_TRUE(config.is_ok());
  test::TempDir dir;
  ASSERT_TRUE(write_eagle3_checkpoint(*config, dir.path(), SyntheticOptions{}).is_ok());
  set_d2t(dir.path(), [](int64_t d) { return 1023 - 2 * d; });  // draft id d -> target id 1023 - d
  auto model = Eagle3Model::load(dir.path(), *backend, tiny.target);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  ASSERT_EQ((*model)->target_id(5), 1018);
  const int64_t Ht = 256, T = 7, K = 5, P = 4, max_tokens = 16;

  auto drafter = Eagle3Drafter::create(**model, Eagle3DrafterLimits{max_tokens, 2});
  ASSERT_TRUE(drafter.is_ok());
  ASSERT_TRUE((*drafter)->attach_pool(Eagle3DraftPool{16, P}).is_ok());
  const std::vector<int32_t> tokens = {5, 9, 100, 77, 3, 41, 8, 600};
  std::vector<std::pair<int64_t, int32_t>> rows;
  for (int64_t p = 0; p < T; ++p) rows.emplace_back(p, tokens[static_cast<size_t>(p)]);
  capture(**drafter, rows, Ht);
  const std::vector<int32_t> pages = {3, 7};  // the chain reaches position 10: page 2 is the scratch page
  Eagle3SequenceStep s{0, 0, std::span<const int32_t>(tokens).subspan(1, T), pages, K};
  std::vector<std::vector<int32_t>> drafts;
  ASSERT_TRUE((*drafter)->step(std::span(&s, 1), &drafts).is_ok());
  ASSERT_EQ(drafts[0].size(), static_cast<size_t>(K));

  // By hand: the captures into a workspace of the same row count, the extend pass, then one pass per draft.
  auto ws = (*model)->make_workspace(max_tokens, 2);
  ASSERT_TRUE(ws.is_ok());
  auto kv = KvCache::allocate(*backend, KvCacheShape{KvLayout::from_layers({(*model)->kv_spec()}), P, {3}});
  ASSERT_TRUE(kv.is_ok());
  int32_t captured_rows[3 * T], positions[T], seqs[T] = {}, logit_rows[1] = {T - 1}, table[3] = {0, 1, 2};
  for (int64_t j = 0; j < 3; ++j) {
    const int64_t index = (*model)->aux_indices()[static_cast<size_t>(j)];
    float* slot = (*ws)->captured.rows(j, j + 1).reshaped({max_tokens, Ht}).ptr<float>();
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> r = fake_stream(index, t, tokens[static_cast<size_t>(t)], Ht);
      std::memcpy(slot + t * Ht, r.data(), r.size() * sizeof(float));
      captured_rows[3 * t + j] = static_cast<int32_t>(j * max_tokens + t);
    }
  }
  for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>(t);
  ASSERT_TRUE((*model)->fuse_captured(TensorView(captured_rows, DType::kI32, {3 * T}), **ws).is_ok());
  BatchView batch;
  batch.num_tokens = T;
  batch.num_seqs = 1;
  batch.token_ids = TensorView(const_cast<int32_t*>(tokens.data() + 1), DType::kI32, {T});
  batch.positions = TensorView(positions, DType::kI32, {T});
  batch.token_seq = TensorView(seqs, DType::kI32, {T});
  batch.page_tables[0] = TensorView(table, DType::kI32, {1, 3});
  batch.logit_rows = TensorView(logit_rows, DType::kI32, {1});
  batch.num_logit_rows = 1;
  batch.max_position = T - 1 + K - 1;
  batch.max_seq_tokens = T;
  ASSERT_TRUE((*model)->forward(batch, kv->layer(0), **ws).is_ok());
  int32_t chain_token[1], chain_position[1];
  logit_rows[0] = 0;
  for (int64_t j = 0; j < K; ++j) {
    chain_token[0] = (*model)->target_id((*ws)->draft_ids.ptr<int32_t>()[0]);
    EXPECT_EQ(drafts[0][static_cast<size_t>(j)], chain_token[0]) << "draft " << j;
    if (j + 1 == K) break;
    chain_position[0] = static_cast<int32_t>(T + j);
    batch.num_tokens = 1;
    batch.token_ids = TensorView(chain_token, DType::kI32, {1});
    batch.positions = TensorView(chain_position, DType::kI32, {1});
    batch.max_seq_tokens = 1;
    ASSERT_TRUE((*model)->continue_chain(1, **ws).is_ok());
    ASSERT_TRUE((*model)->forward(batch, kv->layer(0), **ws).is_ok());
  }
}

// Rollback: drafter A sees a prompt, drafts K = 4 (its chain writes KV at 3 positions past the prompt), then
// one accepted draft and a correction; drafter B sees the kept sequence in one step. Both must propose
// the same next drafts, and so must a two-sequence step that carries another sequence beside it.
TEST(Eagle3Drafter, RejectedDraftsLeaveNothingBehind) {
  auto backend = make_cpu_backend(CpuBackendOptions{2});
  TinyTarget tiny;
  const Eagle3DrafterLimits limits{16, 2};
  auto model = tiny_draft(*backend, tiny.target);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto make = [&]() {
    auto d = Eagle3Drafter::create(**model, limits);
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    EXPECT_TRUE((*d)->attach_pool(Eagle3DraftPool{16, 4}).is_ok());
    return std::move(*d);
  };
  const int64_t Ht = 256;
  std::vector<int32_t> tokens = {5, 9, 100, 77, 3, 41, 8};  // prompt of 7; token 7 comes from the target
  tokens.push_back(600);
  const std::vector<int32_t> pages_a = {3, 7, 1};  // enough for 12 positions

  auto a = make();
  std::vector<std::pair<int64_t, int32_t>> rows;
  for (int64_t p = 0; p < 7; ++p) rows.emplace_back(p, tokens[static_cast<size_t>(p)]);
  capture(*a, rows, Ht);
  std::vector<std::vector<int32_t>> drafts;
  Eagle3SequenceStep s{0, 0, std::span<const int32_t>(tokens).subspan(1, 7), pages_a, 4};
  ASSERT_TRUE(a->step(std::span(&s, 1), &drafts).is_ok());
  ASSERT_EQ(drafts[0].size(), 4u);
  // The verify step computed positions 7.. (token 600, then the drafts); the first draft is kept, the
  // target then samples 1000 where the second draft stood.
  tokens.push_back(drafts[0][0]);
  tokens.push_back(drafts[0][1] == 1000 ? 1001 : 1000);
  rows = {{7, tokens[7]}, {8, tokens[8]}};
  capture(*a, rows, Ht);
  Eagle3SequenceStep s2{0, 7, std::span<const int32_t>(tokens).subspan(8, 2), pages_a, 4};
  ASSERT_TRUE(a->step(std::span(&s2, 1), &drafts).is_ok());
  const std::vector<int32_t> after_rollback = drafts[0];

  auto b = make();
  rows.clear();
  for (int64_t p = 0; p < 9; ++p) rows.emplace_back(p, tokens[static_cast<size_t>(p)]);
  capture(*b, rows, Ht);
  const std::vector<int32_t> pages_b = {5, 0, 2};
  Eagle3SequenceStep fresh{0, 0, std::span<const int32_t>(tokens).subspan(1, 9), pages_b, 4};
  ASSERT_TRUE(b->step(std::span(&fresh, 1), &drafts).is_ok());
  EXPECT_EQ(drafts[0], after_rollback);

  // Not vacuous: another history (token 3 changed) drafts otherwise.
  auto d = make();
  std::vector<int32_t> changed = tokens;
  changed[3] = 78;
  rows.clear();
  for (int64_t p = 0; p < 9; ++p) rows.emplace_back(p, changed[static_cast<size_t>(p)]);
  capture(*d, rows, Ht);
  Eagle3SequenceStep other_history{0, 0, std::span<const int32_t>(changed).subspan(1, 9), pages_b, 4};
  ASSERT_TRUE(d->step(std::span(&other_history, 1), &drafts).is_ok());
  EXPECT_NE(drafts[0], after_rollback);

  // Beside another sequence that asks for 2 drafts (rows after B's, its own pages), B's drafts again.
  auto c = make();
  std::vector<int32_t> other = {11, 12, 13, 14};
  rows.clear();
  for (int64_t p = 0; p < 9; ++p) rows.emplace_back(p, tokens[static_cast<size_t>(p)]);
  for (int64_t p = 0; p < 3; ++p) rows.emplace_back(p, other[static_cast<size_t>(p)]);
  capture(*c, rows, Ht);
  const std::vector<int32_t> pages_other = {9};
  const Eagle3SequenceStep two[2] = {{9, 0, std::span<const int32_t>(other).subspan(1, 3), pages_other, 2}, fresh};
  ASSERT_TRUE(c->step(two, &drafts).is_ok());
  EXPECT_EQ(drafts[1], after_rollback);
  EXPECT_EQ(drafts[0].size(), 2u);
}

// Draft graphs are on by default; --no-speculative-draft-graphs names EAGLE-3's chain graphs, so another
// algorithm with it is an error (a flag that would change nothing).
TEST(Eagle3Drafter, NoDraftGraphsFlagIsForEagle3Only) {
  EXPECT_TRUE(SpeculativeConfig{}.draft_graphs);
  const auto ngram = test::run_mxserve("bench latency --preset tiny --backend cpu --speculative-algorithm ngram "
                                       "--no-speculative-draft-graphs");
  EXPECT_EQ(ngram.exit_code, 1);
  EXPECT_NE(ngram.stderr_text.find("only eagle3 drafts replay graphs"), std::string::npos) << ngram.stderr_text;
}

// Chain graphs: the same steps through a drafter whose chains replay graphs (buckets 1, 2, 4: three
// sequences pad to 4, on their scratch pages) and through an eager one draft the same tokens; a step whose
// sequences want different draft counts runs eagerly. A third drafter's graph tables are 20001 pages wide
// (a long context limit): only their used columns go up, apart, and it drafts the same.
TEST(Eagle3Drafter, ChainGraphsDraftWhatTheEagerChainDrafts) {
  auto cpu = make_cpu_backend(CpuBackendOptions{2});
  test::ReplayingBackend backend(*cpu);
  TinyTarget tiny;
  auto model = tiny_draft(backend, tiny.target);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto make = [&](int64_t graph_pages) {
    auto d = Eagle3Drafter::create(**model, Eagle3DrafterLimits{16, 4});
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    EXPECT_TRUE((*d)->attach_pool(Eagle3DraftPool{16, 4}).is_ok());
    const std::vector<int64_t> buckets = {1, 2, 4};
    if (graph_pages > 0) {
      EXPECT_TRUE((*d)->enable_chain_graphs(buckets, graph_pages).is_ok());
    }
    return std::move(*d);
  };
  auto eager = make(0), graphed = make(3), wide = make(20000);
  const int64_t Ht = 256;
  // Three sequences (tokens by position) and their pages (Z's chain spills onto its scratch page in step 2).
  std::vector<std::vector<int32_t>> tokens = {{5, 9, 100, 77, 3, 41, 8, 600, 12, 13}, {11, 12, 13, 14, 15, 16, 17},
                                              {7, 300, 2, 250, 18, 19, 20, 21}};
  const std::vector<std::vector<int32_t>> pages = {{3, 7, 1}, {9, 10}, {4, 5}};
  std::set<int32_t> seen;
  // One step: sequence i's rows at positions [first[i], first[i] + count[i]) asking for want[i] drafts.
  auto step = [&](const std::vector<int64_t>& first, const std::vector<int64_t>& count, const std::vector<int64_t>& want) {
    std::vector<std::pair<int64_t, int32_t>> rows;
    std::vector<Eagle3SequenceStep> steps;
    for (size_t i = 0; i < first.size(); ++i) {
      steps.push_back({static_cast<int64_t>(rows.size()), first[i],
                       std::span<const int32_t>(tokens[i]).subspan(static_cast<size_t>(first[i] + 1), static_cast<size_t>(count[i])),
                       pages[i], want[i]});
      for (int64_t p = first[i]; p < first[i] + count[i]; ++p) rows.emplace_back(p, tokens[i][static_cast<size_t>(p)]);
    }
    std::vector<std::vector<int32_t>> a, b, c;
    for (auto* d : {eager.get(), graphed.get(), wide.get()}) capture(*d, rows, Ht);
    EXPECT_TRUE(eager->step(steps, &a).is_ok());
    EXPECT_TRUE(graphed->step(steps, &b).is_ok());
    EXPECT_TRUE(wide->step(steps, &c).is_ok());
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, c);
    for (const auto& d : a) seen.insert(d.begin(), d.end());
  };
  step({0, 0, 0}, {7, 3, 5}, {3, 3, 3});  // bucket 4: run eagerly through the graph's views, then captured
  EXPECT_EQ(backend.captures, 2);
  EXPECT_EQ(backend.replays, 0);
  EXPECT_EQ(backend.row_prefix_copies, 1);  // the wide drafter's table
  step({7, 3, 5}, {2, 1, 2}, {3, 3, 3});  // replayed
  EXPECT_EQ(backend.replays, 2);
  EXPECT_EQ(graphed->num_chain_graph_replays(), 1);
  EXPECT_EQ(wide->num_chain_graph_replays(), 1);
  EXPECT_EQ(backend.row_prefix_copies, 2);
  step({1, 4}, {1, 1}, {2, 3});  // different draft counts: eager
  EXPECT_EQ(backend.captures, 2);
  EXPECT_EQ(backend.replays, 2);
  EXPECT_GT(seen.size(), 1u);  // not vacuous: the drafts depend on the rows
}

}  // namespace
}  // namespace mx
