"""The CPU kernels of the rotary ops (RMSNormRotary, LayerNormRotary, L2NormRotary) through ONNX
Runtime with the onnxnorm library (nodes without function bodies, so the library's kernel runs),
against the numpy reference: a pruned matrix of op x Q's type x weight and angle types x layout
(and 3-D Q) x half-split or interleaved x partial rotary x the caches' forms (per pair with
PositionIds, per value per token, shared by the batch) x K present or absent x rotary_first x
per_head x rotary_in_t x head counts (grouped-query) x head sizes, within the reference's
tolerance and, in float16 and bfloat16, bit for bit for at least 99% of the values; the same bits
on every instruction set and thread count; NaN and Inf held in their head; bad attributes and
inputs as clear errors."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnxnorm.ops import catalogue, reference
from onnxnorm.testing.graphs import single_node_model
from tests.support.helpers import run
from tests.support.matrix import BF16, F16, F32
from tests.support.rotary_cases import KERNEL_MAX_POSITION, drawn_cases, make_case

ROOT = Path(__file__).resolve().parents[2]
ROTARY = list(catalogue.ROTARY_OPS)
#: the share of float16/bfloat16 values the kernels must give bit for bit (the rest: the
#: reference's float64 against the kernels' float32, rounded to T once more)
EXACT = 0.99
#: the forms of Cos and Sin: per pair gathered by PositionIds, per value gathered by PositionIds,
#: per value per token [batch, seq, C], per pair shared by the batch [1, seq, C]


def run_kernel(op, arrays, attrs, threads=1, k_out=None):
    """The op's outputs from the library's kernel (KOut where K is given, unless k_out says)."""
    k_out = "K" in arrays if k_out is None else k_out
    model = single_node_model(
        op, arrays, attrs, functions=False, optional_outputs=("KOut",) if k_out else False
    )
    return run(model, arrays, with_library=True, threads=threads)


def reference_outputs(op, arrays, attrs):
    spec = catalogue.ROTARY_OPS[op]
    return reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)


def _bits(values, dtype):
    """The bits of values (float32 arrays of a T's values, or T's own) in T."""
    return np.asarray(np.asarray(values, np.float32).astype(dtype)).view(np.uint16)


def check(op, arrays, attrs, threads=1):
    """The kernel's outputs are the reference's: within its tolerance for Q's type, NaN where it
    has NaN, and in float16/bfloat16 bit for bit for at least EXACT of the values."""
    got = run_kernel(op, arrays, attrs, threads)
    want = reference_outputs(op, arrays, attrs)
    assert len(got) == len(want)
    dtype = arrays["Q"].dtype
    rtol, atol = reference.tolerance(dtype)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(
            np.asarray(g, np.float32), w.astype(np.float32), rtol, atol, err_msg=f"{op} {attrs}"
        )
        if dtype != F32 and w.size:
            same = _bits(g, dtype) == _bits(w, dtype)
            same |= np.isnan(w.astype(np.float32)) & np.isnan(np.asarray(g, np.float32))
            assert same.mean() >= EXACT, (op, attrs, same.mean())
    return got


def _cases():
    """The pruned matrix (``rotary_cases.drawn_cases``), each case named by its fixed axes."""
    cases = []
    for op, dtype, kw, seed in drawn_cases(np.random.default_rng(20)):
        rank3 = "-3d" if kw["rank3"] else ""
        name = f"{op}-{np.dtype(dtype).name}-l{kw['layout']}{rank3}"
        name += f"-i{kw['interleaved']}-f{kw['rotary_first']}"
        cases.append(pytest.param(op, dtype, kw, seed, id=name))
    return cases


@pytest.mark.parametrize("op, dtype, kw, seed", _cases())
def test_matrix(op, dtype, kw, seed):
    arrays, attrs = make_case(op, dtype, np.random.default_rng(seed), **kw)
    check(op, arrays, attrs)


@pytest.mark.parametrize("op", ROTARY)
@pytest.mark.parametrize("dtype", (F32, F16, BF16), ids=lambda t: np.dtype(t).name)
def test_model_shapes(op, dtype, rng):
    """Qwen3's decode (32 query heads, 8 key heads of 128, the half-width cache by position),
    a Gemma-like prefill with the transpose taken in, and OLMo 2's per-token norm of 3-D Q and K;
    threaded where large enough."""
    cases = [
        dict(heads=(32, 8), head_size=128, batch=1, seq=1),
        dict(heads=(8, 4), head_size=128, batch=1, seq=40, layout=2, offset=1.0, order=1),
        dict(heads=(8, 8), head_size=64, seq=16, rank3=True, per_head=0, cache="value-token"),
    ]
    for kw in cases:
        arrays, attrs = make_case(op, dtype, rng, **kw)
        check(op, arrays, attrs, threads=2)


@pytest.mark.parametrize("op", ROTARY)
def test_rows_wider_than_the_stack_buffer(op, rng):
    """rotary_first = 1 with per_head = 0 buffers the whole token: 80 heads of 128 take scratch
    of each block's own (threaded) or of the call (one token)."""
    for seq in (1, 8):
        kw = dict(heads=(80, 8), head_size=128, batch=1, seq=seq, per_head=0, rotary_first=1)
        arrays, attrs = make_case(op, BF16, rng, **kw)
        check(op, arrays, attrs, threads=3)


def test_k_without_k_out_and_empty_batches(rng):
    """K given without KOut is checked, not computed; an empty batch gives empty outputs."""
    arrays, attrs = make_case("RMSNormRotary", F16, rng)
    (q_out,) = run_kernel("RMSNormRotary", arrays, attrs, k_out=False)
    np.testing.assert_array_equal(q_out, run_kernel("RMSNormRotary", arrays, attrs)[0])
    arrays, attrs = make_case("LayerNormRotary", F32, rng, batch=0, layout=2)
    got = run_kernel("LayerNormRotary", arrays, attrs)
    assert [g.shape for g in got] == [(0, 8, 3, 64), (0, 2, 3, 64)]


@pytest.mark.parametrize("op", ROTARY)
def test_threads_give_the_same_bits(op, rng):
    for dtype, per_head in ((F32, 1), (BF16, 1), (F16, 0)):
        kw = dict(heads=(16, 4), head_size=128, batch=2, seq=48, per_head=per_head)
        arrays, attrs = make_case(op, dtype, rng, **kw)
        one = run_kernel(op, arrays, attrs, threads=1)
        for threads in (2, 5):
            for a, b in zip(one, run_kernel(op, arrays, attrs, threads=threads)):
                np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("op", ROTARY)
@pytest.mark.parametrize("dtype", (F32, F16, BF16), ids=lambda t: np.dtype(t).name)
def test_nan_and_inf_stay_in_their_head(op, dtype, rng):
    for per_head, first in ((1, 0), (1, 1), (0, 0)):
        arrays, attrs = make_case(op, dtype, rng, per_head=per_head, rotary_first=first, seq=4)
        q = arrays["Q"].astype(np.float32)
        q[0, 1, 3, 5] = np.nan
        q[1, 2, 0, 0] = np.inf
        q[1, 3, 6, 9] = -np.inf
        arrays["Q"] = q.astype(dtype)
        k = arrays["K"].astype(np.float32)
        k[0, 0, 1, 63] = np.nan
        arrays["K"] = k.astype(dtype)
        q_out, k_out = check(op, arrays, attrs)
        bad = np.isnan(np.asarray(q_out, np.float32))
        # the heads hit (per_head = 0: the tokens hit), nothing else: 3 in Q; in K one head, or
        # the token's 2 heads
        hit = bad.any(axis=3) if per_head else bad.any(axis=(2, 3))
        assert hit.sum() == 3, hit.sum()
        assert np.isnan(np.asarray(k_out, np.float32)).any(axis=3).sum() == (1 if per_head else 2)


# ---------------------------------------------------------------------------------------------
# Every instruction set: the same cases in a child process for each lesser one
# (ONNXNORM_CPU_ISA), their outputs compared bit for bit with this process's (the best one).
# The child runs the models of a case file, so that it imports no test module.

_ISA_SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, ".")
from tests.support.helpers import run
from onnxnorm.testing.graphs import single_node_model
from onnxnorm._native import active_isa
import ml_dtypes
cases = json.loads(open(sys.argv[1]).read())
data = np.load(sys.argv[2])
out = {}
for i, case in enumerate(cases):
    arrays = {}
    for name, dtype in case["inputs"].items():
        value = data[f"{i}/{name}"]
        arrays[name] = value.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else value
    wanted = ("KOut",) if "K" in arrays else False
    model = single_node_model(
        case["op"], arrays, case["attrs"], functions=False, optional_outputs=wanted
    )
    for j, y in enumerate(run(model, arrays, with_library=True, threads=case["threads"])):
        out[f"{i}/{j}"] = y
np.savez(sys.argv[3], **out)
print("isa", active_isa())
"""


def _isa_cases():
    """Small calls (the kernels for them) and large ones (the widest vectors) of every op and
    type, both pairings, both cache widths, partial rotary, odd head sizes, every rounding mode
    (the best instruction set here runs float16 with rotary_in_t = 1 in half precision where the
    CPU has AVX512-FP16: compared with the float32 arithmetic of the others)."""
    rng = np.random.default_rng(99)
    cases = []
    for i, (op, dtype) in enumerate(itertools.product(ROTARY, (F32, F16, BF16))):
        for j, kw in enumerate(
            (
                dict(head_size=12, interleaved=1, cache="value-token", rotary_in_t=1, order=1),
                dict(head_size=64, rotary_dim=32, cache="pair-shared", rotary_first=1, layout=2),
                dict(head_size=128, per_head=0, cache="value-ids", offset=1.0, rank3=True),
                dict(heads=(16, 4), head_size=128, seq=48, layout=1, rotary_in_t=1, order=1),
                dict(heads=(16, 4), head_size=128, seq=48, interleaved=1, rotary_first=1),
                dict(heads=(8, 8), head_size=100, seq=64, per_head=0, rotary_dim=36, layout=2),
                # float16 half-split heads rotated in T: the half-precision kernels where the
                # CPU has AVX512-FP16 (both orders, float32 angles, partial, odd tails)
                dict(
                    heads=(8, 2),
                    head_size=64,
                    seq=40,
                    rotary_in_t=1,
                    rotary_dim=48,
                    cache="value-ids",
                ),
                dict(heads=(4, 4), head_size=80, seq=33, rotary_in_t=1, order=1, layout=2),
            )
        ):
            other = F32 if dtype != F32 and (i + j) % 2 else None
            angle = F32 if dtype != F32 and j % 3 == 1 else None
            arrays, attrs = make_case(op, dtype, rng, w_type=other, a_type=angle, **kw)
            cases.append((op, arrays, attrs, 2 if j >= 3 else 1))
    # bfloat16 heads of a wide range (one value of 1e18 each, the others near 1e-22): their
    # normalized values and products fall below float32's normal range, which the bfloat16
    # conversion instruction reads as zero; the kernels must round them as the integer rounding
    # of the portable instruction set does (both of a pair rounded together or not)
    for op in ROTARY:
        for kw in (
            dict(rotary_in_t=1, order=1),
            dict(rotary_in_t=1, rotary_first=1),
            dict(interleaved=1),
        ):
            arrays, attrs = make_case(op, BF16, rng, heads=(4, 2), head_size=64, seq=8, **kw)
            for name in ("Q", "K"):
                wide = arrays[name].astype(np.float32) * np.float32(1e-22)
                wide[..., 5] = 1e18
                arrays[name] = wide.astype(BF16)
            cases.append((op, arrays, attrs, 1))
    return cases


def _save_cases(cases, folder: Path) -> tuple[Path, Path]:
    listed, data = [], {}
    for i, (op, arrays, attrs, threads) in enumerate(cases):
        listed.append(
            {
                "op": op,
                "attrs": attrs,
                "threads": threads,
                "inputs": {n: np.dtype(a.dtype).name for n, a in arrays.items()},
            }
        )
        for name, value in arrays.items():
            data[f"{i}/{name}"] = value.view(np.uint16) if value.dtype == BF16 else value
    (folder / "cases.json").write_text(json.dumps(listed))
    np.savez(folder / "cases.npz", **data)
    return folder / "cases.json", folder / "cases.npz"


@pytest.fixture(scope="module")
def isa_cases(tmp_path_factory):
    """The cases, saved for the child processes, and this process's outputs of them."""
    cases = _isa_cases()
    folder = tmp_path_factory.mktemp("rotary-isa")
    files = _save_cases(cases, folder)
    best = [run_kernel(op, arrays, attrs, threads=threads) for op, arrays, attrs, threads in cases]
    return cases, files, best


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
def test_every_instruction_set_gives_the_same_bits(isa, isa_cases, tmp_path):
    from onnxnorm._native import active_isa

    cases, (listed, data), best = isa_cases
    result = subprocess.run(
        [sys.executable, "-c", _ISA_SCRIPT, str(listed), str(data), str(tmp_path / "out.npz")],
        cwd=ROOT,
        env={**os.environ, "ONNXNORM_CPU_ISA": isa},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    order = ["portable", "avx2", "avx512", "avx512_bf16"]
    want_isa = order[min(order.index(isa), order.index(active_isa()))]
    assert f"isa {want_isa}\n" in result.stdout, result.stdout
    got = np.load(tmp_path / "out.npz")
    for i, (op, _, attrs, _) in enumerate(cases):
        for j, want in enumerate(best[i]):
            np.testing.assert_array_equal(
                got[f"{i}/{j}"].view(np.uint32 if want.dtype == F32 else np.uint16),
                want.view(np.uint32 if want.dtype == F32 else np.uint16),
                err_msg=f"{isa}: {op} {attrs} output {j}",
            )


# ---------------------------------------------------------------------------------------------
# Errors: bad attributes at session creation, bad inputs at the call, worded as the reference
# words them, naming onnxnorm::<op>.


def _bad(op, arrays, attrs, message, k_out=None):
    with pytest.raises(Exception, match=message):
        run_kernel(op, arrays, attrs, k_out=k_out)


@pytest.mark.parametrize("op", ROTARY)
def test_bad_attributes_are_clear_errors(op, rng):
    arrays, _ = make_case(op, F32, rng, head_size=16, heads=(2, 1))
    name = f"onnxnorm::{op}"
    for attr, value, rule in (
        ("layout", 3, "must be 0, 1 or 2, got 3"),
        ("per_head", 2, "must be 0 or 1, got 2"),
        ("rotary_dim", -2, "must be an integer >= 0, got -2"),
        ("head_size", -1, "must be an integer >= 0, got -1"),
        ("interleaved", 5, "must be 0 or 1, got 5"),
        ("rotary_first", -1, "must be 0 or 1, got -1"),
        ("rotary_in_t", 2, "must be 0 or 1, got 2"),
        ("epsilon", -1.0, "must be a finite number >= 0, got -1"),
    ):
        _bad(op, arrays, {attr: value}, rf"{name}: attribute {attr} {rule}")
    if op != "L2NormRotary":
        _bad(op, arrays, {"cast_before_scale": 2}, rf"{name}: attribute cast_before_scale must be")


def test_bad_inputs_are_clear_errors(rng):
    op = "RMSNormRotary"
    name = f"onnxnorm::{op}"

    def case(**kw):
        return make_case(op, F32, rng, head_size=16, heads=(4, 2), **kw)

    arrays, attrs = case()
    _bad(op, arrays, {**attrs, "rotary_dim": 18}, rf"{name}: rotary_dim must be even and at most "
         r"head_size 16, got 18")  # fmt: skip
    _bad(op, arrays, {**attrs, "rotary_dim": 6}, rf"{name}: Cos's last dim must be rotary_dim / 2 "
         r"= 3 \(one angle per pair\) or rotary_dim = 6 \(one per value\), got 8")  # fmt: skip
    _bad(op, arrays, {**attrs, "rotary_dim": 5}, rf"{name}: rotary_dim must be even")
    _bad(
        op, arrays, {**attrs, "head_size": 8}, rf"{name}: Q's heads are of size 16, head_size is 8"
    )
    _bad(
        op, {**arrays, "Sin": arrays["Sin"][:, :4]}, attrs,
        rf"{name}: Cos and Sin differ in shape: \[40,8\] and \[40,4\]",
    )  # fmt: skip
    _bad(
        op, {**arrays, "PositionIds": arrays["PositionIds"] + KERNEL_MAX_POSITION - 1}, attrs,
        rf"{name}: a position id is outside Cos's 40 rows: \d+ to \d+",
    )  # fmt: skip
    _bad(
        op, {**arrays, "PositionIds": -arrays["PositionIds"] - 1}, attrs,
        rf"{name}: a position id is outside Cos's 40 rows: -\d+ to -\d+",
    )  # fmt: skip
    _bad(
        op, {**arrays, "PositionIds": arrays["PositionIds"][:, :2]}, attrs,
        rf"{name}: PositionIds must be \[batch, seq\] = \[2,3\], got \[2,2\]",
    )  # fmt: skip
    _bad(
        op, {**arrays, "Cos": arrays["Cos"][None], "Sin": arrays["Sin"][None]}, attrs,
        rf"{name}: with PositionIds, Cos is \[max_position, C\], got \[1,40,8\]",
    )  # fmt: skip
    _bad(
        op, {**arrays, "QScale": np.ones(12, np.float32)}, attrs,
        rf"{name}: QScale of shape \[12\] must hold head_size = 16 values or heads \* head_size "
        "= 64",
    )  # fmt: skip
    _bad(
        op, {**arrays, "KScale": np.ones((4, 16), np.float32)}, attrs,
        rf"{name}: KScale of shape \[4,16\] must hold head_size = 16 values or heads \* head_size "
        "= 32",
    )  # fmt: skip
    _bad(
        op, {**arrays, "K": arrays["K"][:, :2]}, attrs,
        rf"{name}: K of shape \[2,2,2,16\] does not match Q's \[2,3,4,16\]",
    )  # fmt: skip
    _bad(op, {**arrays, "K": arrays["K"][0]}, attrs, rf"{name}: K must be of Q's type and rank")
    _bad(op, {k: v for k, v in arrays.items() if k != "K"}, attrs,
         rf"{name}: output KOut needs input K", k_out=True)  # fmt: skip
    _bad(
        op, {**{k: v for k, v in arrays.items() if k != "K"}, "Q": arrays["Q"][0, 0]}, attrs,
        rf"{name}: Q must be 3-D or 4-D, got shape \[4,16\]",
    )  # fmt: skip
    _bad(
        op, arrays, {**attrs, "per_head": 0, "layout": 1},
        rf"{name}: per_head = 0 normalizes a token's heads together: layout 0 or 2",
    )  # fmt: skip

    arrays, attrs = case(cache="value-token")
    _bad(
        op, {**arrays, "Cos": arrays["Cos"][:, :2], "Sin": arrays["Sin"][:, :2]}, attrs,
        rf"{name}: without PositionIds, Cos is per token, \[batch or 1, seq, C\] with batch 2 "
        r"and seq 3, got \[2,2,16\]",
    )  # fmt: skip
    arrays, attrs = case(rank3=True)
    _bad(
        op, arrays, {**attrs, "head_size": 0},
        rf"{name}: a 3-D Q of shape \[2,3,64\] needs head_size \(> 0\) dividing its last dim; "
        "head_size is 0",
    )  # fmt: skip
    _bad(
        op, arrays, {**attrs, "layout": 1},
        rf"{name}: a 3-D Q is \[batch, seq, heads \* head_size\]: layout 0 or 2",
    )  # fmt: skip
    # types: ORT's kernel matching (each (T, S, A) the op accepts has a kernel)
    _bad(
        op, {**arrays, "Cos": arrays["Cos"].astype(F16), "Sin": arrays["Sin"].astype(F16)}, attrs,
        f"no kernel def matches node inputs for Op: {op}",
    )  # fmt: skip
    _bad(
        op, {**arrays, "PositionIds": arrays["Q"][:, :, 0].astype(np.int32)}, attrs,
        r"'tensor\(int32\)' of input parameter \(positionids\)",
    )  # fmt: skip
