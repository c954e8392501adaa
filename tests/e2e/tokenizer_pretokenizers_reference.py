"""tokenizer.json files with the pre-tokenizers of real Llama-architecture models, and how the
`tokenizers` library encodes texts with them, as the reference of llama_tokenizer_parity_test.

Each case trains a small byte-level BPE on the corpus with a real model's pre-tokenizer:
  llama3: Llama 3's Split regex then ByteLevel without its own regex; BPE with ignore_merges and
          a few whole words in the vocabulary that no merge makes (so ignore_merges shows);
          Sequence[ByteLevel, TemplateProcessing] post-processor adding <|begin_of_text|>.
  smollm: SmolLM/SmolLM2's Digits(individual_digits) then ByteLevel with GPT-2's regex; no
          template.
  qwen2:  Qwen2's NFC normalizer, then its Split regex (Llama 3's with single digits) and
          ByteLevel without regex; its three special tokens; no template (as transformers'
          Qwen2Converter builds it).
  o200k:  GPT-4o's Split regex (Phi-4's and Phi-4-mini's tokenizer.json) then ByteLevel
          without regex; no template.
  tekken: Mistral NeMo's (the same without contractions, with single digits).
  deepseek_v3: DeepSeek-V3's Sequence of three isolating Splits (numbers in groups of three,
          runs of kana and CJK ideographs, then its pattern) and ByteLevel without regex; also
          written as llama.cpp's converter writes a DeepSeek-V3 vocabulary (OUT/deepseek_v3/
          tokenizer.gguf: architecture deepseek2, model gpt2, pre "deepseek-v3").
and writes OUT/<case>/tokenizer.json, OUT/<case>/ids.json (the ids of each text of TEXTS.json)
and OUT/<case>/words.json (where the pre-tokenizer ends each word of each text, in code points).
Usage: tokenizer_pretokenizers_reference.py CORPUS TEXTS.json OUT
Produced with tokenizers 0.21 (scripts/setup_python_refs.sh).
"""
import json
import os
import sys

from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# GPT-4o's (o200k_base, Phi-4-mini's) and Mistral NeMo's Tekken pattern, as their tokenizer.json
# holds them.
O200K_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
                 r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_PATTERN = O200K_PATTERN.replace(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?", "").replace(
    r"\p{N}{1,3}", r"\p{N}")
# DeepSeek-V3's three Split patterns, as its tokenizer.json holds them.
DEEPSEEK_V3_PATTERNS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"""
    r""" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
]
# Whole words added to llama3's vocabulary without merges: BPE alone would split them.
WHOLE_WORDS = ["Ġpossession", "Ġuniversally", "Ġacknowledged", "ĠElizabeth"]


def train(corpus, pre_tokenizer, specials, normalizer=None):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([corpus], trainer)
    return tok


def llama3(corpus):
    tok = train(corpus, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        ["<|begin_of_text|>", "<|end_of_text|>"])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", 0)])])
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    vocab = j["model"]["vocab"]
    for w in WHOLE_WORDS:
        vocab.setdefault(w, len(vocab))
    return Tokenizer.from_str(json.dumps(j))


def smollm(corpus):
    return train(corpus, pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])


def qwen2(corpus):
    tok = train(corpus, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        QWEN2_SPECIALS, normalizer=normalizers.NFC())
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def split_then_byte_level(corpus, pattern, specials):
    tok = train(corpus, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), specials)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def o200k(corpus):
    return split_then_byte_level(corpus, O200K_PATTERN, ["<|endoftext|>"])


def tekken(corpus):
    return split_then_byte_level(corpus, TEKKEN_PATTERN, ["<unk>", "<s>", "</s>"])


def deepseek_v3(corpus):
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
              for p in DEEPSEEK_V3_PATTERNS]
    tok = train(corpus, pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        ["<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def write_gguf_vocab(tok, path):
    """The vocabulary as convert_hf_to_gguf.py's _set_vocab_gpt2 writes DeepSeek-V3's: tokens by
    id, the merges, the special tokens as control tokens, no BOS added."""
    from gguf import GGUFWriter
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {a["id"] for a in j["added_tokens"]}
    w = GGUFWriter(path, "deepseek2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("deepseek-v3")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in specials else 1 for i in range(len(tokens))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]])
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    corpus, texts_path, out = sys.argv[1:4]
    with open(texts_path, encoding="utf-8") as f:
        texts = json.load(f)
    for name, make in (("llama3", llama3), ("smollm", smollm), ("qwen2", qwen2),
                       ("o200k", o200k), ("tekken", tekken), ("deepseek_v3", deepseek_v3)):
        tok = make(corpus)
        os.makedirs(os.path.join(out, name), exist_ok=True)
        tok.save(os.path.join(out, name, "tokenizer.json"))
        with open(os.path.join(out, name, "ids.json"), "w") as f:
            json.dump([tok.encode(t).ids for t in texts], f)
        if name == "deepseek_v3":
            write_gguf_vocab(tok, os.path.join(out, name, "tokenizer.gguf"))
        with open(os.path.join(out, name, "words.json"), "w") as f:
            json.dump([[end for _, (_, end) in tok.pre_tokenizer.pre_tokenize_str(t)]
                       for t in texts], f)


if __name__ == "__main__":
    main()
