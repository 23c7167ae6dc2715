"""The command line's defaults are the API's: every option of a command that the
function it calls also takes has that parameter's name (``dest``) and default.

A command run without an option does what the API does without the parameter.  The few
defaults that differ on purpose, and the options the API has no parameter for, are listed
here with the reason; any other option that matches no parameter fails the test, so a new
flag is either given the API's name and default or explained here.
"""
import inspect
import re

import pytest

from mlem_neuro import bids
from mlem_neuro.cli import build_parser, main
from mlem_neuro.core.checks import BACKENDS
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.demo import run_demo
from mlem_neuro.fmri import trial_images
from mlem_neuro.searchlight import mlem_searchlight
from mlem_neuro.time_resolved import mlem_epochs

#: each command with its required arguments only
MINIMAL = {
    "demo": ["demo"],
    "epochs": ["epochs", "x-epo.fif", "--out", "o"],
    "searchlight": ["searchlight", "--imgs", "run-1.nii.gz", "--events", "run-1.tsv",
                    "--mask", "mask.nii.gz", "--t-r", "2", "--out", "o"],
    "bids": ["bids", "root", "derivatives", "participant", "--task", "t"],
}
#: the API functions each command passes its options to, in the order their defaults are
#: looked up (after the analysis options, MLEMOptions); the searchlight's --model and
#: --standardize go to trial_images, which makes the images
CALLS = {"demo": [run_demo], "epochs": [mlem_epochs],
         "searchlight": [trial_images, mlem_searchlight],
         "bids": [bids.bids_participant, bids.bids_group]}
#: options stored under another name because the API's is taken in the same command
RENAMED = {("demo", "random_state"): (run_demo, "seed"),        # run_demo(seed=)
           ("bids", "group_n_null"): (bids.bids_group, "n_null")}  # n_null: participants'
#: defaults that differ from the API's on purpose: (command, dest) -> (default, why)
DIFFERS = {
    ("demo", "out"): ("mlem_demo", "run_demo(out) has no default; the command writes to "
                                   "./mlem_demo unless told"),
    ("searchlight", "features"): (None, "required by the API; without it the command "
                                        "stops and lists the columns that can be features"),
    ("bids", "features"): (None, "required by bids_participant; without it the command "
                                 "stops and lists the columns that can be features"),
}
#: options with no API parameter: (command, dest) -> why
CLI_ONLY = {
    ("demo", "overwrite"): "the command refuses to replace earlier outputs unless told",
    ("epochs", "overwrite"): "the command refuses to replace earlier results unless told",
    ("searchlight", "overwrite"): "the command refuses to replace earlier results unless "
                                  "told",
    ("searchlight", "group_runs"): "the runs as the folds' groups (mlem_searchlight's "
                                   "groups=runs); off is groups=None, the API's default",
}
#: the parsed text of an option as the API takes it
CONVERT = {"confounds": lambda v: tuple(v.split(",")),
           "standardize": lambda v: None if v == "none" else v}


def _subparser(parser, command):
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices[command]


def _api_default(command, dest):
    """``(where, default)`` of the API parameter behind option ``dest``, or None."""
    if (command, dest) in RENAMED:
        func, name = RENAMED[command, dest]
        return f"{func.__name__}({name}=)", inspect.signature(func).parameters[name].default
    if dest in MLEMOptions.names():
        return "MLEMOptions", getattr(MLEMOptions(), dest)
    for func in CALLS[command]:
        param = inspect.signature(func).parameters.get(dest)
        if param is not None and param.default is not inspect.Parameter.empty:
            return f"{func.__name__}({dest}=)", param.default
    return None


@pytest.mark.parametrize("command", sorted(MINIMAL))
def test_command_defaults_are_the_api_defaults(command):
    parser = build_parser()
    args = vars(parser.parse_args(MINIMAL[command]))
    wrong, unexplained, checked = [], [], 0
    for action in _subparser(parser, command)._actions:
        if action.dest == "help" or action.required or not action.option_strings:
            continue
        dest = action.dest
        value = CONVERT.get(dest, lambda v: v)(args[dest])
        if (command, dest) in DIFFERS:
            assert value == DIFFERS[command, dest][0], (command, dest, value)
            continue
        api = _api_default(command, dest)
        if api is None:
            if (command, dest) not in CLI_ONLY:
                unexplained.append(action.option_strings[0])
            continue
        where, want = api
        if not (value == want and type(value) is type(want)):
            wrong.append(f"{action.option_strings[0]} {value!r}, {where} {want!r}")
        checked += 1
    assert not wrong, f"{command}: defaults differ from the API's: {wrong}"
    assert not unexplained, (f"{command}: options matching no API parameter (give them "
                             f"the API's name, or list them here): {unexplained}")
    assert checked >= (3 if command == "demo" else 25)
    # the lists above name only options the commands have
    for table in (DIFFERS, CLI_ONLY, RENAMED):
        for cmd, dest in table:
            if cmd == command:
                assert dest in args, (table, cmd, dest)


def test_bids_group_without_random_state_keeps_bids_group_default(tmp_path, monkeypatch):
    """--random-state serves both levels of the bids command: unset, the participant level
    runs unseeded as MLEMOptions does, and the group level passes nothing, so bids_group's
    own default seed applies."""
    calls = []

    def fake_group(output_dir, **kw):
        calls.append(kw)
        return {"participants": []}

    monkeypatch.setattr(bids, "bids_group", fake_group)
    argv = ["bids", str(tmp_path), str(tmp_path / "out"), "group", "--task", "t"]
    assert main(argv) == 0
    assert main([*argv, "--random-state", "3"]) == 0
    assert "random_state" not in calls[0] and calls[1]["random_state"] == 3
    assert build_parser().parse_args(argv).random_state is None


def test_backend_help_names_exactly_the_backends():
    parser = build_parser()
    for command in ("epochs", "searchlight", "bids"):
        action = next(a for a in _subparser(parser, command)._actions
                      if a.dest == "backend")
        listed = re.sub(r"\s*\([^()]*\)", "", action.help.split(":", 1)[1])
        named = {w.strip() for w in re.split(r",|\bor\b", listed) if w.strip()}
        assert named == set(BACKENDS), (command, action.help)
        assert set(action.metavar.strip("{}").split(",")) == set(BACKENDS)
        for backend in named:                       # each one named is accepted
            assert MLEMOptions(backend=backend).backend == backend
    with pytest.raises(ValueError):
        MLEMOptions(backend="numpy")                # removed; the help must not offer it
