#!/usr/bin/python3
"""Reference token ids from Hugging Face `tokenizers` for the C++ tokenizer tests.

Writes tests/fixtures/tokenizers/:
  bytelevel_gpt2.json   a small byte-level BPE (GPT-2 pre-tokenizer regex, ByteLevel decoder,
                        special tokens <|endoftext|>, <|im_start|>, <|im_end|>), trained here on
                        the texts below (vocabulary 400)
  bytelevel_llama3.json the same training data with a Llama-3 style pipeline: Split(regex, the
                        Llama-3 pattern) + ByteLevel(use_regex=false), Digits, ignore_merges,
                        and a TemplateProcessing post-processor that prepends <|begin_of_text|>
  spm_bytefallback.json a SentencePiece-style BPE as Llama 2's tokenizer.json is built: normalizer
                        Prepend("▁") + Replace(" " → "▁"), byte_fallback with the 256 <0xXX>
                        tokens in the vocabulary, fuse_unk, decoder Replace/ByteFallback/Fuse/
                        Strip, post-processor "<s> $A"
  spm_metaspace.json    the same model with the newer Metaspace pre-tokenizer (prepend_scheme
                        "first") and Metaspace decoder instead of the normalizer
  expected.json         {tokenizer: {text: ids}} for every tokenizer and every text in TEXTS,
                        including TinyStories-656K's tokenizer.json (from ../shared/data, read,
                        not copied), with add_special_tokens=True (the post-processor applied)

Usage:
    /usr/bin/python3 scripts/make_tokenizer_fixtures.py [--data ../shared/data] [--out tests/fixtures/tokenizers]
Needs `tokenizers` (tested 0.19.1; `pip install --break-system-packages tokenizers`).
The tests compare our encode() with these ids and check decode(encode(x)) == x.
"""

import argparse
import json
import os
import re

import tokenizers
from tokenizers import (Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)

# Text of TinyStories-656K's model card ("Generation example"), read from the shared data folder.
def model_card_story(data):
    path = os.path.join(data, "tinystories-656k", "bf16_upstream", "README.md")
    text = open(path, encoding="utf-8").read()
    m = re.search(r"Generation example:\s*```\n(.*?)\n```", text, re.S)
    assert m, "no generation example in " + path
    story = m.group(1)
    return story.replace("<|end_story|>", "")


TEXTS = [
    "Once upon a time, there was a little girl named Lily.",
    "Hello world",
    " leading space and  two spaces",
    "tabs\tand\nnew lines\n\n  indented",
    "Numbers 12345 and 3.14159, dates 2024-05-27.",
    "Unicode: café naïve 世界 🙂 — “quotes” Ω≈ç√",
    "I'm sure they'll say we've done it, isn't it?",
    "<|start_story|>Once upon a time<|end_story|>",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "",
    "   ",
    "a",
    "Emoji 🙂 and Ωμέγα and 世界",
    "<s>Two <s> specials</s> inside",
]

TRAIN = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "One day, she saw a big red ball. She wanted to play with it. Her mom said yes.",
    "The numbers are 1, 22, 333 and 4444. It's 12:30 now; we'll see what they've got.",
    "Unicode text: café, naïve, 世界, emoji 🙂 and more.",
] * 20


def train(pre, decoder, post, ignore_merges):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges) if ignore_merges else models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                  "<|im_end|>", "<|begin_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TRAIN, trainer)
    if post is not None:
        tok.post_processor = post(tok)
    return tok


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                  "tokenizers"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel(), None, False)
    gpt2.save(os.path.join(args.out, "bytelevel_gpt2.json"))

    llama3 = train(
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(tokenizers.Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.Digits(individual_digits=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        decoders.ByteLevel(),
        lambda t: processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>",
                                                            t.token_to_id("<|begin_of_text|>"))]),
        True)
    llama3.save(os.path.join(args.out, "bytelevel_llama3.json"))

    for name, norm, pre, dec in [
            ("spm_bytefallback",
             normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
             None,
             decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                decoders.Fuse(), decoders.Strip(" ", 1, 0)])),
            ("spm_metaspace", None,
             pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
             decoders.Metaspace(replacement="▁", prepend_scheme="first"))]:
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        if norm is not None:
            tok.normalizer = norm
        if pre is not None:
            tok.pre_tokenizer = pre
        tok.decoder = dec
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                      show_progress=False)
        tok.train_from_iterator([t.replace(" ", "▁") if norm is None else t for t in TRAIN]
                                if False else TRAIN, trainer)
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
        path = os.path.join(args.out, name + ".json")
        tok.save(path)
        # Add the 256 byte tokens to the model's vocabulary (as Llama 2's tokenizer.json has them).
        j = json.load(open(path, encoding="utf-8"))
        vocab = j["model"]["vocab"]
        n = max(vocab.values()) + 1
        for b in range(256):
            vocab["<0x%02X>" % b] = n + b
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)

    story = model_card_story(args.data)
    texts = TEXTS + [story]
    expected = {"tokenizers_version": tokenizers.__version__, "model_card_story": story}
    ts = Tokenizer.from_file(os.path.join(args.data, "tinystories-656k", "bf16_upstream",
                                          "tokenizer.json"))
    for name, tok in [("bytelevel_gpt2", gpt2), ("bytelevel_llama3", llama3),
                      ("spm_bytefallback", None), ("spm_metaspace", None),
                      ("tinystories_656k", ts)]:
        # Reload from the saved file so the ids are those of the JSON the tests read.
        if name != "tinystories_656k":
            tok = Tokenizer.from_file(os.path.join(args.out, name + ".json"))
        expected[name] = {t: tok.encode(t).ids for t in texts}
        expected[name + ":decode"] = {t: tok.decode(tok.encode(t).ids, skip_special_tokens=True)
                                      for t in texts}
    with open(os.path.join(args.out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
    print("story tokens (TinyStories-656K, with BOS):", len(expected["tinystories_656k"][story]))


if __name__ == "__main__":
    main()
