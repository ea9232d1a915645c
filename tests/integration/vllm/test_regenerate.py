"""data.regenerate=true: the real SmolLM2 answers the user turns through vLLM (CPU build)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from eagle3.data.loaders import load_conversations
    from eagle3.target_model.generate.common import AnswerSettings
    from eagle3.target_model.generate.vllm_engine import VLLMRegenerator
    from eagle3.target_model.resolve import materialize_smollm2

    if __name__ == "__main__":
        target_dir, cache = materialize_smollm2(sys.argv[1]), sys.argv[2]
        convs = load_conversations("sharegpt", None, limit=6).conversations
        convs = [c for c in convs if len(c.messages) <= 4][:3]
        convs.append(type(convs[0])(id="capital", messages=[
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "IGNORED HUMAN ANSWER"}]))
        answers = AnswerSettings(max_tokens=24, max_model_len=1024)
        regen = VLLMRegenerator(target_dir, cache, answers=answers, cpu_kvcache_space_gb=1)
        out = regen(convs)
        first = regen.generated
        regen.close()
        again = VLLMRegenerator(target_dir, cache, answers=answers)
        out2 = again(convs)
        again.close()
        # two sampled answers to one prompt: each request has its own seed (seed + answer)
        sampled = VLLMRegenerator(target_dir, cache + "-sampled", num_answers=2,
                                  answers=AnswerSettings(temperature=1.0, max_tokens=16, max_model_len=1024))
        pair = sampled(convs[-1:])
        print("RESULT " + json.dumps({"first": first, "second": again.generated,
                          "orig": [c.messages for c in convs], "new": [c.messages for c in out],
                          "same": [c.messages for c in out2] == [c.messages for c in out],
                          "pair": [[c.id, c.split_key, c.messages[-1]["content"]] for c in pair]}))
    """
)


@pytest.mark.slow
@pytest.mark.vllm
def test_target_answers_replace_dataset_answers_and_are_cached(tmp_path):
    import json

    script = tmp_path / "regen.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(ROOT / ".cache"), str(tmp_path / "cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(lines[-1].removeprefix("RESULT "))
    assert res["first"] == 4 and res["second"] == 0 and res["same"]  # second run: all from cache
    for orig, new in zip(res["orig"], res["new"]):
        assert [m["role"] for m in new] == [m["role"] for m in orig]
        assert [m["content"] for m in new if m["role"] != "assistant"] == [
            m["content"] for m in orig if m["role"] != "assistant"
        ]
        assert [m["content"] for m in new if m["role"] == "assistant"] != [
            m["content"] for m in orig if m["role"] == "assistant"
        ]
    # the exact greedy text follows the CPU's bf16 kernels: the capital question's first token
    # is a near tie (fp32 logits "The" 25.36, "L" 25.26), so one machine's vLLM answers "The
    # capital of France is Paris." and another's "L'Étoile, la Marseillaise, ...". What holds
    # everywhere: each prompt got an answer of its own, none empty
    answers = [new[-1]["content"] for new in res["new"]]
    assert all(a.strip() for a in answers) and len(set(answers)) == len(answers), answers
    (id0, key0, a0), (id1, key1, a1) = res["pair"]
    assert (id0, id1) == ("capital", "capital@answer1") and key0 == key1 == "capital"
    assert a0.strip() and a1.strip() and a0 != a1, res["pair"]
