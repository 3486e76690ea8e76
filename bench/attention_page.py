"""
Size of the attention page (sample.py --attention_map=FILE.html), and the time to write it, for two
models on random weights and random text (a page's size depends only on the shape, the number of
tokens and the window, not on which tokens or weights):

  default   train.py's default model (4 layers x 4 heads, block_size 64) over 1,000 tokens
  gpt2      GPT-2 124M (12 x 12, block_size 1024) over 256 tokens

    python bench/attention_page.py
    python bench/attention_page.py --cases=default --default_tokens=200 --out=/tmp/p.json   # smoke test

Each page is written by attention_map.write_attention_page, as sample.py writes it, to a temporary
directory. Goals (printed): a few MB (<= 5 MB) for the default model over 1,000 tokens, <= 20 MB for
GPT-2 over 256 tokens.
"""
import os
import sys
import tempfile
import time

if __name__ == "__main__":  # run as a script, bench/ is on sys.path: the repository's modules are one level up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import asdict, dataclass

import torch

from attention_map import write_attention_page
from bench.benchutil import (holds_or_not, machine_info, md_table, out_path, parse, print_machine, run, split_list,
                             write_json)
from configurator import check_at_least
from data.tokenizer import GPT2Tokenizer
from model import GPT, GPTConfig
from train import TrainConfig, model_config, with_machine_width

CASES = ("default", "gpt2")
GOAL_MB = {"default": 5.0, "gpt2": 20.0}  # at the stated token counts
STATED_TOKENS = {"default": 1000, "gpt2": 256}


@dataclass
class PageBench:
    cases: str = ",".join(CASES)  # which models, comma-separated: default, gpt2
    default_tokens: int = STATED_TOKENS["default"]  # the text's length for train.py's default model
    gpt2_tokens: int = STATED_TOKENS["gpt2"]  # the text's length for GPT-2 124M
    seed: int = 1337  # for the random weights and the text
    out: str = ""  # JSON path; "": bench/results/attention-page-cpu.json

    def __post_init__(self):
        check_at_least(self, 1, "default_tokens", "gpt2_tokens")


def case_model(case, seed):
    """(model, a label per token id): random weights of the case's shape."""
    torch.manual_seed(seed)
    if case == "gpt2":
        tokenizer = GPT2Tokenizer()
        return GPT(GPTConfig()).eval(), lambda i: tokenizer.decode([i])
    characters = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ\n.,;:!?'-&$3"  # 65, as the default corpus
    default = with_machine_width(TrainConfig(), "cpu")  # train.py's default model on this CPU
    return GPT(model_config(default, len(characters))).eval(), lambda i: characters[i]


def measure(case, n_tokens, seed, work_dir):
    model, label = case_model(case, seed)
    ids = torch.randint(model.config.vocab_size, (n_tokens,), generator=torch.Generator().manual_seed(seed)).tolist()
    path = os.path.join(work_dir, f"{case}.html")
    start = time.perf_counter()
    write_attention_page(model, ids, [label(i) for i in ids], 1, path, case)
    seconds = time.perf_counter() - start
    c = model.config
    mb = os.path.getsize(path) / 1e6
    stated = n_tokens == STATED_TOKENS[case]
    return {"n_layer": c.n_layer, "n_head": c.n_head, "block_size": c.block_size, "tokens": n_tokens,
            "mb": mb, "write_s": seconds, "goal_mb": GOAL_MB[case], "applies": stated,
            "holds": mb <= GOAL_MB[case] if stated else None}


def main(cfg):
    cases = split_list(cfg.cases, "cases", allowed=CASES)
    out = out_path(cfg.out, "attention-page", "cpu")
    info = machine_info("cpu")
    print_machine(info)
    results = {}
    with tempfile.TemporaryDirectory() as work_dir:
        for case in cases:
            results[case] = measure(case, cfg.default_tokens if case == "default" else cfg.gpt2_tokens, cfg.seed,
                                    work_dir)
    print(md_table(["model", "layers x heads", "block_size", "tokens", "page MB", "written in s"],
                   [[case, f"{r['n_layer']} x {r['n_head']}", r["block_size"], f"{r['tokens']:,}", f"{r['mb']:.1f}",
                     f"{r['write_s']:.1f}"] for case, r in results.items()]))
    for case, r in results.items():
        verdict = holds_or_not(r["holds"]) if r["applies"] else \
            f"not applicable (stated over {STATED_TOKENS[case]} tokens)"
        print(f"requirement {case} page <= {r['goal_mb']:.0f} MB: {verdict}")
    write_json(out, {"benchmark": "attention_page", "machine": info, "config": asdict(cfg), "results": results})


if __name__ == "__main__":
    run(main, parse(PageBench, sys.argv[1:]))
