#!/usr/bin/env python3
"""Make a tiny Gemma-4 MTP assistant (Gemma4AssistantForCausalLM, model_type gemma4_assistant) for the
tests/fixtures/tiny-gemma4-text target, and reference drafts computed by Hugging Face transformers (float32,
eager attention) the way its SinglePositionMultiTokenCandidateGenerator drafts.

Needs torch, transformers (with models/gemma4_assistant), safetensors: run it where those exist.

  make_tiny_gemma4_assistant.py TARGET_DIR OUT_DIR [--seed N] [--drafts K]

For each prompt of TARGET_DIR/reference.safetensors the target runs the prompt once (hidden states and the
shared KV of its last sliding and last full layer), its greedy next token t is appended, and the assistant
drafts K tokens from (t, the target's final-norm hidden state of the last prompt position) at the constant
position len(prompt), as transformers' candidate generator does.

OUT_DIR receives:
  config.json                 as transformers writes it
  model.safetensors           bf16 weights (save_pretrained: the tied lm_head is not stored)
  reference.safetensors       prompt_{i}_ids (int32 [T + 1]: the prompt and t), prompt_{i}_draft_logits (f32 [K, V]),
                              prompt_{i}_drafts (int32 [K]), prompt_{i}_draft_logits_bf16 (both models in bf16)
  reference.json              the config, versions, the shared KV lengths transformers passed, bf16-vs-fp32 errors,
                              and whether transformers' own assisted generate reproduced plain greedy decoding
"""
import argparse, json, math, os, sys
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--drafts", type=int, default=4)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import transformers
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM
    from safetensors.torch import load_file, save_file

    target = Gemma4ForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    target.config._attn_implementation = "eager"
    with open(os.path.join(args.target, "config.json")) as f:
        tc = json.load(f)
    # The released 26B-A4B assistant's shape, scaled down: 3 sliding layers + 1 full, the target's query heads and
    # head dims (its layers read the target's KV), its own hidden and MLP widths.
    text = dict(vocab_size=tc["vocab_size"], hidden_size=48, intermediate_size=40, num_hidden_layers=4,
                num_attention_heads=tc["num_attention_heads"], num_key_value_heads=tc["num_key_value_heads"],
                head_dim=tc["head_dim"], global_head_dim=tc["global_head_dim"],
                num_global_key_value_heads=tc["num_global_key_value_heads"], sliding_window=tc["sliding_window"],
                layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                num_kv_shared_layers=4, enable_moe_block=False, hidden_size_per_layer_input=0,
                vocab_size_per_layer_input=0, attention_k_eq_v=tc["attention_k_eq_v"],
                rope_parameters=tc["rope_parameters"], max_position_embeddings=tc["max_position_embeddings"],
                rms_norm_eps=tc["rms_norm_eps"], hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                final_logit_softcapping=None)
    cfg = Gemma4AssistantConfig(text_config=Gemma4TextConfig(**text), backbone_hidden_size=tc["hidden_size"],
                                use_ordered_embeddings=False)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"

    torch.manual_seed(args.seed)
    model = Gemma4AssistantForCausalLM(cfg).to(torch.float32).eval()
    g = torch.Generator().manual_seed(args.seed)
    saved = set(model.state_dict().keys())
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or name not in saved:
                continue
            if name.endswith("layer_scalar"):
                v = 0.5 + 0.5 * torch.rand(p.shape, generator=g)
            elif name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
                v = (1.0 + 0.1 * torch.randn(p.shape, generator=g)) * p.shape[0] ** -0.25
            elif p.dim() == 1:
                v = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name or name == "lm_head.weight":
                v = 0.4 * torch.randn(p.shape, generator=g)
            else:
                v = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1])
            p.copy_(v.to(torch.bfloat16).to(torch.float32))
    model.tie_weights()
    disk = Gemma4AssistantForCausalLM(cfg).eval()
    disk.load_state_dict(model.state_dict())
    disk.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    del disk

    embed = target.get_input_embeddings()
    prompts = load_file(os.path.join(args.target, "reference.safetensors"))
    report = {"text_config": {k: v for k, v in text.items()}, "backbone_hidden_size": tc["hidden_size"],
              "seed": args.seed, "drafts": args.drafts,
              "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager attention"}
    ref = {}

    def draft(tgt, asst, ids, K):
        """transformers' SinglePositionMultiTokenCandidateGenerator, one round after a prefill."""
        out = tgt(input_ids=ids, output_hidden_states=True, return_shared_kv_states=True, use_cache=True)
        shared = getattr(out, "shared_kv_states", None)
        if shared is None:  # the causal-LM wrapper did not pass them through: ask the text model
            shared = tgt.model(input_ids=ids, return_shared_kv_states=True, use_cache=True).shared_kv_states
        t = out.logits[0, -1].argmax().view(1, 1)
        seq = torch.cat([ids, t], dim=1)
        state = out.hidden_states[-1][:, -1:]
        lengths = {k: list(v[0].shape) for k, v in shared.items()}
        shared = {k: (v[0][:, :, :seq.shape[1], :], v[1][:, :, :seq.shape[1], :]) for k, v in shared.items()}
        position_ids = torch.tensor([[seq.shape[1] - 1]])
        mask = torch.ones(1, seq.shape[1], dtype=torch.long)
        tok, logits, tokens = t, [], []
        for _ in range(K):
            e = tgt.get_input_embeddings()(tok)
            o = asst(inputs_embeds=torch.cat([e.to(state.dtype), state], dim=-1), attention_mask=mask,
                     position_ids=position_ids, shared_kv_states=shared, use_cache=False)
            logits.append(o.logits[0, -1].float())
            tok = o.logits[:, -1:].argmax(-1)
            tokens.append(int(tok))
            state = o.last_hidden_state
        return seq, torch.stack(logits), tokens, lengths

    tb = Gemma4ForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16).eval()
    tb.config._attn_implementation = "eager"
    ab = Gemma4AssistantForCausalLM(cfg).eval()
    ab.load_state_dict(model.state_dict())
    ab = ab.to(torch.bfloat16)
    with torch.no_grad():
        i = 0
        while f"prompt_{i}_ids" in prompts:
            ids = prompts[f"prompt_{i}_ids"].long()[None]
            seq, logits, tokens, lengths = draft(target, model, ids, args.drafts)
            ref[f"prompt_{i}_ids"] = seq[0].to(torch.int32).contiguous()
            ref[f"prompt_{i}_draft_logits"] = logits.contiguous()
            ref[f"prompt_{i}_drafts"] = torch.tensor(tokens, dtype=torch.int32)
            _, lb, tb_tokens, _ = draft(tb, ab, ids, args.drafts)
            ref[f"prompt_{i}_draft_logits_bf16"] = lb.float().contiguous()
            report[f"prompt_{i}"] = {"prompt_len": ids.shape[1], "shared_kv_shapes": lengths, "drafts": tokens,
                                     "bf16_drafts": tb_tokens,
                                     "bf16_vs_fp32_rel_l2": [((lb[k].float() - logits[k]).norm() / logits[k].norm()).item()
                                                             for k in range(args.drafts)],
                                     "logit_std": logits.std().item()}
            try:  # transformers' own assisted generation must reproduce plain greedy decoding
                plain = target.generate(ids, max_new_tokens=12, do_sample=False)
                assisted = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=model)
                report[f"prompt_{i}"]["assisted_equals_greedy"] = bool(torch.equal(plain, assisted))
            except Exception as e:
                report[f"prompt_{i}"]["assisted_generate_error"] = f"{type(e).__name__}: {e}"[:1000]
            i += 1
    save_file(ref, os.path.join(args.out, "reference.safetensors"))
    report["checkpoint_tensors"] = {k: list(v.shape) for k, v in load_file(os.path.join(args.out, "model.safetensors")).items()}
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: v for k, v in report.items() if k != "checkpoint_tensors"}, indent=2))
    print(json.dumps(report["checkpoint_tensors"]))


if __name__ == "__main__":
    main()
