"""W&B's mode: online for a user who ran `wandb login` (netrc) or set WANDB_API_KEY, offline
when asked or when no credentials exist, with the reason in words."""

import pytest

from eagle3.util.wandb_mode import wandb_mode_and_reason


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for key in ("WANDB_MODE", "WANDB_API_KEY", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_no_credentials_is_offline(clean_env):
    mode, reason = wandb_mode_and_reason(None)
    assert mode == "offline" and "no W&B credentials" in reason


def test_wandb_login_netrc_is_online(clean_env):
    netrc = clean_env / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "0" * 40 + "\n")
    netrc.chmod(0o600)
    assert wandb_mode_and_reason(None) == ("online", "logged in (netrc entry for api.wandb.ai)")
    # another host's entry is no W&B login
    netrc.write_text("machine github.com\n  login user\n  password x\n")
    assert wandb_mode_and_reason(None)[0] == "offline"


def test_asking_wins_over_credentials(clean_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert wandb_mode_and_reason(None)[0] == "online"
    assert wandb_mode_and_reason("offline") == ("offline", "logger.mode=offline")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode_and_reason(None) == ("disabled", "WANDB_MODE=disabled")


def test_say_prints_once_and_writes_the_run_log(tmp_path, capsys):
    """say(): each line on stdout as it is (scripts read the last one) and in the run's log file
    (the root logger's file handler, as Hydra sets it up), never twice on the console."""
    import logging

    from eagle3.util.report import say

    handler = logging.FileHandler(tmp_path / "train.log")
    logging.getLogger().addHandler(handler)
    try:
        say(["serve it: vllm serve org/target", "eval failed: RuntimeError: boom"])
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    out = capsys.readouterr().out.splitlines()
    assert out == ["serve it: vllm serve org/target", "eval failed: RuntimeError: boom"]
    assert (tmp_path / "train.log").read_text().splitlines() == out
