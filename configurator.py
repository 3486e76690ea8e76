"""
Settings for every script: a dataclass gives each one a type, a default and (in its trailing
comment) a meaning; a TOML file overrides some, `--key=value` flags override those. Nothing is
exec'd; a wrong key or value is one clear line (fail), as is any bad input (first_line makes an
exception's message one; whole_number is the count check every module shares, check_at_least the
range check). The dataclasses live with their scripts: TrainConfig in train.py, SampleConfig in
sample.py, PrepareConfig in data/prepare.py.

    python train.py configs/shakespeare_char_gpu.toml --batch_size=16 --compile=true
    python train.py --help
"""
import ast
import dataclasses
import difflib
import inspect
import io
import math
import os
import re
import shlex
import shutil
import signal
import sys
import textwrap
import tokenize
import types
import typing

if sys.version_info < (3, 11):  # tomllib, which reads the config files, came with 3.11: one line, not its traceback
    sys.exit(f"error: this code needs Python 3.11 or newer; this is {sys.version.split()[0]}")
import tomllib  # noqa: E402

from files import silence


class ConfigError(ValueError):
    pass


UNQUOTE = "; write it without quotes"  # the end of the message for a value TOML read as a string


class OutOfRange(ConfigError):
    """A value of the right type that no setting can take (an integer beyond 64 bits)."""


def under_torchrun():
    """Whether this process is one of torchrun's workers: torchrun gives each its RANK (with LOCAL_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE), and train.py then joins their process group."""
    return "RANK" in os.environ


def fail(message, status=2):
    """The one way scripts report bad input: a single line on stderr, no traceback. Under torchrun, where
    every process reaches this verdict (distributed.fail_together), each machine's first process says it
    and the others exit quietly, so the terminal shows the line once rather than once per process."""
    if not under_torchrun() or os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def first_line(error, with_type=False):
    """An exception's message as one line for a user: its first line, after its type's name if asked;
    its type's name alone where it says nothing (a bare assert)."""
    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    return f"{type(error).__name__}: {lines[0]}" if with_type else lines[0]


def whole_number(x):
    """An int that is not a bool (True is an int to Python, not a count to a user)."""
    return isinstance(x, int) and not isinstance(x, bool)


def real_number(x):
    """An int or a float that is not a bool: a number as a user or a JSON record writes one."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# what a value of each plain type must be, for check_types (a bool is an int to Python, not to a user)
TYPE_CHECKS = {int: whole_number, bool: lambda v: isinstance(v, bool), float: real_number}


def check_positive(config, *names):
    """Each named setting is above 0 (a rate, a time): where 0 would mean nothing, unlike check_at_least(0)."""
    for name in names:
        if not getattr(config, name) > 0:
            raise ValueError(f"{name} must be positive, got {getattr(config, name)}")


def check_at_least(config, minimum, *names, meaning=""):
    """The range check every config's __post_init__ shares: each named setting is at least `minimum`
    (None, an optional setting left unset, passes). `meaning` says what the boundary value does, e.g.
    "0: a time budget"."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value < minimum:
            raise ValueError(f"{name} must be at least {minimum}{f' ({meaning})' if meaning else ''}, got {value}")


def check_types(config):
    """ValueError naming the first setting whose value is not of its declared type (int: a whole number,
    not a bool; float: a number; bool: True or False) or not one of its Literal's choices: for a config
    built in Python, which the parsing of --key=value and TOML (convert) never sees. The code branches on
    the choices' names, and an unknown one (a typo, a checkpoint of forked code) would quietly get another
    branch (TrainConfig(optimizer="sgd") an AdamW run). Other types are checked where they are used."""
    hints = field_types(type(config))
    for name in (f.name for f in dataclasses.fields(config)):
        value, tp = getattr(config, name), hints.get(name)
        if tp in TYPE_CHECKS and not TYPE_CHECKS[tp](value):
            raise ValueError(f"{name} must be {tp.__name__}, got {value!r}")
        choices = literal_choices(tp)
        if choices and value not in choices and not (value is None and allows_none(tp)):
            raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(map(str, choices))}")


def field_types(cls):
    """{field: its type} for a dataclass and those it extends (typing.get_type_hints: under `from __future__ import
    annotations` the types are strings). Where a class's types name what is gone since (a type made inside the
    function that made the class), that class's own fields, and those it redeclares, are left out; its bases'
    others are kept."""
    try:
        return typing.get_type_hints(cls)
    except NameError:
        pass
    types = {}
    for klass in reversed(cls.__mro__):
        own = inspect.get_annotations(klass)
        try:
            hints = typing.get_type_hints(klass)
            types.update({name: hints[name] for name in own})
        except NameError:
            for name in own:
                types.pop(name, None)
    return types


def literal_choices(tp):
    """The choices of a Literal type, or of the Literal in an Optional one; () for any other type."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(filter(None, map(literal_choices, typing.get_args(tp))), ())
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else ()


def allows_none(tp):
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def check_folders_named(config, *names):
    """ValueError for a folder setting given as nothing (--out_dir=), which names no folder: the errors it led to
    later named none either ("no meta.json in :")."""
    for name in names:
        if not getattr(config, name):
            default = next(f.default for f in dataclasses.fields(config) if f.name == name)
            raise ValueError(f"{name} is empty; give a folder (the default is --{name}={as_typed(default)})")


def expand_home(config, *names):
    """A leading ~ in each named path setting is the home directory (~user's too), as in a shell, which
    expands it only at the start of a word and so never after --key= (bash's own assignments aside)."""
    for name in names:
        setattr(config, name, os.path.expanduser(getattr(config, name)))


def type_name(tp):
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(repr(c) for c in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):  # a bool or none: "true, false or none"
        names = [name for a in typing.get_args(tp) for name in (("true", "false") if a is bool else (type_name(a),))]
        return f"{', '.join(names[:-1])} or {names[-1]}"
    return {type(None): "none", bool: "true or false"}.get(tp, tp.__name__)


SETTABLE_TYPES = "int, float, bool, str, a Literal of choices, or Optional of one of those"  # convert's kinds


def settable(tp):
    """Whether --key=value and TOML can set a field of type tp: one of SETTABLE_TYPES."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        others = [a for a in args if a is not type(None)]
        return len(others) == 1 < len(args) and settable(others[0])
    return origin is typing.Literal or tp in (int, float, bool, str)


def parses_as(tp, text):
    """Whether tp(text) reads text as a value of type tp (int("2"), float("1e-3"))."""
    try:
        tp(text)
    except ValueError:
        return False
    return True


def takes_type(tp, value):
    """Whether value is of a kind that a field of type tp holds: one of a Literal's choices' types, None
    for an Optional, an int for a float. Its choices and range are convert's to check."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return any(type(value) is type(choice) for choice in args)
    if origin in (typing.Union, types.UnionType):
        return any(takes_type(arg, value) for arg in args)
    return type(value) in ((int, float) if tp is float else (tp,))


def shown(value):
    """A value a user gave, as they wrote it: TOML's booleans are true and false, not Python's True and False."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def convert(key, tp, value, from_text):
    """Check (TOML) or parse (command line text) one value against the field's type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:  # text is the choice it spells: "2" is 2 where the choices are numbers
        chosen = [c for c in args if (as_typed(c) == value if from_text else c == value and type(c) is type(value))]
        if not chosen:
            raise ConfigError(f"{key}={shown(value)} is not a valid choice; choose one of: {type_name(tp)}")
        return chosen[0]
    if type(None) in args:  # Optional[X]; TOML has no null, so there too "none" is None
        if isinstance(value, str) and value.lower() in ("none", "null") + (("",) if from_text else ()):
            return None
        try:
            return convert(key, next(a for a in args if a is not type(None)), value, from_text)
        except OutOfRange:
            raise
        except ConfigError as e:  # the wrong kind of value: say that none is a choice too
            got = f"the string {value!r}{UNQUOTE}" if str(e).endswith(UNQUOTE) else shown(value)
            raise ConfigError(f"{key} must be {type_name(tp)}, got {got}") from None
    if tp is bool:
        if not from_text:
            ok = isinstance(value, bool)
            if isinstance(value, str):
                raise ConfigError(f"{key} must be true or false, got the string {value!r}{UNQUOTE}")
        elif value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        else:
            raise ConfigError(f"{key} must be true or false (or 1/0, yes/no, on/off), got {value!r}")
    elif tp in (int, float):
        ok = (whole_number if tp is int else real_number)(value)
        if not from_text and isinstance(value, str) and parses_as(tp, value):  # a number in TOML's quotes
            raise ConfigError(f"{key} must be {type_name(tp)}, got the string {value!r}{UNQUOTE}")
        if from_text:
            try:
                value, ok = tp(value), True
            except ValueError:
                ok = False
    else:  # str
        ok = from_text or isinstance(value, str)
    if ok and tp is float:
        try:
            finite = math.isfinite(float(value))
        except OverflowError:  # a TOML integer too large for a float
            finite = False
        if not finite:
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
    if ok and tp is int and not -2**63 <= int(value) < 2**63:  # torch's integers are 64-bit: an overflow later
        raise OutOfRange(f"{key}={value} does not fit in 64 bits; give a smaller number")
    if ok and tp is str and "\0" in value:  # no path or name holds one: the OS refuses it later, nameless
        raise ConfigError(f"{key} holds a NUL character ({value!r}); remove it")
    if ok:
        return tp(value)
    raise ConfigError(f"{key} must be {type_name(tp)}, got {shown(value)}")


def field_comments(cls):
    """{field: its trailing comment} for a dataclass and the dataclasses it extends (a subclass's own
    comment wins): the comments in the source are the one description of each setting. A comment goes
    on over the comment-only lines right below it that are indented past the field (a section's own
    comment, at the fields' indentation, is not one)."""
    comments = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))  # a class defined inside a function is indented
        except OSError:  # no source to read (made by make_dataclass, or typed at the prompt): no comments
            continue
        lines = source.splitlines()
        on_line = {tok.start[0]: tok.string.lstrip("# ").strip()
                   for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
        for node in ast.parse(source).body[0].body:
            if isinstance(node, ast.AnnAssign) and node.lineno in on_line:
                text, row = [on_line[node.lineno]], node.end_lineno  # row: the next line's index in lines
                while row < len(lines) and lines[row].lstrip().startswith("#") and \
                        len(lines[row]) - len(lines[row].lstrip()) > node.col_offset:
                    text.append(on_line[row + 1])
                    row += 1
                comments[node.target.id] = " ".join(text)
    return comments


REPOSITORY = os.path.dirname(os.path.abspath(__file__))  # where train.py, sample.py and data/ are


def python_command():
    """The interpreter as a command names it: python, or where no python is on PATH (Debian's own Python, say)
    this one's name (python3) where PATH finds this same one by it, else its whole path (a venv not activated)."""
    if shutil.which("python"):
        return "python"
    name, found = os.path.basename(sys.executable), shutil.which(os.path.basename(sys.executable))
    return name if found and os.path.realpath(found) == os.path.realpath(sys.executable) else sys.executable


def run_command(script):
    """`python SCRIPT`, for a message that names a command to run: the repository's script as the working
    directory reaches it (sample.py in the repository, ../gpt/sample.py from beside it)."""
    return f"{python_command()} {shlex.quote(os.path.relpath(os.path.join(REPOSITORY, script)))}"


def as_typed(value):
    """A value as one would type it after --key= in a shell (true, none, plain words; quoted where a shell would
    read it otherwise: a space, &, $, a glob, an empty string; a newline as bash writes one: $'\\n')."""
    if value is None or isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and not value.isprintable():
        return "$'" + "".join(bash_escaped(c) for c in value) + "'"
    return shlex.quote(value) if isinstance(value, str) else str(value)


def bash_escaped(c):
    """One character as bash's $'...' reads it back: a control character escaped (\\n, \\x07, \\u2028), a
    printable one as itself (é stays é: bash reads \\xe9 as that one byte, not as UTF-8)."""
    if c in "\\'":
        return "\\" + c
    return c if c.isprintable() else c.encode("unicode_escape").decode("ascii")


def help_text(cls, given=None, sources=()):
    """What --help prints: every setting with its default, its meaning and its type, in columns; where config
    files came before --help (sources), the values they set (given) in place of the defaults. A class whose
    arguments mean something else says so in its USAGE (a ClassVar)."""
    hints, comments = typing.get_type_hints(cls), field_comments(cls)
    values = {f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
              for f in dataclasses.fields(cls)}  # as declared: __post_init__ may fill some from others
    flags = {name: f"--{name}=" + ("<required>" if value is dataclasses.MISSING else as_typed(value))
             for name, value in {**values, **(given or {})}.items()}
    width = max(map(len, flags.values()))
    usage = getattr(cls, "USAGE", "[config.toml ...] [--key=value ...]\n"
                                  "A TOML file overrides the defaults below; --key=value overrides both.")
    lines = [f"usage: python {os.path.relpath(sys.argv[0])} {usage}", ""]
    if sources:
        lines += [f"The values below are the defaults as {', '.join(sources)} set{'s' * (len(sources) == 1)} them.", ""]
    lines += [f"  {flag:<{width}}  {comments.get(name, '')} [{type_name(hints[name])}]" for name, flag in flags.items()]
    return "\n".join(lines)


def print_help(cls, given=None, sources=()):
    """Print help_text and exit 0; a reader that leaves early (python train.py --help | head) ends it
    quietly, with 128 + SIGPIPE as a Unix tool would, not with a BrokenPipeError; a full disk under
    stdout is one line."""
    try:
        print(help_text(cls, given, sources), flush=True)
    except BrokenPipeError:
        silence(sys.stdout)
        sys.exit(128 + signal.SIGPIPE)
    except OSError as e:
        fail(f"could not write the help to stdout: {e.strerror or e}", status=1)
    sys.exit(0)


HELP = ("-h", "--help")


def load_config(cls, argv):
    """Build a `cls` dataclass from defaults, then TOML files, then --key=value flags, in that order; --help
    prints the settings, with the values that the files set."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for name in names:  # a field a forker added with another type (a tuple) was read as its text's characters
        if not settable(hints[name]):
            raise ConfigError(f"{cls.__name__}.{name} has a type that --key=value and TOML cannot set "
                              f"({hints[name]}); give it one of: {SETTABLE_TYPES}")
    # before the files are read: `--input a.txt` is a flag that lacks its value, not a file a.txt not found
    for arg in [a for a in argv if a.startswith("--") and "=" not in a and a != "--help"]:
        raise ConfigError(f"write flags as --key=value{f' (e.g. {arg}=...)' * (arg != '--')}, got {arg!r}")
    for arg in [a for a in argv if re.fullmatch(r"-[A-Za-z_]\w*=.*", a, re.S)]:  # other single dashes: files' names
        raise ConfigError(f"flags take two dashes: -{arg}, got {arg!r}")
    files = [a for a in argv if not a.startswith("--") and a != "-h"]
    values, set_in = {}, {}  # set_in: the file that set a value, where no flag set it since
    for path in files:  # files first, so flags win
        for key, value in read_config_file(path, names).items():
            try:
                values[key], set_in[key] = convert(key, hints[key], value, from_text=False), path
            except ConfigError as e:  # with several files and flags, which one said it
                raise type(e)(f"{path}: {e}") from None
    if any(a in HELP for a in argv):
        print_help(cls, values, files)
    for arg in [a for a in argv if a.startswith("--") and a not in HELP]:
        key, _, raw = arg[2:].partition("=")
        check_key(key, names, "the command line")
        values[key] = convert(key, hints[key], raw, from_text=True)
        set_in.pop(key, None)
    for f in dataclasses.fields(cls):
        if f.name not in values and f.default is f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"--{f.name}=... is required: {cls.__name__} has no default for it")
    try:
        return cls(**values)
    except ValueError as e:  # the dataclass's own range checks, which may name a value the user did not type
        named = [f"{key} is set in {path}" for key, path in set_in.items() if re.search(rf"\b{key}\b", str(e))]
        raise ConfigError(str(e) + (f" ({'; '.join(named)})" if named else "")) from None


# what other training and sampling scripts (Hugging Face's, PyTorch's examples) call some of these settings:
# --lr had been taken for a cut-short lr_decay_iters. Offered only where the class has the setting.
OTHER_NAMES = {"lr": "learning_rate", "wd": "weight_decay", "steps": "max_iters", "max_steps": "max_iters",
               "bs": "batch_size", "seq_len": "block_size", "context_length": "block_size",
               "d_model": "n_embd", "hidden_size": "n_embd", "num_layers": "n_layer", "num_heads": "n_head",
               "warmup_steps": "warmup_iters", "max_grad_norm": "grad_clip", "output_dir": "out_dir",
               "temp": "temperature", "prompt": "start", "max_tokens": "max_new_tokens"}


def check_key(key, names, where):
    """ConfigError unless key is one of names (a class's fields), with what was likely meant: another script's
    name for a setting (OTHER_NAMES), the settings that begin as key does (--batch), else a typo's nearest."""
    if key not in names:  # a field: the class's ClassVars (USAGE, ...) have type hints too
        near = ([OTHER_NAMES[key]] if OTHER_NAMES.get(key) in names else
                [name for name in names if name.startswith(key)] or
                difflib.get_close_matches(key, names, n=1, cutoff=0.75))  # 0.6 took out_dir for data_dir
        hint = (f"did you mean {near[0]!r}? " if len(near) == 1 else
                f"did you mean one of {', '.join(map(repr, near))}? " if near else "")
        raise ConfigError(f"unknown setting {key!r} in {where}; {hint}valid settings: {', '.join(names)}")


def read_config_file(path, names):
    """{setting: value} from the TOML file at path, each checked to be one of names, or a ConfigError that says
    what the file is instead: a run's folder, GPT-2's weights, a checkpoint, TOML written as Python."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} is a {'directory' if os.path.isdir(path) else 'pipe or device'}; "
                          f"give a TOML file{meant_as_a_folder(path, names)}")
    if not os.path.isfile(path) and re.fullmatch(r"[A-Za-z_]\w*=.*", path, re.S):  # nanoGPT's way: key=value
        raise ConfigError(f"{path!r} is neither a config file nor a flag; did you mean --{path}?")
    if not os.path.isfile(path):
        shipped = sorted(os.listdir("configs")) if os.path.isdir("configs") else []
        here = [os.path.join("configs", name) for name in shipped]
        listed = f"; the config files here: {', '.join(here)}" if here else ""  # each as it is given
        raise ConfigError(f"config file {path!r} not found{listed}")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(0)
            table = tomllib.loads(f.read().decode("utf-8-sig"))  # a BOM, as some editors write: not TOML's, but no harm
    except UnicodeDecodeError as e:  # TOML files are UTF-8
        if head.startswith(b"PK"):  # torch.save's format
            raise ConfigError(f"{path} is a zip file (a checkpoint, say), not a config file"
                              f"{meant_as_a_folder(path, names, checkpoint=True)}") from None
        raise ConfigError(f"{path} is not valid TOML: {e}; save it as UTF-8") from None
    except tomllib.TOMLDecodeError as e:  # Python's False and None, or --help's none, are the likely values
        how = " (TOML writes true and false in lower case, and text in quotes: top_k = \"none\")" * str(e).startswith(
            "Invalid value")
        raise ConfigError(f"{path} is not valid TOML: {e}{how}") from None
    except OSError as e:  # no permission to read it, say
        raise ConfigError(f"cannot read config file {path!r}: {e.strerror or e}") from None
    for key, value in table.items():
        if isinstance(value, dict):  # [section]: a table of settings, where they all go at the top
            raise ConfigError(f"{path}: [{key}] is a section; write its settings without it, at the top level")
        check_key(key, names, path)
    return table


def meant_as_a_folder(path, names, checkpoint=False):
    """Where path, given as a config file, is a run's folder (a checkpoint in it) or GPT-2's weights (their
    config.json), or itself a checkpoint: the setting that takes it, for a script whose out_dir is a run's and
    that takes weights (train.py, sample.py); else ""."""
    if "init_from" not in names or "out_dir" not in names:
        return ""
    from checkpoint import ckpt_path  # which imports this module: here, where it is needed
    folder = (os.path.dirname(path) or ".") if checkpoint else path
    run = ckpt_path(folder)  # the one file train.py's runs and sample.py read
    if os.path.isfile(run) and (not checkpoint or os.path.samefile(path, run)):
        return f"; for a run's checkpoint, give its folder as --out_dir={as_typed(folder)}"
    if not checkpoint and os.path.isfile(os.path.join(path, "config.json")):
        return f"; for GPT-2's weights, give --init_from={as_typed(path)}"
    return ""


def config_from_argv(cls):
    """The config a script was started with (sys.argv), or exit with one line saying what is wrong."""
    try:
        return load_config(cls, sys.argv[1:])
    except ConfigError as e:
        fail(e)
