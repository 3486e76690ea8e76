"""Opt-in (cold compiles cost ~30 s): python -m pytest -m slow"""
import pytest
import torch

from model import GPT, GPTConfig


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_compiled_model_trains_like_eager(attention):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32, attention=attention)
    eager = GPT(config)
    compiled = GPT(config)
    compiled.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled)
    x, y = torch.randint(0, 32, (2, 4, 16)), torch.randint(0, 32, (2, 4, 16))
    losses = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[name] = []
        for step in range(2):
            loss = model(x[step], y[step])[1]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[name].append(loss.item())
    assert losses["eager"][1] != losses["eager"][0]  # the step did something
    for a, b in zip(losses["eager"], losses["compiled"]):
        assert abs(a - b) < 1e-4, losses
