"""The model version the operator gives an InferenceModel: its weights in the runtime's arguments, with its
generation in the routing table."""
from sluice_contracts.model_version import fingerprint
from sluice_operator.builders import Owner, build_deployment
from sluice_operator.builders.model_version import backend_version, weights
from sluice_operator.crd import InferenceModelSpec


def _spec(**model):
    return InferenceModelSpec.model_validate({"model": {"source": "smollm2", **model}})


def _args(spec, generation: int) -> list[str]:
    owner = Owner(name="chat", namespace="demo", uid="u-1", generation=generation)
    (container,) = build_deployment(owner, spec)["spec"]["template"]["spec"]["containers"]
    return container["args"]


def test_the_runtime_is_given_its_weights_and_an_edit_elsewhere_rolls_no_pod():
    pinned = _spec(source="hf:HuggingFaceTB/SmolLM2-135M-Instruct", revision="v2")
    args = _args(pinned, 3)
    assert args[args.index("--model-version") + 1] == "hf:HuggingFaceTB/SmolLM2-135M-Instruct@v2"
    assert _args(pinned, 4) == args, "the generation alone must not change the pods"
    assert weights(_spec()) == "smollm2"


def test_each_generation_and_each_revision_is_a_version_of_its_own():
    versions = {backend_version(_spec(source="hf:org/chat", revision=revision), generation)
                for revision in ("v1", "v2") for generation in (1, 2)}
    assert len(versions) == 4 and len({fingerprint(v) for v in versions}) == 4
    assert backend_version(_spec(source="hf:org/chat", revision="v1"), 7) == "hf:org/chat@v1+g7"
