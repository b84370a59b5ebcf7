"""What the fusion rules found, fused and skipped, and why."""

from __future__ import annotations

import dataclasses
from typing import Any

import onnx_ir as ir


@dataclasses.dataclass(frozen=True)
class Skip:
    """A match that a rule's check rejected: the node at its root and the reason."""

    node: str
    reason: str


@dataclasses.dataclass
class RuleReport:
    """One rule family: how many matches it found, fused and skipped."""

    rule: str
    found: int = 0
    fused: int = 0
    skips: list[Skip] = dataclasses.field(default_factory=list)
    #: fused matches whose computation differs from the original's in a way the user should
    #: know (float32 statistics where the original had float16 ones), with what differs
    notes: list[Skip] = dataclasses.field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.skips)


@dataclasses.dataclass
class FusionReport:
    """Per rule family: found / fused / skipped counts and the reasons for every skip."""

    rules: list[RuleReport] = dataclasses.field(default_factory=list)
    #: norm instances and residual adds the fused model holds in onnxnorm nodes (a Sandwich
    #: op: two norms and one add; a Skip op: one norm and one add), counted before lowering
    norms: int = 0
    residual_adds: int = 0
    target: str = "function"
    #: the runtime the output was written for (``--for``; None: written for ``target``)
    runtime: str | None = None
    #: onnxnorm nodes the target could not take as one op of its own, and what they became
    lowering: list[str] = dataclasses.field(default_factory=list)
    #: faults of the input that ONNX Runtime tolerates, mended in the output (``_validate``)
    repairs: list[str] = dataclasses.field(default_factory=list)
    #: what ``upgrade`` (--upgrade-opset) did to the model's opset, or why it could not ("":
    #: not asked for, or no node needed it)
    upgrade: str = ""
    #: "" when ONNX Runtime was shown to load the output, else why that could not be checked
    load_check: str = ""

    @property
    def fused_total(self) -> int:
        return sum(r.fused for r in self.rules)

    def __getitem__(self, rule: str) -> RuleReport:
        for r in self.rules:
            if r.rule == rule:
                return r
        raise KeyError(f"no rule {rule!r} in the report; rules: {[r.rule for r in self.rules]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "norms": self.norms,
            "residual_adds": self.residual_adds,
            "target": self.target,
            "runtime": self.runtime,
            "lowering": self.lowering,
            "repairs": self.repairs,
            "upgrade": self.upgrade,
            "load_check": self.load_check,
            "fused_total": self.fused_total,
            "rules": [
                {
                    "rule": r.rule,
                    "found": r.found,
                    "fused": r.fused,
                    "skipped": r.skipped,
                    "skips": [dataclasses.asdict(s) for s in r.skips],
                    "notes": [dataclasses.asdict(n) for n in r.notes],
                }
                for r in self.rules
            ],
        }

    def __str__(self) -> str:
        lines = [f"repaired: {line}" for line in self.repairs]
        for r in self.rules:
            if r.found or r.skips:
                lines.append(f"{r.rule}: found {r.found}, fused {r.fused}, skipped {r.skipped}")
                lines.extend(f"  skipped {s.node}: {s.reason}" for s in r.skips)
                lines.extend(f"  note {n.node}: {n.reason}" for n in r.notes)
        if not self.fused_total:
            lines.append(
                "nothing to fuse: no norm pattern in the model"
                + (
                    " fuses (see the skips above)"
                    if any(r.found or r.skips for r in self.rules)
                    else ""
                )
            )
        else:
            lines.append(
                f"total fused: {self.fused_total} rewrites; {self.norms} norm(s) and "
                f"{self.residual_adds} residual add(s) now in onnxnorm ops"
            )
        if self.upgrade:
            lines.append(f"--upgrade-opset: {self.upgrade}")
        written = f"for {self.runtime}" if self.runtime else f"to {self.target}"
        lines.extend(f"lowered {written}: {note}" for note in self.lowering)
        if self.load_check:
            lines.append(f"note: {self.load_check}")
        return "\n".join(lines)


def node_label(node: ir.Node) -> str:
    return node.name or f"<unnamed {node.op_type}>"


class Tracker:
    """Bookkeeping shared by the rules of one run: every root node a rule's pattern matched,
    the reasons its checks gave, and whether it was rewritten."""

    def __init__(self) -> None:
        # rule title -> root node -> rejection reasons (empty when accepted) and fused flag
        self._seen: dict[str, dict[ir.Node, list[str]]] = {}
        self._fused: dict[str, set[ir.Node]] = {}
        self._notes: dict[str, dict[ir.Node, str]] = {}

    def register(self, title: str) -> None:
        self._seen.setdefault(title, {})
        self._fused.setdefault(title, set())
        self._notes.setdefault(title, {})

    def adopt(self, rule: object) -> None:
        """A rule built to report here (the pipeline's relay keeps its rules; a run's own
        tracker needs nothing of them)."""

    def checked(self, title: str, root: ir.Node, reason: str | None) -> None:
        reasons = self._seen[title].setdefault(root, [])
        if reason and reason not in reasons:
            reasons.append(reason)

    def fused(self, title: str, root: ir.Node, note: str = "") -> None:
        self._fused[title].add(root)
        if note:
            self._notes[title][root] = note

    def report(self) -> FusionReport:
        rows = []
        for title, seen in self._seen.items():
            fused = self._fused[title]
            skips = [
                Skip(node_label(node), "; ".join(reasons) or "rejected")
                for node, reasons in seen.items()
                if node not in fused
            ]
            notes = [Skip(node_label(node), note) for node, note in self._notes[title].items()]
            rows.append(
                RuleReport(title, found=len(seen), fused=len(fused), skips=skips, notes=notes)
            )
        return FusionReport(rows)
