"""SentencePiece-style BPE tokenizers as Llama 2, Mistral and TinyLlama ship them, and how the
`tokenizers` library (tokenizer.json) and transformers' GGUF loader (tokenizer.ggml.model "llama")
encode texts with them, as the reference of llama_tokenizer_parity_test.

A BPE is trained on the corpus over "▁"-prefixed words, as SentencePiece trains; its vocabulary
is laid out as Llama 2's: <unk> <s> </s>, the 256 <0xXX> byte tokens, then the pieces. The
alphabet is limited, so that rarer characters fall back to their bytes. Cases:
  llama2:   the "legacy" normalizer Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer
            (Llama 2, TinyLlama, Mistral 7B v0.1); template "<s> $A".
  mistral:  no normalizer, Metaspace(prepend_scheme="first", split=False) (transformers'
            non-legacy Llama tokenizers); template "<s> $A".
  split:    Metaspace(prepend_scheme="always", split=True), without the byte tokens of bytes
            0xE0 and up (characters of three and four bytes become <unk>) and without fuse_unk.
  gguf:     a GGUF holding the llama2 vocabulary with scores (no merges), read by transformers
            4.47's GGUF loader, which makes merges from the scores.
Writes OUT/<case>/tokenizer.json (OUT/gguf/tokenizer.gguf) and OUT/<case>/ids.json, the ids of
each text of TEXTS.json; OUT/<case>/decoded.json, the decoding of each text's ids.
Usage: tokenizer_sentencepiece_reference.py CORPUS TEXTS.json OUT
Produced with tokenizers 0.21, transformers 4.47.1, gguf 0.10.0 (scripts/setup_python_refs.sh).
"""
import json
import os
import sys

from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

SPACE = "\u2581"
SPECIALS = ["<unk>", "<s>", "</s>"]


def trained_pieces(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=600, limit_alphabet=50, show_progress=False)
    tok.train([corpus], trainer)
    model = json.loads(tok.to_str())["model"]
    pieces = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return pieces, merges


def llama_vocab(pieces, byte_ok=lambda b: True):
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for b in range(256):
        if byte_ok(b):
            vocab["<0x%02X>" % b] = len(vocab)
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    return vocab


def assemble(vocab, merges, fuse_unk=True):
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=fuse_unk,
                               byte_fallback=True))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    return tok


def llama2_tokenizer(corpus):
    pieces, merges = trained_pieces(corpus)
    tok = assemble(llama_vocab(pieces), merges)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE),
                                           normalizers.Replace(" ", SPACE)])
    return tok


def write_gguf(path, vocab):
    from gguf import GGUFWriter
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    # SentencePiece's scores: specials and bytes 0, pieces lower the later they were learnt;
    # three pieces share each score, so that ties order merges as transformers orders them.
    scores = [0.0 if i < 3 + 256 else -float(i // 3) for i in range(len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    w = GGUFWriter(path, "llama")
    w.add_name("sentencepiece-test")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    corpus, texts_path, out = sys.argv[1:4]
    with open(texts_path, encoding="utf-8") as f:
        texts = json.load(f)
    pieces, merges = trained_pieces(corpus)
    cases = {"llama2": llama2_tokenizer(corpus)}
    tok = assemble(llama_vocab(pieces), merges)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first",
                                                 split=False)
    cases["mistral"] = tok
    tok = assemble(llama_vocab(pieces, lambda b: b < 0xE0), merges, fuse_unk=False)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always",
                                                 split=True)
    cases["split"] = tok
    for name, tok in cases.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        tok.save(os.path.join(out, name, "tokenizer.json"))
        ids = [tok.encode(t).ids for t in texts]
        with open(os.path.join(out, name, "ids.json"), "w") as f:
            json.dump(ids, f)
        with open(os.path.join(out, name, "decoded.json"), "w") as f:
            json.dump([tok.decode(i) for i in ids], f)

    from transformers import AutoTokenizer
    os.makedirs(os.path.join(out, "gguf"), exist_ok=True)
    write_gguf(os.path.join(out, "gguf", "tokenizer.gguf"), llama_vocab(pieces))
    hf = AutoTokenizer.from_pretrained(os.path.join(out, "gguf"), gguf_file="tokenizer.gguf")
    ids = [hf(t)["input_ids"] for t in texts]
    with open(os.path.join(out, "gguf", "ids.json"), "w") as f:
        json.dump(ids, f)
    with open(os.path.join(out, "gguf", "decoded.json"), "w") as f:
        json.dump([hf.decode(i, skip_special_tokens=True) for i in ids], f)


if __name__ == "__main__":
    main()
