"""The .tflite mutation campaign as a test (tests/frontend/tflite_campaign.py): mutants of the
shared MLPerf Tiny models (byte flips, truncations, offsets, vector lengths, dims, scales, zero
points, quantized dimensions, types, buffers, operator indices, op codes, options, weights) through
Kiln's import and ``kiln inspect``'s summary, LiteRT's reference interpreter and Kiln's reference,
and a deterministic sample through ``kiln compile`` (every Cortex-M core in turn, --optimize size
and speed, arm-none-eabi-gcc -Wall -Wextra -Werror) and the generated C on the host. Each mutant runs in a worker under a memory ulimit.

The result must be: no traceback, hang, crash or out-of-memory in any Kiln stage; no file Kiln
accepts that LiteRT refuses; no output where Kiln's reference differs from LiteRT or from its own C;
every refusal a named TFLiteImportError (never the catch-all 'corrupt flatbuffer')."""
import os

import pytest

from tests.frontend.tflite_campaign import FAILURES, run_campaign, summary
from tests.frontend.tflite_mutants import KINDS

MODELS = ("kws_ref_model.tflite", "pretrainedResnet_quant.tflite", "vww_96_int8.tflite", "ad01_int8.tflite")
BAD = FAILURES + ("diff", "compile_rejected")


def _describe(r):
    return (f"{r['model']} mutant {r['index']} (seed {r['seed']}, {r.get('kind')}: {r.get('mutation')}, "
            f"compile {r.get('compiled')}): {r['outcome']} at {r.get('stage', '-')} {r.get('culprit', '')}\n"
            f"    {(r.get('message') or '')[-600:]}")


def _check(records):
    s = summary(records)
    bad = [r for r in records if r["outcome"] in BAD]
    assert not bad, (f"{len(bad)} of {len(records)} mutants failed ({s['outcomes']}); reproduce one with "
                     f"tests.frontend.tflite_campaign.evaluate(path, seed, index, compile):\n"
                     + "\n".join(_describe(r) for r in bad[:10]))
    vague = [r for r in records if "corrupt flatbuffer (" in (r.get("message") or "")]
    assert not vague, "refused with the catch-all message:\n" + "\n".join(_describe(r) for r in vague[:10])
    return s


def _paths(shared_models):
    return [os.path.join(shared_models, m) for m in MODELS]


def test_mutation_campaign(shared_models):
    """2,080 mutants; about one in eight that import goes through compile + host C."""
    s = _check(run_campaign(_paths(shared_models), per_model=520, seed=0, compile_every=8))
    assert s["mutants"] == 2080
    # the campaign exercised every stage: refusals, LiteRT comparisons, compiles; every kind of mutation
    assert s["outcomes"]["rejected"] > 1000 and s["outcomes"]["same"] > 300 and s["compiled"] >= 30
    assert set(s["by_kind"]) == set(KINDS)


@pytest.mark.slow
def test_mutation_campaign_large(shared_models):
    """4,000 more mutants (another seed), every second one that imports compiled and run."""
    s = _check(run_campaign(_paths(shared_models), per_model=1000, seed=1, compile_every=2))
    assert s["mutants"] == 4000 and s["compiled"] >= 300


def test_campaign_finding_werror_speed_build(shared_models, tmp_path):
    """Found by the campaign: one channel of a 1x1 conv with a tiny weight scale takes the patch
    path, whose inlined tail loop gcc flagged (-Werror=aggressive-loop-optimizations) in
    --optimize speed builds: `kiln compile` raised CalledProcessError."""
    import shutil

    import numpy as np

    from kiln import hil
    from kiln.backends.host import HostModel
    from kiln.frontend import run
    from kiln.frontend.tflite_import import load_tflite
    from tests.frontend.tflite_builder import patch
    if shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("needs arm-none-eabi-gcc")
    with open(os.path.join(shared_models, "kws_ref_model.tflite"), "rb") as f:
        g = load_tflite(patch(f.read(), "tensor 17.scale[28]", 2e-10))
    hil.compile_model(g, "cortex-m4", str(tmp_path / "m4"), plot=False, optimize="speed")
    pkg = hil.compile_model(g, "host", str(tmp_path / "host"), plot=False, optimize="speed")
    x = np.random.default_rng(0).integers(-128, 128, g.types[g.inputs[0]].shape).astype(np.int8)
    np.testing.assert_array_equal(HostModel(pkg.path).run(x)[0], run(g, x)[0])
