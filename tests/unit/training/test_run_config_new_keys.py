"""A run dir recorded before a key existed resumes under a config that leaves the key unset
(data.system_prompt: null does what the config without it did); set, the key is a change."""

from __future__ import annotations

from eagle3.training import run_dir


def test_a_key_added_since_and_left_unset_is_no_change():
    before = {"data": {"max_length": 512}}
    assert run_dir.config_changes(before, {"data": {"max_length": 512, "system_prompt": None}}) == []
    assert run_dir.config_changes(before, {"data": {"max_length": 512, "system_prompt": "Be brief."}}) == [
        ("data.system_prompt", "<absent>", "Be brief.")
    ]
    # an empty mapping adds no key at all
    assert run_dir.config_changes(before, {"data": {"max_length": 512, "chat_template_kwargs": {}}}) == []
    assert run_dir.config_changes(
        before, {"data": {"max_length": 512, "chat_template_kwargs": {"enable_thinking": False}}}
    )
