"""The README points readers at lines of attention.py; keep those pointers true when the code moves."""
import os
import re

from helpers import ROOT

# what each linked line must hold
EXPECTED = {35: "def manual_attention", 53: "def causal_mask", 131: "def forward", 136: "self.c_attn(x)",
            143: "view(B, t.size(1), self.n_head, hs)", 162: "transpose(1, 2).contiguous()"}


def test_readme_line_links_into_attention_py_are_current():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(ROOT, "attention.py"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    linked = {int(n) for n in re.findall(r"attention\.py#L(\d+)", readme)}
    assert linked == set(EXPECTED), f"README links lines {sorted(linked)}; update EXPECTED or the README"
    for number, text in EXPECTED.items():
        assert text in lines[number - 1], f"attention.py line {number} no longer holds {text!r}: update the README"
    quoted = re.search(r"```python\n(.*?)```", readme.split("## How attention works")[1], re.S).group(1)
    for line in quoted.splitlines():  # the snippet shown is the code that runs
        code = line.split("#")[0].strip()
        assert code and code.replace("F.dropout(weights, dropout_p)", "weights") in \
            "\n".join(l.replace("F.dropout(weights, dropout_p)", "weights") for l in lines), code
