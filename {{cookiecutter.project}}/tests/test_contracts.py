"""The layout's promises: generic code never names an option (it asks the option's facts), every option builds
what its kind's contract says, and no module grows past what one reader takes in."""
import ast
import importlib
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from {{ cookiecutter.package }} import contracts, options

from helpers.paths import CONF

PACKAGE_DIR = Path(options.__file__).parent
GROUPS = ("data", "format", "decoder", "staging", "augment", "prefetcher", "logger", "profiler", "model", "optim",
          "schedule")
LONGEST_MODULE = 300  # lines


def own_module(group: str, option: str) -> str:
    """The module an option's `_target_` lives in: the one place allowed to name it."""
    target = OmegaConf.load(CONF / group / f"{option}.yaml")["_target_"]
    module = target.rpartition(".")[0]
    while module:  # found by its file, not imported: an option's module imports its package, which may be missing
        path = PACKAGE_DIR.parent.joinpath(*module.split("."))
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return module
        module = module.rpartition(".")[0]  # a class: its module is one level up
    raise AssertionError(target)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes: words for the reader, which may name anything."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body and isinstance(
                node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            found.add(id(node.body[0].value))
    return found


def named_options(path: Path) -> list[tuple[str, str, str]]:
    """(group, option, how) for every option the code at `path` names: compared with a choice, or written as
    group=option in a string, docstrings left out."""
    tree = ast.parse(path.read_text())
    skip = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                for value in values:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        found += [(group, value.value, f"compared: == {value.value!r}") for group in GROUPS
                                  if value.value in options.options(group)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found += [(group, option, f"written: {group}={option}") for group in GROUPS
                      for option in options.options(group) if f"{group}={option}" in node.value]
    return found


SOURCES = sorted(path for path in PACKAGE_DIR.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=[str(path.relative_to(PACKAGE_DIR)) for path in SOURCES])
def test_no_module_outside_an_options_own_names_it(path):
    module = module_name(path)
    strangers = [f"{group}={option} ({how})" for group, option, how in named_options(path)
                 if own_module(group, option) != module]
    assert strangers == [], f"{module} names options it should ask about: {strangers}"


def test_the_check_finds_a_name_where_there_is_one(tmp_path):
    """The check itself: code that branches on a decoder's name, or hints at a format by name, is caught."""
    path = tmp_path / "generic.py"
    path.write_text('"""Docstrings may say decoder=pil."""\n'
                    'def pick(choice):\n    return choice == "pil"\n\nHINT = "try format=lmdb"\n')
    assert sorted(named_options(path)) == [("decoder", "pil", "compared: == 'pil'"),
                                           ("format", "lmdb", "written: format=lmdb")]


GROUND_FLOOR = ("contracts", "core")  # what every other part builds on, and which builds on nothing of theirs


def imported(path: Path) -> set[str]:
    """The package's own modules that the code at `path` imports, wherever it does: at the top, in a function, or
    for annotations only (under TYPE_CHECKING)."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    def is_module(name: str) -> bool:  # found by its file, not imported (a name imported from a module is not one)
        path = PACKAGE_DIR.parent.joinpath(*name.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    return {name for name in found if name.split(".")[0] == options.PACKAGE and is_module(name)}


@pytest.mark.parametrize("path", [path for path in SOURCES if path.relative_to(PACKAGE_DIR).parts[0] in GROUND_FLOOR],
                         ids=lambda path: str(path.relative_to(PACKAGE_DIR)))
def test_the_ground_floor_imports_nothing_built_on_it(path):
    upward = sorted(name for name in imported(path) if name.split(".")[1] not in GROUND_FLOOR)
    assert upward == [], f"{module_name(path)} imports from above contracts/ and core/: {upward}"


def test_the_import_check_sees_annotations_and_imports_inside_functions(tmp_path):
    module = PACKAGE_DIR / "core" / "config.py"
    assert f"{options.PACKAGE}.core.keys" in imported(module)
    assert imported(PACKAGE_DIR / "loop" / "model" / "timm.py") >= {f"{options.PACKAGE}.contracts"}


@pytest.mark.parametrize("path", SOURCES, ids=[str(path.relative_to(PACKAGE_DIR)) for path in SOURCES])
def test_every_module_is_short_enough_to_own(path):
    lines = len(path.read_text().splitlines())
    assert lines <= LONGEST_MODULE, (
        f"{path.relative_to(PACKAGE_DIR)} has {lines} lines, over {LONGEST_MODULE}: split it by concern, into a package "
        "of its own (as tools/tune/ and tools/bench/ are), not into prefixed siblings")


CONTRACTS = {"format": contracts.Format, "decoder": contracts.Decoder, "prefetcher": contracts.Prefetcher,
             "model": contracts.Network}


@pytest.mark.parametrize("group", sorted(CONTRACTS))
def test_the_abstract_contracts_are_enforced_on_each_option_class(group):
    """Every class an option of the group builds implements its contract's abstract methods: instantiable."""
    for option in options.options(group):
        target = OmegaConf.load(CONF / group / f"{option}.yaml")["_target_"]
        module, _, name = target.rpartition(".")
        built = getattr(importlib.import_module(module), name) if not options.facts(group, option).missing() else None
        if isinstance(built, type):
            assert issubclass(built, CONTRACTS[group]) and not built.__abstractmethods__, target


OPTIONAL = ("lmdb", "litdata", "datasets", "torchcodec", "moto", "matplotlib", "nvidia.dali", "submitit", "timm", "onnx",
            "onnxscript", "onnxruntime", "kubeflow_trainer_api", "kubernetes_validate", "sky", "ray")  # the extras


@pytest.mark.full
def test_the_suite_collects_without_the_optional_extras():
    """As after a plain `pip install -e .`: each optional package made unimportable, every test module loads."""
    import subprocess
    import sys

    from helpers.paths import PROJECT

    script = ("import sys\nfor name in %r:\n    sys.modules[name] = None\nimport pytest\n"
              "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider']))\n" % (OPTIONAL,))
    result = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert " error" not in result.stdout and "tests collected" in result.stdout


@pytest.mark.full  # a fresh interpreter, 4.5 s
def test_a_run_that_builds_no_torchvision_model_never_imports_torchvision():
    """torchvision costs an interpreter seconds to import (it brings torch._dynamo): a refusal, `--help` or a run of
    another library's model pays nothing for it. A fresh interpreter, since this one has imported it."""
    import subprocess
    import sys

    from helpers.paths import PACKAGE

    modules = [f"{PACKAGE}.train", f"{PACKAGE}.loop.mix", f"{PACKAGE}.data.augment", f"{PACKAGE}.data.decoder.nvjpeg"]
    script = (f"import sys\nimport {', '.join(modules)}\n"
              "print(sorted(name for name in sys.modules if name.startswith('torchvision')))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
