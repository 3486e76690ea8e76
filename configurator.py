"""
Typed configuration: a dataclass gives every setting a type and a default, a TOML file overrides
some, `--key=value` flags override those. Nothing is exec'd; a wrong key or value is one clear error.

    python train.py configs/shakespeare_char.toml --batch_size=32 --compile=true
"""
import dataclasses
import difflib
import os
import sys
import tomllib
import types
import typing


class ConfigError(ValueError):
    pass


def fail(message, status=2):
    """The one way scripts report bad input: a single line on stderr, no traceback."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def type_name(tp):
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(repr(c) for c in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    return "none" if tp is type(None) else tp.__name__


def convert(key, tp, value, from_text):
    """Check (TOML) or parse (command line text) one value against the field's type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}={value!r} is not a valid choice; choose one of: {type_name(tp)}")
        return value
    if type(None) in args:  # Optional[X]
        if from_text and value.lower() in ("none", "null", ""):
            return None
        return convert(key, next(a for a in args if a is not type(None)), value, from_text)
    if tp is bool:
        if not from_text:
            ok = isinstance(value, bool)
        elif value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        else:
            ok = False
    elif tp in (int, float):
        ok = not isinstance(value, bool) and isinstance(value, (int,) if tp is int else (int, float))
        if from_text:
            try:
                value, ok = tp(value), True
            except ValueError:
                ok = False
    else:  # str
        ok = from_text or isinstance(value, str)
    if ok:
        return tp(value)
    raise ConfigError(f"{key} must be {type_name(tp)}, got {value!r}")


def load_config(cls, argv):
    """Build a `cls` dataclass from defaults, then TOML files, then --key=value flags, in that order."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    if any(a in ("-h", "--help") for a in argv):
        print(f"usage: python {sys.argv[0]} [config.toml] [--key=value ...]\n\nsettings and defaults:")
        defaults = cls()
        for name in names:
            print(f"  --{name}={getattr(defaults, name)!r:<24} ({type_name(hints[name])})")
        sys.exit(0)

    def check_key(key, where):
        if key not in hints:
            near = difflib.get_close_matches(key, names, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ConfigError(f"unknown setting {key!r} in {where}; {hint}valid settings: {', '.join(names)}")

    values = {}
    for path in [a for a in argv if not a.startswith("--")]:  # files first, so flags win
        if not os.path.isfile(path):
            here = sorted(os.listdir("configs")) if os.path.isdir("configs") else []
            raise ConfigError(f"config file {path!r} not found" + (f"; configs/ has: {', '.join(here)}" if here else ""))
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path} is not valid TOML: {e}") from None
        for key, value in table.items():
            check_key(key, path)
            values[key] = convert(key, hints[key], value, from_text=False)
    for arg in [a for a in argv if a.startswith("--")]:
        key, eq, raw = arg[2:].partition("=")
        if not eq:
            raise ConfigError(f"write flags as --key=value, got {arg!r}")
        check_key(key, "the command line")
        values[key] = convert(key, hints[key], raw, from_text=True)
    try:
        return cls(**values)
    except ValueError as e:  # the dataclass's own range checks
        raise ConfigError(str(e)) from None


def config_from_argv(cls):
    """The config a script was started with (sys.argv), or exit with one line saying what is wrong."""
    try:
        return load_config(cls, sys.argv[1:])
    except ConfigError as e:
        fail(e)
