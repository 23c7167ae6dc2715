"""What the documentation says the defaults are is what they are.

The tutorials, the documentation pages (not the changelog, which is history), the README
and the shared docstrings stated "5 folds" for two issues after the defaults became
``cv=2, n_repeats="auto"``.  Two phrasings are checked:

* ``default(s): name=value`` or ``default(s) (name=value`` for an analysis option: the
  value must be the option's default (:class:`mlem_neuro.core.options.MLEMOptions`);
* ``default(s) ... (5 folds`` / ``(five folds``: the defaults described in words as a
  5-fold split, unless the sentence says they are the former ones.
"""
import ast
import re
from pathlib import Path

import pytest

from mlem_neuro._docs import docdict
from mlem_neuro.core.options import MLEMOptions

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("tutorials/*.py"), *ROOT.glob("doc/*.rst"), ROOT / "README.md"])
SOURCES = [p for p in SOURCES if p.name != "changelog.rst" and p.exists()]

ASSIGNED = re.compile(r"\bdefaults?\b[^.;]{0,30}?[:(]\s*`*(\w+)\s*=\s*([^`,;)\s]+)", re.I)
IN_WORDS = re.compile(r"\bdefaults?\b[^.;]{0,40}?\(\s*(?:5|five)[ -]folds?", re.I)
FORMER = re.compile(r"former|\bold\b|before|previous|preceded|used to", re.I)


def _flat(text):
    """One line, comment markers and indentation gone (statements span lines)."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def _texts():
    yield from ((p.relative_to(ROOT).as_posix(), _flat(p.read_text())) for p in SOURCES)
    yield "mlem_neuro/_docs.py docdict", _flat("\n".join(docdict.values()))


def _value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text.strip("\"'")


@pytest.mark.parametrize("name, text", list(_texts()), ids=lambda v: v[:40])
def test_stated_defaults_are_the_defaults(name, text):
    defaults = MLEMOptions()
    wrong = []
    for m in ASSIGNED.finditer(text):
        option, stated = m.group(1), _value(m.group(2))
        if option in MLEMOptions.names() and stated != getattr(defaults, option):
            wrong.append(f"{m.group(0)!r}: the default is {getattr(defaults, option)!r}")
    for m in IN_WORDS.finditer(text):
        start = text.rfind(". ", 0, m.start()) + 1
        end = text.find(". ", m.end())
        if not FORMER.search(text[start:end if end >= 0 else None]):
            wrong.append(f"{m.group(0)!r}: the default is cv={defaults.cv!r}")
    assert not wrong, f"{name}: " + "; ".join(wrong)


def test_the_check_catches_the_old_statements():
    old = _flat('fit_kwargs = dict(random_state=0)  # defaults: cv=5, n_permutations=10\n'
                "the analyses use the default settings (5 folds, 10 permutations).\n"
                "MLEM at its defaults\n  (five folds, one repeat) has...")
    assert len(list(ASSIGNED.finditer(old))) == 1
    assert len(list(IN_WORDS.finditer(old))) == 2
    assert not FORMER.search(old)
    assert FORMER.search("MLEM at its former defaults (five folds, one repeat)")
