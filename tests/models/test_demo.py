"""`make demo` runs models/demo.py: a small run must finish with parity and print its table."""

from models import demo


def test_demo_runs_with_parity(capsys, tmp_path):
    assert (
        demo.main(
            [
                "--hidden",
                "64",
                "--layers",
                "1",
                "--seq",
                "8",
                "--repeat",
                "2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| fused, ORT + onnxnorm library |" in out
    assert "PARITY FAILED" not in out
    assert (tmp_path / "llama_fused.onnx").is_file()
