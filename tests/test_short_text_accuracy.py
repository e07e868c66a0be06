"""The default model path (`quantize: auto` for configs/default.yaml's pools) is accurate on
short texts: on the CPU the suite runs on (so a run on an AVX2-only CPU catches what its int8
kernels lose), and under AVX2's int8 kernels forced on any CPU (CTranslate2's oneDNN path
capped at AVX2, ONNX Runtime's 7-bit weights: what an AMD EPYC without VNNI computes;
docs/accuracy.md). Judged on short sentences the gate never judged on, by the gate's own bar,
as benchmarks/short_texts.py measures it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.short_texts import AVX2_KERNELS, REPO, default_on_short_sentences
from numaserve.tasks.agreement import COSINE_FLOOR, COSINE_SHARE

CHOOSE_AS_AVX2 = """
import json
from benchmarks.short_texts import default_on_short_sentences
print(json.dumps(default_on_short_sentences(("avx2",))))
"""


def test_the_default_is_accurate_on_short_sentences_on_this_cpu():
    from numaserve.host.topology import read_topology

    found = default_on_short_sentences(read_topology().isa)
    assert found["texts"] >= 200
    assert found["share"] >= COSINE_SHARE and found["lowest"] >= COSINE_FLOOR, found


@pytest.mark.timeout(400)  # a choice of its own: the ISA differs, and int8 builds 7-bit weights
def test_the_default_is_accurate_on_short_sentences_under_avx2_int8_kernels():
    # A process of its own: CTranslate2 picks its kernels when it loads.
    out = subprocess.run(
        [sys.executable, "-c", CHOOSE_AS_AVX2],
        cwd=REPO,
        env={**os.environ, **AVX2_KERNELS},
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["share"] >= COSINE_SHARE and found["lowest"] >= COSINE_FLOOR, found
