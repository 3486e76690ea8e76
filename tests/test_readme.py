"""The README points readers at code by name and shows code from the files: keep both true when the
code moves. Code shown must be the code that runs; every function, class or method it names must exist."""
import importlib
import os
import re

import pytest

from helpers import ROOT

from test_layout import library_modules

MODULES = library_modules()
TOP_LEVEL = [m for m in MODULES if "." not in m]


def readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def source(name):
    with open(os.path.join(ROOT, name.replace(".", "/") + ".py"), encoding="utf-8") as f:
        return f.read()


def defined(module, dotted):
    """Does `dotted` (name or Class.attr) exist in the module?"""
    obj = importlib.import_module(module)
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def test_code_shown_is_code_in_the_files():
    blocks = re.findall(r"```python\n(.*?)```", readme(), re.S)
    assert blocks, "the README shows the heart of attention.py"
    for block in blocks:
        name = re.match(r"(?:def|class) (\w+)", block).group(1)
        home = [m for m in MODULES if re.search(rf"^(def|class) {name}\b", source(m), re.M)]
        assert home, f"the README shows {name}, which no module defines"
        assert block in source(home[0]), f"the README's {name} differs from {home[0]}.py: copy it again"


def test_every_class_member_named_exists():
    """`GPT.forward`, `MultiHeadAttention.forward`, `model.RUNTIME_SETTINGS`, ...: each resolves."""
    named = {ref for ref in re.findall(r"`(\w+\.\w+)[`(]", readme())
             if ref.rsplit(".", 1)[1] not in ("py", "toml", "json", "jsonl", "bin", "pt", "png", "txt")}
    assert "GPT.forward" in named
    for ref in named:
        head = ref.split(".")[0]
        if head in MODULES:
            assert defined(head, ref.split(".", 1)[1]), f"README names {ref}, which {head}.py lacks"
        elif head[0].isupper():
            assert any(defined(m, ref) for m in MODULES), f"README names {ref}, which no module defines"


@pytest.mark.parametrize("module", TOP_LEVEL)
def test_the_reading_guide_names_what_each_file_holds(module):
    row = re.search(rf"^\| \[`{module}\.py`\]\({module}\.py\) \| (.*) \|$", readme(), re.M)
    assert row, f"the README's table of files has no row for {module}.py"
    files = (".py", ".jsonl", ".png", ".html", ".pt")
    names = [n for n in re.findall(r"`([A-Za-z_][\w.]*)`", row.group(1)) if not n.endswith(files)]
    code_names = [n for n in names if "_" in n or n[0].isupper() or "." in n]
    for name in code_names:
        assert defined(module, name), \
            f"the README says {module}.py holds {name}"


def test_every_result_file_the_readmes_cite_is_in_the_repository():
    """A figure's JSON or log travels with the README that cites it (`{a,b}` cites several; FILE is a placeholder)."""
    import itertools
    text = "".join(open(os.path.join(ROOT, name), encoding="utf-8").read() for name in ("README.md", "bench/README.md"))
    cited = set(re.findall(r"bench/results/[\w./{},-]+\.(?:json|log|txt|out)", text)) - {"bench/results/FILE.json"}
    assert len(cited) > 50, "the pattern no longer finds the cited files"
    for path in cited:
        pieces = [p[1:-1].split(",") if p.startswith("{") else [p] for p in re.split(r"(\{[^}]*\})", path)]
        for one in map("".join, itertools.product(*pieces)):
            assert os.path.exists(os.path.join(ROOT, one)), f"a README cites {one}, which the repository lacks"
