"""A model named by hub id that cannot be fetched (offline, unreachable, not cached) gets a message naming the id,
how to pass a local copy (model=DIR / --model DIR) and HF_HUB_OFFLINE, from the Python API, the framework
adapters and the CLI; a missing local folder is said to be missing, not looked up on the Hub (README, "Models
without network")."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _says_how(msg: str, model: str) -> None:
    assert model in msg and "model=DIR" in msg and "--model DIR" in msg and "HF_HUB_OFFLINE" in msg
    assert f"hf download {model}" in msg


def test_load_reward_names_the_default_hub_id(offline):
    import rewardkit
    from rewardkit.models.zoo import HubModelUnavailableError

    with pytest.raises(HubModelUnavailableError) as info:  # it was transformers' raw OSError, naming no id
        rewardkit.load_reward("pickscore")
    assert isinstance(info.value, OSError)
    _says_how(str(info.value), "yuvalkirstain/PickScore_v1")
    with pytest.raises(HubModelUnavailableError) as info:
        rewardkit.load_reward("clipscore", model="someorg/not-downloaded")
    _says_how(str(info.value), "someorg/not-downloaded")


def test_the_adapters_say_the_same(offline):
    from rewardkit.integrations.trl import trl_reward_func
    from rewardkit.models.zoo import HubModelUnavailableError

    fn = trl_reward_func("pickscore")
    with pytest.raises(HubModelUnavailableError) as info:
        fn(prompts=["a cat"], completions=["x"], images=[None])
    _says_how(str(info.value), "yuvalkirstain/PickScore_v1")


def test_a_local_folder_error_is_not_a_hub_error(tmp_path, offline):
    import rewardkit

    bad = tmp_path / "ckpt"
    bad.mkdir()  # exists, but holds no checkpoint: transformers' own error, unchanged
    with pytest.raises(OSError) as info:
        rewardkit.load_reward("clipscore", model=str(bad))
    assert "HF_HUB_OFFLINE" not in str(info.value)


def test_cli_missing_relative_model_folder(tmp_path, monkeypatch, capsys, offline):
    from rewardkit.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    assert main(["score", "-r", "clipscore", "-m", "models/PickScore_v1", "x.png", "-p", "p"]) == 2
    err = capsys.readouterr().err
    assert "models/PickScore_v1: no such directory" in err and "Hub" not in err
    (tmp_path / "models").rmdir()  # no `models/` folder at all: it may be a hub id; the message covers both
    assert main(["score", "-r", "clipscore", "-m", "models/PickScore_v1", "x.png", "-p", "p"]) == 2
    err = capsys.readouterr().err
    assert "no folder 'models/PickScore_v1'" in err
    _says_how(err, "models/PickScore_v1")


def test_only_hub_ids_are_reported_as_hub_errors():
    from rewardkit.models.zoo import hub_unavailable, looks_like_hub_id

    assert looks_like_hub_id("yuvalkirstain/PickScore_v1") and looks_like_hub_id("models/PickScore_v1")
    for not_id in ("tiny:clip", "vllm:/models/x", "/abs/path/x", "~/x/y", "a/b/c", "name", None):
        assert not looks_like_hub_id(not_id), not_id
    boom = OSError("We couldn't connect to 'https://huggingface.co' to load the files")
    assert hub_unavailable(boom, "openai:http://127.0.0.1:1/v1") is None  # a judge server is not the Hub
    assert hub_unavailable(ValueError("connect"), "org/name") is None
    err = hub_unavailable(boom, "org/name")
    assert isinstance(err, OSError) and "org/name" in str(err) and "couldn't connect" in str(err)
