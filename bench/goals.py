"""
The goal table's column for this CPU (bench/README.md, "The speed and quality goals, by CPU class"), in one
command: each goal's own measurement run as a subprocess, its output and JSON kept, the column printed last.

    python bench/goals.py                                # ~30 min on a 2-core CPU, most of it the recipe
    python bench/goals.py --goals=loop,sample            # some of them
    python bench/goals.py --smoke=true --base_commit=HEAD --results=/tmp/g    # toy sizes: tests this script

  recipe       bench/recipe.py --configs=default --base_repo=BASE: train.py's iterations in 190 s >= 2x the
               base's; its val loss <= 1.47 on a CPU with bf16 instructions (<= 1.52 without) and >= 0.05
               below the base's (3 seeds); no busy warning in its runs' logs (run it on an idle machine). BASE is
               --base_commit checked out in a temporary `git worktree`, with its own data/prepare.py.
  loop         bench/train.py --variants=none --loop=50: train.py's loop <= 5 % beyond its step
  execution    bench/train.py configs/nanogpt_cpu_reference.toml --variants=execution: >= 1.5x nanoGPT's tokens/s
  sample       bench/sample.py --compile=true: generate >= 3x nanoGPT's loop (eager and compiled)
  gpt2         bench/sample.py --reference=transformers: >= 1.5x transformers' generate, the same tokens
  determinism  python train.py twice, one seed, compiled (the default): identical weights

Every command runs on the CPU (--device=cpu), so that a GPU machine measures its CPU. One that fails is a
row that says so, and the others still run. Each goal's JSON and log, and the column (goals.json), go to
--results. --smoke=true runs every command at toy sizes: its figures mean nothing.
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # run as a script, bench/ is on sys.path: the repository's modules are one level up
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dataclasses import asdict, dataclass

import torch

from bench.benchutil import (RESULTS, ROOT, holds_or_not, machine_info, md_table, parse, print_machine, run,
                             split_list, write_json)
from configurator import fail
from hardware import cpu_has_bf16
from interrupts import interrupted_by

GOALS = ("recipe", "loop", "execution", "sample", "gpt2", "determinism")
BASE_COMMIT = "e3eff70"  # the goal table's base: the code before the compiled step
TOY_MODEL = ["--n_layer=1", "--n_head=2", "--n_embd=32"]
BUSY = re.compile(r"another process is busy|: not cached")  # the busy check's warning, the peak probe's note
TRAIN_EVAL = "--eval_interval=1000 --eval_iters=200"  # as the goal table's recipe runs
RECIPE_RUNS = "recipe-runs"  # the recipe's work_dir, in the scratch folder


@dataclass
class Folders:
    results: str  # kept: each goal's JSON and log, and the column
    scratch: str  # thrown away at the end: the base's worktree, the runs' checkpoints

    def portable(self, text):
        """text as a kept log is written, naming no folder of this machine: the results' written <results>, the
        scratch folder's <scratch>, the checkout's left out, and the home folder's ~ where a path starts with it."""
        for path, name in ((self.results, "<results>"), (self.scratch, "<scratch>"), (ROOT + os.sep, "")):
            text = text.replace(path, name)
        home = os.path.expanduser("~")
        return text.replace(home + os.sep, "~" + os.sep) if home.strip(os.sep) else text


@dataclass
class GoalsBench:
    goals: str = ",".join(GOALS)  # which goals, comma-separated (see the top)
    base_commit: str = BASE_COMMIT  # the commit the recipe's iterations and val loss are compared with
    results: str = ""  # folder for each goal's JSON and log and the column; "": bench/results/goals-<cpu>/
    smoke: bool = False  # every command at toy sizes, in a minute or two: tests this script; no real figures


def commands(goal, cfg, folders, base):
    """The argv (after the interpreter) that measures goal, and the JSON it writes (among the results; the
    recipe's checkpoints in the scratch folder, not beside the kept results)."""
    out, toy = os.path.join(folders.results, f"{goal}.json"), cfg.smoke
    if goal == "recipe":
        train_args = " ".join([TRAIN_EVAL] + (["--compile=false", *TOY_MODEL] if toy else []))
        argv = ["bench/recipe.py", "--configs=default", f"--base_repo={base}", f"--train_args={train_args}",
                f"--work_dir={os.path.join(folders.scratch, RECIPE_RUNS)}"]
        toy_sizes = ["--max_seconds=2", "--seeds=1337", "--eval_batches=2", "--train_eval_iters=1"]
    elif goal == "loop":
        argv = ["bench/train.py", "--variants=none", f"--loop={2 if toy else 50}"]
        toy_sizes = ["--compile=false", "--repeats=2", "--warmup=1", "--batch_size=2", *TOY_MODEL]
    elif goal == "execution":
        argv = ["bench/train.py", "configs/nanogpt_cpu_reference.toml", "--variants=execution"]
        toy_sizes = ["--repeats=2", "--warmup=1", "--batch_size=2", *TOY_MODEL]
    elif goal == "sample":
        argv = ["bench/sample.py", f"--compile={not toy}"]
        toy_sizes = ["--max_new_tokens=8", "--repeats=1", "--warmup_tokens=2", *TOY_MODEL]
    elif goal == "gpt2":
        argv = ["bench/sample.py", "--reference=transformers"]
        toy_sizes = ["--max_new_tokens=4", "--repeats=1", "--warmup_tokens=2", *TOY_MODEL]
    else:
        return None, None  # determinism runs train.py itself (run_determinism)
    return argv + (toy_sizes if toy else []) + ["--device=cpu", f"--out={out}"], out


def run_logged(argv, log_name, folders):
    """Run [python, *argv] in the repository, its output shown and kept among the results as log_name (portable);
    its exit status."""
    print(f"\n=== {' '.join(argv)}", flush=True)
    with open(os.path.join(folders.results, log_name), "w") as log, subprocess.Popen(
            [sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        log.write(folders.portable(f"=== {' '.join(argv)}\n"))
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(folders.portable(line))
        except KeyboardInterrupt as e:  # Ctrl-C reached the child too; SIGTERM this process alone: passed on
            if interrupted_by(e) == signal.SIGTERM:
                proc.terminate()
            rest = proc.communicate()[0]  # its own clean-up (a recipe's runs stopped) before the scratch folder goes
            sys.stdout.write(rest)
            log.write(folders.portable(rest))
            raise
    return proc.returncode


def base_worktree(commit, where):
    """A `git worktree` of commit under where, with its own data prepared; its path, or None and why not."""
    path = os.path.join(where, "base")
    made = subprocess.run(["git", "worktree", "add", "--detach", path, commit], cwd=ROOT, capture_output=True,
                          text=True)
    if made.returncode:
        return None, f"git worktree add {commit} failed: {(made.stderr.strip() or made.stdout.strip())[:200]}"
    try:
        prepared = subprocess.run([sys.executable, "data/prepare.py"], cwd=path, capture_output=True, text=True)
    except KeyboardInterrupt:  # or SIGTERM: no worktree left registered in the repository
        remove_worktree(path)
        raise
    if prepared.returncode:
        remove_worktree(path)
        said = (prepared.stderr.strip() or prepared.stdout.strip() or f"exit {prepared.returncode}").splitlines()
        return None, f"data/prepare.py at {commit} failed: {said[-1][:200]}"
    return path, ""


def remove_worktree(path):
    subprocess.run(["git", "worktree", "remove", "--force", path], cwd=ROOT, capture_output=True)


def check_base_commit(commit):
    """One line and exit 2, before anything runs, unless git knows commit here (the recipe checks it out)."""
    try:
        known = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=ROOT,
                               capture_output=True).returncode == 0
    except OSError:  # no git at all
        known = False
    if not known:
        others = ",".join(g for g in GOALS if g != "recipe")
        fail(f"base_commit={commit!r} is not a commit of this git checkout: the recipe goal checks it out; give one "
             f"that `git log` lists, or leave the recipe out (--goals={others})")


def recipe_rows(report, runs):
    """The recipe goals' rows: (goal, figure, holds); runs: the folder of its runs' out_dirs."""
    mine, base = report["summary"]["default"], report["summary"]["base-default"]
    unfinished = [who for who, s in (("this checkout", mine), ("the base", base)) if not s["iterations"]["n"]]
    if unfinished or not (report["paired"] or {}).get("n"):
        who = " or ".join(unfinished) or "both checkouts with one seed"
        return [("the recipe against the base", f"failed: no run of {who} finished (recipe.log)", None)]
    ratio = mine["iterations"]["mean"] / base["iterations"]["mean"]
    bound = 1.47 if cpu_has_bf16() else 1.52
    val, below = mine["val_loss"]["mean"], report["paired"]["mean"]
    logs = glob.glob(os.path.join(runs, "default-seed*", "train.log"))  # this checkout's runs, not the base's
    warned = [path for path in logs if BUSY.search(Path(path).read_text(errors="replace"))]
    return [("iterations in 190 s >= 2x the base's", f"{ratio:.2f}x ({mine['iterations']['mean']:,.0f} against "
             f"{base['iterations']['mean']:,.0f})", ratio >= 2),
            (f"val loss <= {bound}", f"{val:.4f} (the base {base['val_loss']['mean']:.4f})", val <= bound),
            ("val loss >= 0.05 below the base's", f"{below:.3f} below, paired by seed", below >= 0.05),
            ("no busy warning on an idle machine", f"{len(warned)} of {len(logs)} runs warned", not warned)]


def rows_from(goal, report, recipe_runs):
    """A goal's rows, (goal, figure, holds), from the JSON its command wrote; recipe_runs: where the recipe's
    runs trained."""
    if goal == "recipe":
        return recipe_rows(report, recipe_runs)
    if goal == "loop":
        overhead = report["variants"][0]["loop_overhead"]
        return [("train.py's loop <= 5 % beyond its step", f"{overhead:+.1%}", overhead <= 0.05)]
    if goal == "execution":
        speed = {v["execution"]: v["tokens_per_s"] for v in report["variants"]}
        ratio = speed["default"] / speed["nanogpt"]
        return [("execution >= 1.5x nanoGPT's tokens/s", f"{ratio:.2f}x", ratio >= 1.5)]
    rows = [(f"{name.replace('_vs_', ' >= ')} x {r['min']:g}",
             f"{r['value']:.2f}x" + ("" if r["applies"] else " (not as stated: not a goal's figure)"),
             r["holds"] if r["applies"] else None)
            for name, r in report["requirements"].items()
            if not name.endswith("_vs_no_cache")]  # the cache against none: not in the table (block_size 256)
    return rows + [("the same greedy tokens", "yes" if report["greedy_identical"] else "no",
                    report["greedy_identical"])]


def run_determinism(cfg, folders):
    """Two train.py runs of one seed, their checkpoints in the scratch folder: their rows."""
    argv = ["train.py", "--max_seconds=0", f"--max_iters={3 if cfg.smoke else 100}", "--eval_iters=5", "--device=cpu",
            "--overwrite=true"] + (["--compile=false", *TOY_MODEL] if cfg.smoke else [])
    dirs = [os.path.join(folders.scratch, f"determinism-run{i}") for i in (1, 2)]
    for i, out_dir in enumerate(dirs, 1):
        if run_logged(argv + [f"--out_dir={out_dir}"], f"determinism-{i}.log", folders):
            return [("two runs of one seed: identical weights", f"run {i} failed (determinism-{i}.log)", False)]
    weights = [torch.load(os.path.join(d, "ckpt.pt"), weights_only=True)["model"] for d in dirs]
    same = weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    return [("two runs of one seed: identical weights", "identical" if same else "DIFFERENT", same)]


def measure(goal, cfg, folders, base, no_base):
    """Run goal's command: its rows, or one row that says why there are none (no_base: why base is None). A
    script that wrote its JSON and then exited with an error (sample.py, when the greedy tokens differ) still
    gives its rows; a JSON without a figure the goal needs (a variant that failed) is a failed row."""
    if goal == "determinism":
        return run_determinism(cfg, folders)
    if goal == "recipe" and base is None:
        return [("the recipe against the base", f"not run: {no_base}", None)]
    argv, out = commands(goal, cfg, folders, base)
    if os.path.exists(out):  # an earlier run's, which a failure now must not pass for its own
        os.remove(out)
    status = run_logged(argv, f"{goal}.log", folders)
    if not os.path.exists(out):
        return [(goal, f"failed: exit {status} ({goal}.log)", None)]
    with open(out) as f:
        report = json.load(f)
    try:
        return rows_from(goal, report, os.path.join(folders.scratch, RECIPE_RUNS))
    except (KeyError, ZeroDivisionError) as e:
        return [(goal, f"failed: {goal}.json lacks a figure ({type(e).__name__}: {e}; see {goal}.log)", None)]


def results_folder(given, slug):
    """The absolute folder for the results (given, else bench/results/goals-<slug>), made and checked writable
    here, before anything runs: one line and exit 2 where it cannot be."""
    path = os.path.abspath(given or os.path.join(RESULTS, f"goals-{slug}"))
    if os.path.exists(path) and not os.path.isdir(path):
        fail(f"results={given or path}: is a file, not a folder; pick another path")
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryDirectory(dir=path).cleanup()
    except OSError as e:
        fail(f"results={given or path}: cannot make or write that folder ({e.strerror or e}); pick another place")
    return path


def main(cfg):
    goals = split_list(cfg.goals, "goals", allowed=GOALS)
    if "recipe" in goals:
        check_base_commit(cfg.base_commit)
    info = machine_info("cpu")
    results = results_folder(cfg.results, re.sub(r"[^a-z0-9]+", "-", info["cpu"].lower()).strip("-"))
    print_machine(info)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        folders, base, no_base = Folders(results, scratch), None, ""
        try:
            if "recipe" in goals:
                base, no_base = base_worktree(cfg.base_commit, scratch)
            for goal in goals:
                rows += [(goal, *row) for row in measure(goal, cfg, folders, base, no_base)]
        except KeyboardInterrupt as e:  # not run()'s line: the goals that finished did write their results
            fail(f"interrupted: the goals that finished kept their JSON and log in {results}; no column was written",
                 status=128 + interrupted_by(e))
        finally:
            if base:
                remove_worktree(base)
    print("\n" + md_table(["goal", "what", "figure", "holds"],
                          [[g, what, figure, "-" if holds is None else holds_or_not(holds)]
                           for g, what, figure, holds in rows]))
    if cfg.smoke:
        print("(smoke: toy sizes; these figures say nothing of the goals)")
    write_json(os.path.join(results, "goals.json"),
               {"benchmark": "goals", "machine": info, "config": asdict(cfg),
                "rows": [dict(goal=g, what=w, figure=f, holds=h) for g, w, f, h in rows]})


if __name__ == "__main__":
    run(main, parse(GoalsBench, sys.argv[1:]))
