"""The README's Python quick start runs as written."""

import re
from pathlib import Path

import pytest
from tolerances import U32, reordered_sum

pytestmark = pytest.mark.real_model


def test_readme_quick_start_runs(minilm_path, capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"## Python quick start\s+```python\n(.*?)```", readme, re.S).group(1)
    assert len(code.strip().splitlines()) <= 15
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    out = namespace["out"]
    assert out.member_logits.shape == (3, 3, 3)
    # each member's float32 softmax sums to 1 within the rounding of 3 terms; the mean of 3 members adds 3 more
    assert out.probs.sum(-1).sub(1).abs().max() <= reordered_sum(9, 1.0, U32)
    assert capsys.readouterr().out.strip()
