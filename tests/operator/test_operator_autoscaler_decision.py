"""The autoscaler's decision function, table-driven: targets + pod load + history → replicas."""
import pytest

from sluice_operator.autoscaler import History, Observation, PodSample, Targets, decide, pick_victims

TARGETS = Targets(min_replicas=1, max_replicas=5, kv_cache_usage=0.5, waiting_per_replica=4,
                  scale_up_window_seconds=0, scale_down_window_seconds=300)


def _pods(*loads, age=0.0):
    return tuple(PodSample(f"p{i}", kv, waiting, 1.0, age) for i, (kv, waiting) in enumerate(loads))


CASES = [
    # (case, current, samples, failures, expected action, expected replicas, reason fragment)
    ("kv above target scales up at once", 2, _pods((0.9, 0), (0.9, 0)), (), "ScaleUp", 4, "asks for 4"),
    ("queue above target scales up", 1, _pods((0.1, 13)), (), "ScaleUp", 4, "asks for 4"),
    ("scale-up stops at max", 3, _pods((1.0, 50), (1.0, 50), (1.0, 50)), (), "ScaleUp", 5, "asks for 5"),
    ("on target within tolerance holds", 2, _pods((0.52, 0), (0.5, 0)), (), "Hold", 2, "on target"),
    ("idle pods wait out the down-window", 3, _pods((0.0, 0), (0.0, 0), (0.0, 0)), (), "Hold", 3, "scale-down window"),
    ("unreachable pod blocks scale-down", 2, _pods((0.0, 0)), (("p1", "/metrics unreachable"),), "Hold", 2,
     "not scaling down while metrics are missing"),
    ("no usable metrics holds", 2, (), (("p0", "unparsable /metrics"), ("p1", "unparsable /metrics")), "Hold", 2,
     "no usable metrics"),
    ("stale samples hold", 2, _pods((0.0, 0), (0.0, 0), age=120), (), "Hold", 2, "no usable metrics"),
    ("unreachable pod does not block scale-up", 2, _pods((1.0, 20)), (("p1", "/metrics unreachable"),), "ScaleUp", 5,
     "asks for 5"),
    ("replicas above max come down", 9, _pods((0.5, 0)), (), "ScaleDown", 5, "outside minReplicas"),
]


@pytest.mark.parametrize("case,current,samples,failures,action,desired,reason", CASES, ids=[c[0] for c in CASES])
def test_single_tick(case, current, samples, failures, action, desired, reason):
    decision = decide(TARGETS, Observation(current, samples, failures), History(), now=1000.0)
    assert (decision.action, decision.desired_replicas) == (action, desired)
    assert reason in decision.reason
    assert decision.current_replicas == current and decision.pods_scraped == sum(1 for s in samples if s.age_seconds < 60)


def test_scale_down_waits_for_the_window_then_takes_its_highest_recommendation():
    history = History()
    idle = _pods((0.0, 0), (0.0, 0), (0.0, 0), (0.0, 0))
    busy_two = _pods((0.5, 0), (0.5, 0), (0.0, 0), (0.0, 0))
    assert decide(TARGETS, Observation(4, idle), history, now=0).action == "Hold"
    assert decide(TARGETS, Observation(4, busy_two), history, now=100).action == "Hold"
    assert decide(TARGETS, Observation(4, idle), history, now=299).action == "Hold"
    # The start-of-window entry (4 replicas, seeded after a restart) has aged out; the busiest remaining asked for 2.
    late = decide(TARGETS, Observation(4, idle), history, now=301)
    assert (late.action, late.desired_replicas) == ("ScaleDown", 2)
    final = decide(TARGETS, Observation(2, _pods((0.0, 0), (0.0, 0))), history, now=401)
    assert (final.action, final.desired_replicas) == ("ScaleDown", 1)


def test_scale_up_window_takes_the_lowest_recent_recommendation():
    targets = Targets(1, 10, 0.5, 4, scale_up_window_seconds=60, scale_down_window_seconds=300)
    history = History()
    assert decide(targets, Observation(2, _pods((0.5, 0), (0.5, 0))), history, now=0).action == "Hold"
    spike = decide(targets, Observation(2, _pods((1.0, 0), (1.0, 0))), history, now=30)
    assert spike.action == "Hold" and "scale-up window" in spike.reason
    sustained = decide(targets, Observation(2, _pods((1.0, 0), (1.0, 0))), history, now=91)
    assert (sustained.action, sustained.desired_replicas) == ("ScaleUp", 4)


def test_unschedulable_pods_stop_growth_and_say_why():
    observation = Observation(3, _pods((1.0, 30), (1.0, 30)), unschedulable_pods=1,
                              unschedulable_message="0/1 nodes are available: 1 Insufficient nvidia.com/gpu")
    decision = decide(TARGETS, observation, History(), now=0)
    assert decision.action == "Hold" and "Insufficient nvidia.com/gpu" in decision.reason


def test_starting_pods_count_as_idle_for_growth_and_on_target_for_shrinking():
    # Three replicas, one ready and lightly loaded: no scale-down while the other two are still starting.
    decision = decide(TARGETS, Observation(3, _pods((0.2, 0))), History(), now=0)
    assert decision.action == "Hold"


def test_load_never_takes_a_model_below_one_even_with_min_0():
    targets = Targets(0, 3, 0.5, 4, 0, 0)
    decision = decide(targets, Observation(1, _pods((0.0, 0))), History(), now=0)
    assert decision.desired_replicas == 1
    # Scale to zero configured, but the idle clock is unknown (no gateway read yet): load alone keeps one.
    zero = Targets(0, 3, 0.5, 4, 0, 0, scale_to_zero_after_seconds=30)
    assert decide(zero, Observation(1, _pods((0.0, 0))), History(), now=0).desired_replicas == 1


ZERO = Targets(0, 3, 0.5, 4, 0, 300, scale_to_zero_after_seconds=60)


def _idle_pods(count):
    return tuple(PodSample(f"p{i}", 0.0, 0, 0) for i in range(count))


IDLE = [
    # (case, current, samples, failures, held, idle seconds, expected action, replicas, reason fragment)
    ("idle past the time goes to zero", 1, _idle_pods(1), (), 0, 61, "ScaleDown", 0, "no request for 61 s"),
    ("idle two replicas go to zero at once", 2, _idle_pods(2), (), 0, 60, "ScaleDown", 0,
     "scaleToZeroAfterSeconds 60"),
    ("not yet idle long enough", 1, _idle_pods(1), (), 0, 59, "Hold", 1, "on target"),
    ("a held request keeps it", 1, _idle_pods(1), (), 1, 1000, "Hold", 1, ""),
    ("a running request keeps it", 1, (PodSample("p0", 0.1, 0, 1.0),), (), 0, 1000, "Hold", 1, ""),
    ("a waiting request keeps it", 1, (PodSample("p0", 0.0, 2, 0.0),), (), 0, 1000, "Hold", 1, ""),
    ("unreadable metrics keep it", 1, (), (("p0", "/metrics unreachable"),), 0, 1000, "Hold", 1, "no usable metrics"),
    ("at zero with nothing held stays", 0, (), (), 0, 1000, "Hold", 0, "scaled to zero"),
    ("at zero a held request starts one", 0, (), (), 3, 0, "ScaleUp", 1, "scale from zero: 3 requests held"),
]


@pytest.mark.parametrize("case,current,samples,failures,held,idle,action,desired,reason", IDLE,
                         ids=[c[0] for c in IDLE])
def test_scale_to_zero_and_back(case, current, samples, failures, held, idle, action, desired, reason):
    observation = Observation(current, samples, failures, held=held, idle_seconds=idle)
    decision = decide(ZERO, observation, History(), now=1000.0)
    assert (decision.action, decision.desired_replicas) == (action, desired), decision.reason
    assert reason in decision.reason


def test_a_model_without_scale_to_zero_never_goes_there_however_idle():
    decision = decide(TARGETS, Observation(1, _pods((0.0, 0)), idle_seconds=10**9), History(), now=10**9)
    assert decision.desired_replicas == 1


def test_victims_are_the_least_busy_pods():
    samples = (PodSample("a", 0.9, 2, 5), PodSample("b", 0.1, 0, 0), PodSample("c", 0.2, 0, 1))
    assert pick_victims(samples, 2) == ["b", "c"]
