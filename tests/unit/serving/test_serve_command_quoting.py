"""The printed `vllm serve` line (eagle3/serving/serve_command.py, which train.py, export.py and
the model card print) is a shell line: a path with a space or a quote stays one argument."""

from __future__ import annotations

import json
import shlex

from eagle3.serving.serve_command import serve_command, serving_lines

EXPORT = "/data/o'brien runs/export dir"
TARGET = "/models/my target's copy"


def test_shlex_split_of_the_printed_line_gives_back_each_argument():
    line = serve_command(EXPORT, TARGET, 4, tensor_parallel_size=2, trust_remote_code=True)
    args = shlex.split(line)
    assert args[:7] == [
        "vllm",
        "serve",
        TARGET,
        "--tensor-parallel-size",
        "2",
        "--trust-remote-code",
        "--speculative-config",
    ]
    assert len(args) == 8
    assert json.loads(args[7]) == {"model": EXPORT, "method": "eagle3", "num_speculative_tokens": 4}


def test_the_line_train_and_export_print_splits_the_same_way():
    (first, _) = serving_lines(EXPORT, TARGET, 3, None)
    args = shlex.split(first.removeprefix("serve it: "))
    assert args[2] == TARGET and json.loads(args[-1])["model"] == EXPORT
    assert shlex.split(serve_command(EXPORT, TARGET, 0)) == ["vllm", "serve", TARGET]  # the target alone
