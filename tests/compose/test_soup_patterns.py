"""LoRA soup with per-module ranks / alphas (``rank_pattern`` / ``alpha_pattern``) and ``fan_in_fan_out`` layers.

The reference delta of each adapter is what peft itself applies: load the adapter onto a fresh base with
``PeftModel.from_pretrained``, ``merge_and_unload()``, subtract the base weight. The soup (adapter output and
merged-checkpoint output) must equal the weighted sum of those deltas, with no use of ``soup.py`` in the
reference.
"""

from __future__ import annotations

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

from rewardkit.compose.soup import lora_soup, read_adapter, soup_deltas  # noqa: E402


class Net(torch.nn.Module):
    """Linear layers of different shapes plus a GPT-2 style Conv1D (weight stored [in, out])."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.q = torch.nn.Linear(6, 4, bias=False)
        self.v = torch.nn.Linear(6, 5, bias=False)
        self.c = transformers.pytorch_utils.Conv1D(5, 6)   # nf=out=5, nx=in=6: weight [6, 5]
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))


def _base_weights(net):
    return {k: v.detach().clone() for k, v in net.state_dict().items() if k.endswith("weight")}


def _make_adapter(path, seed, **cfg):
    model = peft.get_peft_model(Net(), peft.LoraConfig(lora_dropout=0.0, **cfg))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.save_pretrained(path)
    return path


def _peft_delta(adapter_dir):
    """The per-weight delta peft applies for this adapter (independent of rewardkit)."""
    base = Net()
    before = _base_weights(base)
    merged = peft.PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    after = _base_weights(merged)
    return {k: after[k] - before[k] for k in before}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("soup_patterns")
    a = _make_adapter(root / "a", 1, r=2, lora_alpha=4, target_modules=["q", "v"],
                      rank_pattern={"v": 3}, alpha_pattern={"v": 9})
    b = _make_adapter(root / "b", 2, r=4, lora_alpha=2, target_modules=["q", "v"], alpha_pattern={"q": 5},
                      use_rslora=True)
    return root, [a, b]


@pytest.fixture(scope="module")
def fifo(tmp_path_factory):
    root = tmp_path_factory.mktemp("soup_fifo")
    a = _make_adapter(root / "a", 3, r=2, lora_alpha=3, target_modules=["c"], fan_in_fan_out=True)
    b = _make_adapter(root / "b", 4, r=3, lora_alpha=6, target_modules=["c"], fan_in_fan_out=True,
                      rank_pattern={"c": 1})
    return root, [a, b]


def _expected(paths, weights):
    deltas = [_peft_delta(p) for p in paths]
    return {k: sum(w * d[k] for w, d in zip(weights, deltas)) for k in deltas[0]}


def _check_soup(paths, weights, tmp_path, modules):
    want = _expected(paths, weights)
    assert all(float(want[f"{m}.weight"].abs().max()) > 0.1 for m in modules)   # the test is not vacuous
    # 1) dense deltas, in the layout of the base weight
    got = soup_deltas([read_adapter(p) for p in paths], weights)
    for m in modules:
        torch.testing.assert_close(got[f"base_model.model.{m}"], want[f"{m}.weight"], atol=1e-5, rtol=1e-5)
    # 2) the saved soup adapter, loaded by peft onto a fresh base
    out = lora_soup(paths, tmp_path / "soup", weights)
    soup_delta = _peft_delta(out)
    for m in modules:
        torch.testing.assert_close(soup_delta[f"{m}.weight"], want[f"{m}.weight"], atol=1e-5, rtol=1e-5)
    # 3) merged into a base checkpoint
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    net = Net()
    st.save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(base_dir / "model.safetensors"))
    merged = st.load_file(str(lora_soup(paths, tmp_path / "merged", weights, base=base_dir) / "model.safetensors"))
    for m in modules:
        torch.testing.assert_close(merged[f"{m}.weight"], net.state_dict()[f"{m}.weight"] + want[f"{m}.weight"],
                                   atol=1e-5, rtol=1e-5)


def test_soup_mixed_ranks_and_alpha_patterns(mixed, tmp_path):
    root, paths = mixed
    a = read_adapter(paths[0])
    assert a.A["base_model.model.v"].shape[0] == 3 and a.A["base_model.model.q"].shape[0] == 2
    assert a.scaling["base_model.model.v"] == pytest.approx(9 / 3) and a.scaling["base_model.model.q"] == 2.0
    _check_soup(paths, [0.3, 0.7], tmp_path, ["q", "v"])


def test_soup_fan_in_fan_out_conv1d(fifo, tmp_path):
    root, paths = fifo
    assert read_adapter(paths[0]).config["fan_in_fan_out"] is True
    _check_soup(paths, [0.5, 0.5], tmp_path, ["c"])
