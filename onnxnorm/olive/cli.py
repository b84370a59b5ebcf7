"""``onnxnorm olive``: an Olive workflow run with onnxnorm's pass and surgeon known, and the
package configuration that makes the pass known to ``olive run``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(commands: argparse._SubParsersAction) -> None:
    olive = commands.add_parser(
        "olive",
        help="run an Olive workflow with onnxnorm's pass and surgeon",
        description="Olive (olive-ai) with onnxnorm's fusion: the pass OnnxNormFusion as a "
        "workflow step, the surgeon OnnxNormFuse in a GraphSurgeries step "
        "(docs/pipelines.md).",
    )
    actions = olive.add_subparsers(dest="action", required=True)
    run_parser = actions.add_parser(
        "run",
        help="run a workflow config (JSON or YAML), as `olive run --config` does",
        description="Checks onnxnorm's settings in the workflow (nothing is written when one is "
        "wrong), then runs it with Olive's passes, OnnxNormFusion and the surgeon "
        "OnnxNormFuse known. The input model is never modified.",
    )
    run_parser.add_argument("config", help="the workflow config file")
    run_parser.add_argument("--tempdir", help="where Olive keeps its temporary files")
    run_parser.set_defaults(run=run)
    packages = actions.add_parser(
        "package-config",
        help="write Olive's package config with OnnxNormFusion added, for `olive run "
        "--package-config`",
    )
    packages.add_argument("-o", "--output", required=True, help="the JSON file to write")
    packages.set_defaults(run=write_package_config)


def workflow_problems(config: dict[str, Any]) -> list[str]:
    """onnxnorm's settings in a workflow config that are wrong, one line each: an unknown
    target of the pass or of the surgeon (or no mapping of passes to look into)."""
    from onnxnorm.olive import PASS, SURGEON, OliveSettingError, check_target
    from onnxnorm.targets import DEFAULT

    problems = []

    def check(value: Any, where: str) -> None:
        try:
            check_target(value, where)
        except OliveSettingError as error:
            problems.append(str(error))

    passes = config.get("passes") or {}
    if not isinstance(passes, dict):
        return ["'passes' must map step names to pass configs"]
    # other shapes inside are left to Olive's own validation of the config
    for name, steps in passes.items():
        for step in steps if isinstance(steps, list) else [steps]:
            if not isinstance(step, dict):
                continue
            kind = str(step.get("type", "")).lower()
            if kind == PASS.lower():
                check(step.get("target", DEFAULT), f"pass {name!r} ({PASS})")
            elif kind == "graphsurgeries" and isinstance(step.get("surgeries"), list):
                for surgery in step["surgeries"]:
                    if (
                        isinstance(surgery, dict)
                        and str(surgery.get("surgeon", "")).lower() == SURGEON.lower()
                    ):
                        check(surgery.get("target", DEFAULT), f"pass {name!r} ({SURGEON})")
    return problems


def run(args: argparse.Namespace) -> int:
    from onnxnorm._io import check_input
    from onnxnorm.errors import OnnxNormError, first_line

    source = check_input(args.config)
    try:
        if source.suffix.lower() in (".yaml", ".yml"):
            import yaml

            config = yaml.safe_load(source.read_text())
        else:
            config = json.loads(source.read_text())
    except Exception as error:  # noqa: BLE001 - a file that is not JSON/YAML: say so
        raise OnnxNormError(f"{source}: not a workflow config: {first_line(error)}") from None
    if not isinstance(config, dict):
        raise OnnxNormError(f"{source}: not a workflow config (no mapping at its top)")
    problems = workflow_problems(config)
    if problems:
        raise OnnxNormError(f"{source}: {problems[0]}")

    # package_config first: without Olive it raises the one-line error naming the extra
    from onnxnorm.olive import package_config  # noqa: I001 - before the imports of Olive

    import pydantic
    from olive.workflows import run as olive_run

    try:
        output = olive_run(config, package_config=package_config(), tempdir=args.tempdir)
    except pydantic.ValidationError as error:
        details = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise OnnxNormError(f"{source}: not a valid Olive workflow: {details}") from None
    best = output.get_best_candidate() if output is not None else None
    if best is not None:
        print(f"output model: {best.model_path}")
    return 0


def write_package_config(args: argparse.Namespace) -> int:
    from onnxnorm._io import check_output
    from onnxnorm.olive import package_config

    target = check_output(args.output, inputs=[])
    Path(target).write_text(json.dumps(package_config(), indent=4) + "\n")
    print(f"wrote {target}: olive run --config <workflow> --package-config {target}")
    return 0
