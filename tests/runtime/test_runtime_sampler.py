"""The sampling both devices share: which tokens each truncation keeps, and draws that follow the distribution."""
import torch

from sluice_runtime.executor.device_sampler import DeviceSampler
from sluice_runtime.executor.sampler import Sampler, SampleRequest, sampling_probs
from sluice_runtime.sampling_params import SamplingParams

LOGITS = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])


def kept(**params) -> list[int]:
    probs = sampling_probs(LOGITS, [SamplingParams(**params)])[0]
    return [i for i, p in enumerate(probs.tolist()) if p > 0]


def test_each_truncation_keeps_its_set_and_always_the_top_token():
    assert kept(top_k=2) == [0, 1]
    assert kept(top_k=-1) == kept(top_k=0) == [0, 1, 2, 3, 4, 5]
    # Softmax mass 0.64, 0.24, 0.09, ...: 0.8 is reached with the second token.
    assert kept(top_p=0.8) == [0, 1]
    assert kept(top_p=1e-9) == [0]
    assert kept(min_p=0.3) == [0, 1]  # 0.24 / 0.64 = 0.37 stays, 0.09 / 0.64 = 0.14 goes
    assert kept(min_p=1.0) == [0]
    assert kept(top_k=3, top_p=0.99, min_p=0.2) == [0, 1]


def test_rows_keep_their_own_parameters():
    params = [SamplingParams(top_k=1), SamplingParams(temperature=2.0), SamplingParams(top_p=0.8)]
    probs = sampling_probs(LOGITS.repeat(3, 1), params)
    assert (probs[0] > 0).sum() == 1 and (probs[1] > 0).sum() == 6 and (probs[2] > 0).sum() == 2
    assert torch.allclose(probs.sum(dim=-1), torch.ones(3))
    assert probs[1, 0] < sampling_probs(LOGITS, [SamplingParams()])[0, 0]  # a higher temperature flattens


def _requests(count: int, generator=None, **params) -> list[SampleRequest]:
    return [SampleRequest(SamplingParams(**params), [1], [], generator, [], None) for _ in range(count)]


def test_both_samplers_draw_from_the_truncated_distribution():
    logits = LOGITS.repeat(2000, 1)
    expected = sampling_probs(LOGITS, [SamplingParams(top_k=3)])[0, :3]
    for sampler in (Sampler(0), DeviceSampler(Sampler(0), torch.device("cpu"), seed=0)):
        tokens = torch.tensor([r.token_id for r in sampler(logits.clone(), _requests(2000, top_k=3))])
        shares = torch.bincount(tokens, minlength=6)[:3] / 2000
        assert set(tokens.tolist()) <= {0, 1, 2}
        assert torch.allclose(shares, expected, atol=0.04), (type(sampler).__name__, shares, expected)


def test_a_seeded_request_draws_the_same_tokens_whatever_runs_beside_it():
    def draws(neighbours: int) -> list[int]:
        sampler, generator = Sampler(neighbours), torch.Generator().manual_seed(7)
        tokens = []
        for _ in range(20):
            batch = _requests(neighbours, temperature=1.0) + _requests(1, generator, temperature=1.0)
            tokens.append(sampler(LOGITS.repeat(neighbours + 1, 1), batch)[-1].token_id)
        return tokens

    alone = draws(0)
    assert draws(5) == alone and len(set(alone)) > 1


class _Allow:
    """A constraint that allows a fixed set of tokens (the grammar's mask, as far as the sampler sees it)."""

    def __init__(self, allowed: list[int]):
        self._allowed = allowed

    def allowed_tokens(self):
        import numpy as np

        mask = np.zeros(LOGITS.shape[1], dtype=bool)
        mask[self._allowed] = True
        return mask

    def accept_token(self, token_id: int) -> None:
        pass

    def is_finished(self) -> bool:
        return False

    def fork(self):
        return self


def _biased(bias: dict[int, float], constraint=None, count: int = 1, **params) -> list[int]:
    requests = [SampleRequest(SamplingParams(logit_bias=bias, **params), [1], [0, 0], None, [], constraint)
                for _ in range(count)]
    samplers = (Sampler(0), DeviceSampler(Sampler(0), torch.device("cpu"), seed=0))
    draws = [[r.token_id for r in sampler(LOGITS.repeat(count, 1), requests)] for sampler in samplers]
    assert draws[0] == draws[1], "both samplers apply the bias alike"
    return draws[0]


def test_logit_bias_forces_moves_and_bans_tokens():
    assert _biased({5: 100.0}, temperature=0) == [5]
    assert _biased({5: 100.0}, count=200, temperature=1.0) == [5] * 200
    assert _biased({1: 1.5}, temperature=0) == [1]  # 3 + 1.5 beats 4
    assert _biased({0: -100.0}, temperature=0) == [1]
    drawn = _biased({0: -100.0, 1: -100.0}, count=500, temperature=2.0)
    assert set(drawn).isdisjoint({0, 1}) and len(set(drawn)) > 1


def test_logit_bias_composes_with_penalties_and_the_grammar_mask():
    # The penalties push token 0 down; its ban still holds where a negative penalty would favour it.
    assert _biased({0: -100.0}, temperature=0, presence_penalty=-2.0, frequency_penalty=-2.0) == [1]
    # The grammar decides what may follow: a forced token it does not allow is not drawn, a ban stays a ban.
    assert _biased({5: 100.0}, _Allow([2, 3]), temperature=0) == [2]
    assert _biased({2: -100.0}, _Allow([2, 3]), count=100, temperature=1.0) == [3] * 100
