"""Writes docs/runtimes.md: the runtime table of ``onnxnorm/targets.py`` (RUNTIMES, each
runtime's forms per norm family and for the rotary ops, and their evidence) and the
portability matrix of ``tests/support/portability.py`` (what each runtime does with each file,
which ``tests/runtime/test_portability.py`` checks cell by cell), in the prose of
tools/runtimes.md.in. Rendered without running anything: part of `make generate`.

    python tools/runtimes_page.py [-o docs/runtimes.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests/support

TEMPLATE = Path(__file__).with_name("runtimes.md.in")


def _runtimes() -> str:
    from onnxnorm import targets

    # the norm families, then the rotary ops' family of their own
    families = (*targets.FAMILIES, targets.ROTARY)
    rows = [
        "| `--for` | runtime | " + " | ".join(families) + " | evidence |",
        "|---" * (len(families) + 3) + "|",
    ]
    for runtime in targets.RUNTIMES.values():
        forms = [" > ".join(runtime.forms[f]) for f in families]
        where = "" if runtime.tested_here else " (*GPU machine*)"
        rows.append(
            f"| `{runtime.name}` | {runtime.title}{where} | "
            + " | ".join(forms)
            + f" | {runtime.evidence} |"
        )
    return "\n".join(rows)


def _matrix() -> str:
    """One table per norm family of the decoders (the forms differ by it), the refusals'
    reasons numbered below them."""
    from tests.support import portability

    reasons: dict[str, int] = {}
    rows: list[str] = []
    titles = {"rms": "RMSNorm decoders", "layer": "LayerNorm decoders"}
    for family, title in titles.items():
        decoders = [d for d in portability.DECODERS if portability.NORMS[d] == family]
        rows.append(f"{title} ({', '.join(decoders)}):")
        rows.append("")
        rows.append("| file | " + " | ".join(f"`{r}`" for r in portability.RUNNERS) + " |")
        rows.append("|---" * (len(portability.RUNNERS) + 1) + "|")
        for file in portability.FILES:
            cells = []
            for runner in portability.RUNNERS:
                (outcome,) = {portability.EXPECTED[(d, file, runner)] for d in decoders}
                if outcome == "ok":
                    cells.append("ok")
                else:
                    cells.append(f"refused ({reasons.setdefault(outcome, len(reasons) + 1)})")
            rows.append(f"| {file} | " + " | ".join(cells) + " |")
        rows.append("")
    rows.extend(f"({number}) {reason}." for reason, number in reasons.items())
    rows.append("")
    rows.append(
        "Runners: " + "; ".join(f"`{name}`: {text}" for name, text in _runner_texts().items()) + "."
    )
    return "\n".join(rows)


def _runner_texts() -> dict[str, str]:
    from onnxnorm.deploy import runners
    from tests.support import portability

    texts = {name: text for name, (text, _) in runners.RUNNERS.items()}
    texts["openvino+ext"] = "OpenVINO runtime with onnxnorm's frontend extension"
    return {name: texts[name] for name in portability.RUNNERS}


def render() -> str:
    text = TEMPLATE.read_text()
    text = text.replace("GENERATED_RUNTIMES", _runtimes())
    return text.replace("GENERATED_MATRIX", _matrix())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(ROOT / "docs" / "runtimes.md"))
    args = parser.parse_args()
    Path(args.output).write_text(render())
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
