"""The package as a user meets it: importing it with and without its optional dependencies,
the one-line errors that name the extra to install, and real signatures for help()."""

from __future__ import annotations

import inspect

import pytest

import onnxnorm
from tests.support.processes import assert_one_line, run_cli, run_python


def test_import_without_onnxruntime_names_both_extras():
    result = run_python("import onnxnorm", hidden=("onnxruntime",))
    line = assert_one_line(result, "onnxnorm needs onnxruntime")
    assert "pip install 'onnxnorm[cpu]'" in line and "'onnxnorm[gpu]'" in line
    # a program that catches it gets an ImportError with the same message
    result = run_python(
        """
        try:
            import onnxnorm
        except ImportError as error:
            print(type(error).__mro__[1].__name__, error)
        """,
        hidden=("onnxruntime",),
    )
    assert result.returncode == 0 and result.stdout.startswith("ImportError onnxnorm needs")


def test_command_line_without_onnxruntime_is_one_line():
    result = run_python(
        "import runpy; sys.argv = ['onnxnorm', 'fuse', '--help']; "
        "runpy.run_module('onnxnorm', run_name='__main__')",
        hidden=("onnxruntime",),
    )
    assert_one_line(result, "onnxnorm[cpu]", "onnxnorm[gpu]")


def test_import_and_the_fusion_pass_need_no_torch():
    result = run_python("""
        import onnxnorm, onnxnorm.runtime, onnxnorm.fusion
        print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "argv, needs",
    [
        (["export", "llama", "-o", "m.onnx"], "onnxnorm export needs torch"),
        (["bench", "kernels", "--ops", "RMSNorm"], "onnxnorm bench kernels needs torch"),
    ],
)
def test_commands_without_torch_say_so_in_one_line(argv, needs, tmp_path):
    result = run_cli(*argv, hidden=("torch", "transformers"), cwd=tmp_path)
    assert_one_line(result, needs, "pip install 'onnxnorm[torch]'")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["export", "fuse", "bench"])
def test_help_works_without_torch(command):
    result = run_cli(command, "--help", hidden=("torch", "transformers"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: onnxnorm {command}")


def test_help_loads_neither_torch_nor_the_rewriter():
    """With torch, onnxscript and onnx-ir installed, the help of every command loads none of
    them (onnxnorm.nn and onnxnorm.fusion import their modules on first use): half a second,
    where the export command's help took 4.5 s and the fuse command's 1.5 s."""
    result = run_python("""
        from onnxnorm.cli import COMMANDS, main
        for command in COMMANDS:
            try:
                main([command, "--help"])
            except SystemExit as stop:
                assert stop.code == 0, command
        print("LOADED", sorted(m for m in ("torch", "onnxscript", "onnx_ir") if m in sys.modules))
        """)
    assert result.returncode == 0, result.stderr
    assert "usage: onnxnorm export" in result.stdout and "usage: onnxnorm fuse" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "LOADED []"


def test_package_names_load_on_first_use():
    result = run_python("""
        import onnxnorm.fusion as fusion, onnxnorm.nn as nn
        print(sorted(m for m in ("torch", "onnxscript", "onnx_ir") if m in sys.modules))
        from onnxnorm.fusion import fuse, rules, FusionReport, verify
        print(fuse.__module__, rules.__module__, FusionReport.__module__, verify.__name__)
        from onnxnorm.nn import export, convert, RMSNorm, exporter
        print(export.__module__, convert.__module__, RMSNorm.__module__, exporter.__name__)
        print(set(fusion.__all__) <= set(dir(fusion)), set(nn.__all__) <= set(dir(nn)))
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:4] == [
        "[]",
        "onnxnorm.fusion.pipeline onnxnorm.fusion.pipeline onnxnorm.fusion.report "
        "onnxnorm.fusion.verify",
        "onnxnorm.nn.exporter onnxnorm.nn.converter onnxnorm.nn.modules onnxnorm.nn.exporter",
        "True True",
    ]


def test_torch_modules_without_torch_raise_one_clear_import_error():
    result = run_python(
        """
        import onnxnorm
        for get in (lambda: onnxnorm.export, lambda: onnxnorm.nn.RMSNorm):
            try:
                get()
            except ImportError as error:
                print(error)
        """,
        hidden=("torch",),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 and all(
        "needs torch" in line and "onnxnorm[torch]" in line for line in lines
    ), lines


def test_export_and_convert_show_their_real_signatures():
    export = inspect.signature(onnxnorm.export)
    assert list(export.parameters)[:3] == ["model", "args", "path"]
    assert {"mode", "opset_version", "external_data"} <= set(export.parameters)
    assert "seed" in inspect.signature(onnxnorm.convert).parameters
    assert "mode" in onnxnorm.export.__doc__
    from onnxnorm import convert, export as exported

    assert exported is onnxnorm.nn.export and convert is onnxnorm.nn.convert


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="no attribute 'frobnicate'"):
        onnxnorm.frobnicate  # noqa: B018


def test_the_package_never_imports_the_source_trees_folders():
    """The wheel holds onnxnorm/ alone: nothing in it may import models/, tools/ or tests/."""
    import ast
    from pathlib import Path

    package = Path(onnxnorm.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            offenders += [
                f"{path.relative_to(package)}: {name}"
                for name in names
                if name.partition(".")[0] in ("models", "tools", "tests")
            ]
    assert offenders == []
