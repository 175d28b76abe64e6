"""The one reading of the fields that decide a request's cost, tried as a hostile tenant would."""
import pytest

from sluice_contracts.request_cost import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    MAX_CHOICES,
    InvalidCostField,
    read_request_cost,
)


def test_a_null_under_one_name_does_not_hide_the_other():
    cost = read_request_cost({"max_completion_tokens": None, "max_tokens": 30000}, "chat")
    assert cost.max_tokens == 30000
    assert cost.max_tokens_param == "max_tokens"


def test_two_names_with_different_values_are_refused():
    with pytest.raises(InvalidCostField) as err:
        read_request_cost({"max_completion_tokens": 10, "max_tokens": 30000}, "chat")
    assert err.value.param == "max_tokens"


def test_two_names_with_one_value_are_one_limit():
    assert read_request_cost({"max_completion_tokens": 7, "max_tokens": 7}, "chat").max_tokens == 7


@pytest.mark.parametrize("value", ["16", 16.0, True, [16], {"n": 16}])
def test_n_is_a_strict_integer(value):
    with pytest.raises(InvalidCostField) as err:
        read_request_cost({"n": value}, "chat")
    assert err.value.param == "n"


@pytest.mark.parametrize("value", [0, -1, MAX_CHOICES + 1, 10**18])
def test_n_is_bounded(value):
    with pytest.raises(InvalidCostField):
        read_request_cost({"n": value}, "chat")


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", ["30000", 3e4, False, 0, -5])
def test_max_tokens_is_a_positive_strict_integer(field, value):
    with pytest.raises(InvalidCostField) as err:
        read_request_cost({field: value}, "chat")
    assert err.value.param == field


def test_chat_without_max_tokens_runs_to_the_end_of_the_context():
    cost = read_request_cost({"n": 3}, "chat")
    assert cost.max_tokens is None
    assert cost.output_tokens(prompt_tokens=100, max_model_len=2048) == 3 * 1948
    assert cost.output_tokens(prompt_tokens=100, max_model_len=None) is None


def test_completions_default_to_openais_sixteen_tokens():
    assert read_request_cost({"prompt": "hi"}, "completion").max_tokens == COMPLETION_DEFAULT_MAX_TOKENS


@pytest.mark.parametrize("prompt,count", [
    ("one text", 1), (["a"] * 64, 64), ([1, 2, 3], 1), ([[1, 2], [3]], 2),
])
def test_every_prompt_of_a_completions_list_is_counted(prompt, count):
    assert read_request_cost({"prompt": prompt, "n": 2}, "completion").prompts == count


@pytest.mark.parametrize("prompt", [None, [], 5, {"text": "x"}])
def test_a_prompt_that_is_no_prompt_is_refused(prompt):
    with pytest.raises(InvalidCostField) as err:
        read_request_cost({"prompt": prompt}, "completion")
    assert err.value.param == "prompt"


@pytest.mark.parametrize("value", ["true", 1, 0])
def test_ignore_eos_is_a_strict_boolean(value):
    with pytest.raises(InvalidCostField):
        read_request_cost({"ignore_eos": value}, "chat")


def test_embeddings_generate_nothing():
    cost = read_request_cost({"input": ["a", "b"], "max_tokens": "ignored"}, "embedding")
    assert (cost.prompts, cost.output_tokens(10, 100)) == (2, 0)
