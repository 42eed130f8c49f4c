"""The commands' key=value options (:mod:`modforge.cli.options`): one parser for study, report, generate, export
and convert, one wording for each refusal, and ``--help`` generated from the same declarations."""
import importlib

import pytest

from modforge.cli.options import Option, Options
from modforge.errors import ConfigError

DEMO = Options("python -m demo", (
    Option("name", "what it is called", required=True, metavar="name"),
    Option("n", "how many", 3, "int", low=1),
    Option("draws", "draws at most", 10, "int", low=0, high=1000),
    Option("x", "a scale", 0.5, "float"),
    Option("flag", "a switch", False, "bool"),
    Option("mode", "how it runs", "fast", "choice", ("fast", "slow")),
))
KEYS = "name, n, draws, x, flag, mode"


def refusal(options: Options, argv: list) -> str:
    with pytest.raises(ConfigError) as e:
        options.parse(argv)
    return str(e.value)


def test_values_are_typed_with_their_defaults_and_the_text_given_is_kept():
    values, rest = DEMO.parse(["name=${oc.env:HOME}", "+n=7", "x=1e-3", "flag=true", "mode=slow"])
    assert values == {"name": "${oc.env:HOME}", "n": 7, "draws": 10, "x": 0.001, "flag": True, "mode": "slow"}
    assert values.given == {"name": "${oc.env:HOME}", "n": "7", "x": "1e-3", "flag": "true", "mode": "slow"}
    assert rest == []
    assert DEMO.parse(["name=a=b"])[0]["name"] == "a=b"  # the value is all after the first '='


@pytest.mark.parametrize("argv, says", [
    (["nmae=a"], f"'nmae=a': expected key=value with key one of {KEYS}. Did you mean 'name' or 'mode'?"),
    (["flag"], f"'flag': expected key=value with key one of {KEYS}. Did you mean 'flag'?"),
    (["colour=red"], f"'colour=red': expected key=value with key one of {KEYS}."),
    (["name=a", "+name=b"], "name= given twice (name=a, then +name=b): give it once"),
    (["n=2"], "name=<name> is required (see --help)"),
    (["name=a", "flag=yes"], "flag=yes: true or false"),
    (["name=a", "n=0"], "n=0: a whole number >= 1"),
    (["name=a", "n=1.5"], "n=1.5: a whole number >= 1"),
    (["name=a", "n=²"], "n=²: a whole number >= 1"),  # a digit to str.isdigit, not to the user
    (["name=a", "n=" + "9" * 200], "n=" + "9" * 40 + ": a whole number >= 1 (at most 100 digits)"),
    (["name=a", "draws=1001"], "draws=1001: a whole number from 0 to 1,000"),
    (["name=a", "draws=" + "9" * 5000], "draws=" + "9" * 40 + ": a whole number from 0 to 1,000"),  # no int()
    (["name=a", "x=abc"], "x=abc: a number"),
    (["name=a", "mode=fats"], "mode=fats: allowed values are fast, slow. Did you mean 'fast'?"),
])
def test_each_refusal_is_one_line_in_its_words(argv, says):
    assert refusal(DEMO, argv) == says


def test_a_huge_number_without_a_bound_is_refused_before_it_is_read():
    free = Options("python -m demo", (Option("seed", "a seed", 0, "int"),))
    assert free.parse(["seed=-7"])[0]["seed"] == -7
    assert refusal(free, ["seed=" + "9" * 5000]) == "seed=" + "9" * 40 + ": a whole number (at most 100 digits)"


def test_a_positional_argument_comes_first():
    sweep = Options("python -m demo", (Option("metric", "what", "loss"),),
                    positional=Option("dir", "the sweep", metavar="sweep directory"))
    values, _ = sweep.parse(["runs/0_a=1", "metric=acc"])  # a directory's name may hold '='
    assert values == {"dir": "runs/0_a=1", "metric": "acc"} and values.given == {"metric": "acc"}
    first = "name the sweep directory first: python -m demo <sweep directory> [key=value ...] (see --help)"
    assert refusal(sweep, []) == refusal(sweep, ["metric=acc"]) == first


def test_the_rest_are_returned_in_order_where_a_command_takes_them():
    study = Options("python -m demo", (Option("dir", "where"),), rest="an override of the config")
    values, rest = study.parse(["model.d=3", "~norm", "dir=s", "+a.b=1"])
    assert values == {"dir": "s"} and rest == ["model.d=3", "~norm", "+a.b=1"]
    assert refusal(study, ["norm"]) == ("'norm': expected key=value with key one of dir; any other key=value or ~key "
                                        "is an override of the config.")


def test_help_is_an_aligned_block_with_defaults_and_choices():
    options = Options("python -m demo", (
        Option("ckpt", "a checkpoint", required=True, metavar="run dir"),
        Option("n", "how many", 3, "int"),
        Option("flag", "a switch", False, "bool"),
        Option("dtype", "precision", "float32", "choice", ("float32", "float16", "bfloat16", "keep")),
        Option("note", "free text"),
    ), positional=Option("dir", "the sweep", metavar="sweep dir"), rest="an override")
    assert options.help() == "\n".join([
        "Options (key=value, any order, each once):",
        "  <sweep dir>      the sweep (first; required)",
        "  ckpt=<run dir>   a checkpoint (required)",
        "  n=<N>            how many (default 3)",
        "  flag=true|false  a switch (default false)",
        "  dtype=float32|float16|bfloat16|keep",  # too wide for the column: its help on the next line
        "                   precision (default float32)",
        "  note=<text>      free text",
        "  key=value, ~key  any other word: an override",
    ])


def test_an_option_of_no_known_type_is_a_mistake_in_the_declaration():
    with pytest.raises(ValueError):
        Option("n", "how many", type="integer")
    with pytest.raises(ValueError):
        Option("mode", "how", type="choice")


# every command, through its main(), as a user runs it: what comes before the options, an option given twice
COMMANDS = {"export": [], "convert": [], "generate": [], "study": [], "report": ["sweep"]}
TWICE = {"export": ("out=a", "out=b"), "convert": ("dtype=keep", "+dtype=float16"),
         "generate": ("max_new=2", "max_new=3"), "study": ("dir=a", "dir=b"), "report": ("sort=name", "sort=best")}
MISSING = {"export": "ckpt=<run dir or .ckpt> is required (see --help)",
           "convert": "hf=<model dir> is required (see --help)",
           "generate": "ckpt=<run dir or .ckpt> is required (see --help)",
           "study": "experiment=<name> is required (see --help)",
           "report": "name the sweep directory first: python -m modforge.report <sweep directory> [key=value ...] "
                     "(see --help)"}


@pytest.fixture
def refused(capsys, tmp_path, monkeypatch):
    """``refused(module, argv)``: the command's one line on stderr (exit 2), read by the shared parser."""
    parsed = []
    parse = Options.parse
    monkeypatch.setattr(Options, "parse", lambda self, argv: (parsed.append(self.name), parse(self, argv))[1])
    monkeypatch.chdir(tmp_path)

    def run(module: str, argv: list) -> str:
        with pytest.raises(SystemExit) as e:
            importlib.import_module(f"modforge.{module}").main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert parsed == [f"python -m modforge.{module}"], f"{module} bypassed modforge.cli.options: {parsed}"
        assert not list(tmp_path.iterdir()), "a refused command wrote into the working directory"
        return err[len("error: "):].rstrip("\n")

    return run


@pytest.mark.parametrize("word", ["colour=red", "colour"])
@pytest.mark.parametrize("module", COMMANDS)
def test_a_misspelt_option_is_refused_alike_by_every_command(module, word, refused):
    from modforge.registry import suggest

    options = importlib.import_module(f"modforge.{module}").OPTIONS
    override = options.rest and "=" in word  # study: any other key=value is an override of the config
    keys = [o.key for o in options.options]
    rest = f"; any other key=value or ~key is {options.rest}" if options.rest else ""
    shown = "colour" if override else word
    assert refused(module, [*COMMANDS[module], shown]) == \
        f"'{shown}': expected key=value with key one of {', '.join(keys)}{rest}.{suggest('colour', keys)}"
    if override:  # composed with the config later, which refuses it in its own words
        assert options.parse([word, "experiment=x"])[1] == [word]


@pytest.mark.parametrize("module", COMMANDS)
def test_an_option_given_twice_is_refused_alike_by_every_command(module, refused):
    first, again = TWICE[module]
    key, _, value = first.partition("=")
    assert refused(module, [*COMMANDS[module], first, again]) == \
        f"{key}= given twice ({key}={value}, then {again}): give it once"


@pytest.mark.parametrize("module", COMMANDS)
def test_a_command_given_nothing_names_what_it_needs(module, refused):
    assert refused(module, []) == MISSING[module]


@pytest.mark.parametrize("module", COMMANDS)
def test_help_lists_every_option_from_its_declaration(module, capsys):
    mod = importlib.import_module(f"modforge.{module}")
    mod.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith(mod.__doc__.strip()) and out.rstrip("\n").endswith(mod.OPTIONS.help())
    assert all(f"  {o.usage}" in out for o in mod.OPTIONS.options)
