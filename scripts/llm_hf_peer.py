#!/usr/bin/env python3
"""Hugging Face transformers on SmolLM2's GGUF weights: the reference and the peer of
ringkernel-llm on the GPU machine (torch, transformers and numpy; no network, no `gguf`
package, nothing downloaded).

The GGUF file is read here (a small reader below), its tensors dequantized with NumPy
(F32, F16, BF16, Q4_0, Q4_1, Q8_0), the q/k rows un-permuted to Hugging Face's rotate-half
layout, and `LlamaForCausalLM` built from a `LlamaConfig` made from the GGUF metadata,
with eager attention, in float32 (as ringkernel computes: f32 activations on the same
dequantized values).

  reference  Greedy decoding of the 3 prompts of crates/ringkernel-llm/tests/fixtures/
             generate_reference.txt (their token ids are read from that file, so no
             tokenizer is needed), 32 tokens each, top-8 logits per step, written in the
             same format (`backend transformers`) to --out. ringkernel's test compares
             against every generate_reference*.txt in the fixtures directory.
  bench      Time to first token of a 128-token prompt and greedy decode tokens/s at
             batch 1 (one forward per token with the KV cache, the next token's argmax
             taken on the host each step, as `ringkernel bench llm` does), median of
             --runs after a warm-up; prints one `hf bench: ...` line per dtype.

Usage (on the GPU machine, from the repository root):

  python3 scripts/llm_hf_peer.py reference --model M.gguf --device cuda --out OUT.txt
  python3 scripts/llm_hf_peer.py bench --model M.gguf --device cuda [--dtypes float32,bfloat16]
"""

import argparse
import os
import struct
import sys
import time

import numpy as np

FIXTURE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..", "crates", "ringkernel-llm", "tests", "fixtures", "generate_reference.txt",
)

# ------------------------------------------------------------------ GGUF

GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}
# ggml type id -> (values per block, bytes per block)
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 8: (32, 34), 30: (1, 2)}


def read_gguf(path):
    """(metadata dict, {name: (type id, dims in ggml order, bytes)}) of a GGUF v2/v3 file."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(data)
    pos = [0]

    def take(fmt):
        v = struct.unpack_from(fmt, buf, pos[0])
        pos[0] += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def string():
        n = take("<Q")
        s = bytes(buf[pos[0]:pos[0] + n]).decode("utf-8", errors="replace")
        pos[0] += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            at, n = take("<I"), take("<Q")
            return [value(at) for _ in range(n)]
        return take(GGUF_SCALAR[t])

    magic, version = take("<4sI")
    if magic != b"GGUF" or version not in (2, 3):
        raise SystemExit(f"{path}: not a GGUF v2/v3 file")
    n_tensors, n_kv = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("<I")
        dims = [take("<Q") for _ in range(nd)]
        ty, off = take("<I"), take("<Q")
        infos.append((name, ty, dims, off))
    align = int(meta.get("general.alignment", 32))
    start = (pos[0] + align - 1) // align * align
    tensors = {}
    for name, ty, dims, off in infos:
        if ty not in GGML_BLOCKS:
            raise SystemExit(f"{name}: ggml type {ty} not supported here")
        per, size = GGML_BLOCKS[ty]
        n = int(np.prod(dims))
        tensors[name] = (ty, dims, data[start + off:start + off + n // per * size])
    return meta, tensors


def f16(b):
    return np.frombuffer(np.ascontiguousarray(b).tobytes(), dtype="<f2").astype(np.float32)


def dequantize(ty, raw, n):
    """The n values of a tensor of ggml type `ty`, as float32."""
    raw = np.asarray(raw)
    if ty == 0:
        return np.frombuffer(raw.tobytes(), dtype="<f4").copy()
    if ty == 1:
        return f16(raw)
    if ty == 30:
        u = np.frombuffer(raw.tobytes(), dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32)
    per, size = GGML_BLOCKS[ty]
    blk = raw.reshape(-1, size)
    if ty == 8:  # Q8_0: d, 32 x i8
        d = f16(blk[:, 0:2])[:, None]
        q = blk[:, 2:].view(np.int8).astype(np.float32)
        return (q * d).reshape(-1)
    lo = (blk[:, -16:] & 0x0F).astype(np.float32)
    hi = (blk[:, -16:] >> 4).astype(np.float32)
    q = np.concatenate([lo, hi], axis=1)
    d = f16(blk[:, 0:2])[:, None]
    if ty == 2:  # Q4_0: d, nibbles; (nib - 8) d
        return ((q - 8.0) * d).reshape(-1)
    m = f16(blk[:, 2:4])[:, None]  # Q4_1: d, m, nibbles; nib d + m
    return (q * d + m).reshape(-1)


# ------------------------------------------------------------------ the HF model


def hf_model(path, device, dtype_name="float32"):
    """LlamaForCausalLM (eager attention) on the GGUF's dequantized weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    meta, tensors = read_gguf(path)
    g = lambda k, d=None: meta.get("llama." + k, d)
    n_heads, n_kv = int(g("attention.head_count")), int(g("attention.head_count_kv", g("attention.head_count")))
    dim = int(g("embedding_length"))
    hd = dim // n_heads
    vocab = tensors["token_embd.weight"][1][1]
    base = float(g("rope.freq_base", 10000.0))
    tied = "output.weight" not in tensors
    cfg = LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=dim,
        intermediate_size=int(g("feed_forward_length")),
        num_hidden_layers=int(g("block_count")),
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        head_dim=hd,
        max_position_embeddings=int(g("context_length")),
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings=tied,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="eager",
    )
    # transformers 5 keeps the rotary settings in rope_parameters, 4.x in rope_theta
    if hasattr(cfg, "rope_parameters") and isinstance(getattr(cfg, "rope_parameters"), dict):
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": base}
    cfg.rope_theta = base

    def w(name):
        ty, dims, raw = tensors[name]
        return dequantize(ty, raw, int(np.prod(dims))).reshape(list(reversed(dims)))

    def unpermute(m, heads):
        # GGUF stores q/k rows permuted for adjacent-pair RoPE; back to rotate-half
        return m.reshape(heads, hd // 2, 2, m.shape[1]).swapaxes(1, 2).reshape(m.shape)

    sd = {"model.embed_tokens.weight": w("token_embd.weight"),
          "model.norm.weight": w("output_norm.weight")}
    if not tied:
        sd["lm_head.weight"] = w("output.weight")
    for i in range(cfg.num_hidden_layers):
        p, q = f"blk.{i}.", f"model.layers.{i}."
        sd[q + "self_attn.q_proj.weight"] = unpermute(w(p + "attn_q.weight"), n_heads)
        sd[q + "self_attn.k_proj.weight"] = unpermute(w(p + "attn_k.weight"), n_kv)
        sd[q + "self_attn.v_proj.weight"] = w(p + "attn_v.weight")
        sd[q + "self_attn.o_proj.weight"] = w(p + "attn_output.weight")
        sd[q + "mlp.gate_proj.weight"] = w(p + "ffn_gate.weight")
        sd[q + "mlp.up_proj.weight"] = w(p + "ffn_up.weight")
        sd[q + "mlp.down_proj.weight"] = w(p + "ffn_down.weight")
        sd[q + "input_layernorm.weight"] = w(p + "attn_norm.weight")
        sd[q + "post_attention_layernorm.weight"] = w(p + "ffn_norm.weight")
    model = LlamaForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight") and "rotary_emb" not in k]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if tied and not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight):
        model.lm_head.weight = model.model.embed_tokens.weight
    dtype = getattr(torch, dtype_name)
    return model.to(device=device, dtype=dtype), cfg


class Stepper:
    """One forward per call with the KV cache kept between calls; returns last logits."""

    def __init__(self, model, device):
        self.model, self.device, self.past = model, device, None

    def __call__(self, ids):
        import torch

        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids], device=self.device),
                             past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return out.logits[0, -1]

    def reset(self):
        self.past = None


# ------------------------------------------------------------------ subcommands


def fixture_prompts():
    prompts = []
    with open(FIXTURE, encoding="ascii") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == "prompt":
                prompts.append([parts[1], None])
            elif parts and parts[0] == "prompt_ids":
                prompts[-1][1] = [int(x) for x in parts[1:]]
    return prompts


def cmd_reference(args):
    model, _ = hf_model(args.model, args.device, "float32")
    step = Stepper(model, args.device)
    with open(args.out, "w", encoding="ascii") as f:
        f.write("backend transformers\n")
        for hexprompt, ids in fixture_prompts():
            step.reset()
            f.write(f"prompt {hexprompt}\nprompt_ids {' '.join(map(str, ids))}\n")
            x = ids
            for i in range(args.tokens):
                logits = step(x).double().cpu().numpy()
                top = np.argsort(-logits, kind="stable")[:8]
                t = int(top[0])
                f.write(f"step {i} {t} top " + " ".join(f"{int(j)}:{float(logits[j]):.6f}" for j in top) + "\n")
                x = [t]
            print(bytes.fromhex(hexprompt).decode(), "-> done")
    print(f"wrote {args.out}")


def cmd_bench(args):
    import torch

    dev = torch.device(args.device)
    for dtype in args.dtypes.split(","):
        model, cfg = hf_model(args.model, args.device, dtype)
        step = Stepper(model, args.device)
        prompt = [(1000 + 7 * i) % cfg.vocab_size for i in range(args.prompt_tokens)]
        ttfts, rates = [], []
        for run in range(args.runs + 1):
            step.reset()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            nxt = int(step(prompt).argmax().item())
            ttft = time.perf_counter() - t0
            t1 = time.perf_counter()
            for _ in range(args.new_tokens - 1):
                nxt = int(step([nxt]).argmax().item())
            dt = time.perf_counter() - t1
            if run > 0:  # run 0 warms up
                ttfts.append(ttft * 1e3)
                rates.append((args.new_tokens - 1) / dt)
        ttfts.sort()
        rates.sort()
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        print(f"hf bench: device={name} dtype={dtype} attention=eager prompt_tokens={args.prompt_tokens} "
              f"new_tokens={args.new_tokens} ttft_ms={ttfts[len(ttfts) // 2]:.2f} "
              f"decode_tokens_per_s={rates[len(rates) // 2]:.1f} torch={torch.__version__}")
        del model, step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--model", required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--out", required=True)
    r.add_argument("--tokens", type=int, default=32)
    r.set_defaults(fn=cmd_reference)
    b = sub.add_parser("bench")
    b.add_argument("--model", required=True)
    b.add_argument("--device", default="cuda")
    b.add_argument("--dtypes", default="float32,bfloat16")
    b.add_argument("--prompt-tokens", type=int, default=128)
    b.add_argument("--new-tokens", type=int, default=256)
    b.add_argument("--runs", type=int, default=3)
    b.set_defaults(fn=cmd_bench)
    g = sub.add_parser("check-gguf", help="dequantize every tensor (no torch): a self-test")
    g.add_argument("--model", required=True)
    g.set_defaults(fn=lambda a: print(
        "\n".join(f"{k} ty={v[0]} dims={v[1]} mean|x|={np.abs(dequantize(v[0], v[2], int(np.prod(v[1])))).mean():.6f}"
                  for k, v in list(read_gguf(a.model)[1].items())[:6])))
    args = ap.parse_args()
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
