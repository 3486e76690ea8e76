"""Data: the Shakespeare corpus, tokenizers, writing a data dir (train.bin, val.bin, meta.json) and reading it."""
