"""Issue 34, points 3 and 6: data never chooses code, and a user family's mistakes are one line.

A family name read from a database row is resolved among the families this environment
registers, never imported; a broken family definition (names, choices, template) is refused
when it registers, and a template that cannot render stops a command before any search, with
one line naming the family and its module.
"""

from __future__ import annotations

import json

import pytest
from tuning_db import TuningDB
from tuning_db.records import TrialRecord

from autogen.cli.main import main
from dbfixtures import H100


pytestmark = pytest.mark.usefixtures("no_catalog")


# -- 34.3: data never chooses code ----------------------------------------------------------------

def test_list_never_imports_the_package_a_row_names(tmp_path, monkeypatch, capsys):
    # A package on sys.path (python -m autogen puts the working folder there) that a shared
    # database names as a row's family: reading the row must not import it.
    package = tmp_path / "planted"
    package.mkdir()
    marker = tmp_path / "imported"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    db_url = f"sqlite:///{tmp_path / 'shared.db'}"
    with TuningDB(db_url) as db:
        trial = db.record_trial(H100, TrialRecord(
            family="planted.kernel", dtype="float32", shape_key="n=1024", kernel_name="planted_kernel_f32",
            params={}, status="ok", time_us=1.0, samples_us=(1.0,), spread_us=0.0, error=0.0))
        db.set_winner(H100, trial, peer_name="", peer_time_us=None, margin=None, autogen_version="0.1.0")

    assert main(["list", "--db", db_url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["family"], r["stale"][:1]) for r in rows] == [("planted.kernel", ["unknown family"])]
    assert not marker.exists()


# -- 34.6: a user family's mistakes are one line naming the family ---------------------------------

FAMILY_MODULE = '''
import autogen
from autogen.family import Launch, Step


@autogen.register
class Kern(autogen.Family):
    name = {name!r}
    template = "kern.cu.j2"
    dims = {dims!r}
    dtypes = ("float32",)
    space = autogen.Space((autogen.Param({param!r}, {choices!r}, "bs"),))
    default_params = {{{param!r}: 128}}
    outputs = ("y",)
    c_params = "float* y, int n"

    def launch(self, problem, config):
        return Launch((1, 1, 1), (128, 1, 1))
{hooks}'''
KERNEL_ARGS = """
    def kernel_args(self, problem, inputs):
        return (inputs["y"], problem["n"])
"""
PLAN = """
    def plan(self, problem, config):
        return [Step("", self.launch(problem, config), lambda inputs: (inputs["y"], problem["n"]))]
"""
GOOD_TEMPLATE = ('extern "C" __global__ void {{ kernel_name }}(float* y, int n) '
                 '{ int i = blockIdx.x * {{ block_size }} + threadIdx.x; if (i < n) y[i] = 0.f; }\n')


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """write(package, **changes): a user family in its own package on sys.path, its template
    beside it (template=None: none). The registry is restored afterwards."""
    import autogen.core.registry as family_module

    family_module.all_families(include_plugins=False)  # built-ins registered for good, not in the copy alone
    monkeypatch.setattr(family_module, "_REGISTRY", dict(family_module._REGISTRY))
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(package: str, template: str | None = GOOD_TEMPLATE, **changes) -> str:
        folder = tmp_path / package
        folder.mkdir()
        fields = {"name": "kern", "dims": ("n",), "param": "block_size", "choices": (128, 256), "hooks": KERNEL_ARGS,
                  **changes}
        (folder / "__init__.py").write_text(FAMILY_MODULE.format(**fields))
        if template is not None:
            (folder / "kern.cu.j2").write_text(template)
        return f"{package}.{fields['name']}" if "." not in fields["name"] else fields["name"]

    return write


def _one_line_error(capsys, code: int, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("autogen: error: "), err
    assert all(fragment in err for fragment in fragments), err
    return err


@pytest.mark.parametrize("package, changes, fragment", [
    ("dim_trials", {"dims": ("trials",)}, "dimension or trait name 'trials' is reserved"),
    ("dim_help", {"dims": ("help",)}, "dimension or trait name 'help' is reserved"),
    ("dim_dtype", {"dims": ("n", "dtype")}, "dimension or trait name 'dtype' is reserved"),
    ("dim_twice", {"dims": ("n", "n")}, "dimension or trait name 'n' is listed twice"),
    ("dim_not_identifier", {"dims": ("n-1",)}, "dimension or trait name 'n-1' is not an identifier"),
    ("param_not_identifier", {"param": "block size"}, "parameter name 'block size' is not an identifier"),
    ("param_no_choices", {"choices": ()}, "parameter 'block_size' has no choices"),
    ("no_template", {"template": None}, "template 'kern.cu.j2' not found"),
    ("no_arguments", {"hooks": ""}, "does not define kernel_args (its one kernel's), nor a plan of its launches"),
    ("arguments_twice", {"hooks": KERNEL_ARGS + PLAN}, "defines both plan and kernel_args"),
])
def test_a_broken_definition_is_refused_at_registration_in_one_line(user_package, capsys, package, changes,
                                                                     fragment):
    name = user_package(package, **changes)
    code = main(["tune", name, "--help"])  # even --help: before, argparse's conflict was a traceback
    _one_line_error(capsys, code, f"family '{name}' ({package})", fragment)


@pytest.mark.parametrize("package, template, fragment", [
    ("syntax_error", "{% if %}\n", "TemplateSyntaxError"),
    ("undefined", 'extern "C" __global__ void {{ kernel_name }}() { int x = {{ no_such_variable }}; }\n',
     "UndefinedError"),
])
def test_a_template_that_cannot_render_stops_before_any_search_or_write(user_package, tmp_path, capsys, package,
                                                                        template, fragment):
    from autogen.errors import FamilyError
    from autogen.core.registry import get_family
    from autogen.search.tuner import TuneOptions, Tuner

    name = user_package(package, template=template)
    family = get_family(name)
    database = tmp_path / "tuning.db"
    with pytest.raises(FamilyError, match=f"family '{name}' \\({package}\\): template kern.cu.j2, line 1: "
                                          f"{fragment}"):
        Tuner(family.problem(n=1024), TuneOptions(db_url=f"sqlite:///{database}"))
    assert not database.exists()
    # show and export say what is wrong, not "nothing stored"
    _one_line_error(capsys, main(["show", name, "--n", "1024", "--db", str(database)]), fragment, name)
    _one_line_error(capsys, main(["export", name, "--out", str(tmp_path / "out"), "--db", str(database)]),
                    fragment, name)
    assert not database.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("package, hooks", [("by_kernel_args", KERNEL_ARGS), ("by_plan", PLAN)])
def test_a_family_states_its_arguments_in_kernel_args_or_in_plan(user_package, package, hooks):
    from autogen.core.registry import get_family

    family = get_family(user_package(package, hooks=hooks))
    problem = family.problem(n=1024)
    [step] = family.plan(problem, family.default_config())
    assert step.suffix == "" and step.launch.block == (128, 1, 1)
    assert step.args({"y": "y"}) == ("y", 1024)


def test_two_plugins_registering_one_dotted_name_are_refused(user_package):
    import importlib

    from autogen.errors import FamilyError

    user_package("plugin_a", name="shared.kern")
    user_package("plugin_b", name="shared.kern")
    importlib.import_module("plugin_a")
    with pytest.raises(FamilyError, match=r"'shared.kern' is registered twice \(plugin_a.Kern and plugin_b.Kern\)"):
        importlib.import_module("plugin_b")


def test_the_reserved_names_cover_every_option_of_the_family_commands():
    from autogen.cli.main import build_parser
    from autogen.core.registry import RESERVED_DIM_NAMES, get_family

    family = get_family("histogram")  # dimensions and traits: both become options
    own = set(family.dims) | {t.name for t in family.traits}
    commands = build_parser(family)._subparsers._group_actions[0].choices
    for command in ("tune", "bench", "show"):
        dests = {action.dest for action in commands[command]._actions} - own
        assert dests <= RESERVED_DIM_NAMES, (command, dests - RESERVED_DIM_NAMES)
