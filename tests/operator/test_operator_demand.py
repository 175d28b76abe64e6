"""The idle clock and the gateways' demand as the operator reads them: pure, table-driven."""
import pytest

from sluice_operator.autoscaler import DemandClock, GatewayDemand, MetricsError, parse_gateway_demand

GATEWAY_METRICS = """\
# HELP sluice_gateway_held_requests Requests held now because the model has no endpoint.
# TYPE sluice_gateway_held_requests gauge
sluice_gateway_held_requests{backend="smollm2"} 3.0
sluice_gateway_held_requests{backend="other"} 0.0
# HELP sluice_gateway_backend_requests_in_flight Requests forwarded to the model.
# TYPE sluice_gateway_backend_requests_in_flight gauge
sluice_gateway_backend_requests_in_flight{backend="other"} 2.0
# HELP sluice_gateway_requests Requests answered.
# TYPE sluice_gateway_requests counter
sluice_gateway_requests_total{backend="other",route="chat",status="200",tenant="a"} 5.0
sluice_gateway_requests_total{backend="other",route="other",status="429",tenant="b"} 2.0
sluice_gateway_requests_total{backend="",route="chat",status="401",tenant=""} 9.0
sluice_gateway_requests_created{backend="other",route="chat",status="200",tenant="a"} 1.7e9
# HELP sluice_gateway_hold_seconds Held.
# TYPE sluice_gateway_hold_seconds histogram
sluice_gateway_hold_seconds_count{backend="smollm2",outcome="forwarded"} 4.0
"""


def test_gateway_metrics_give_each_models_figures():
    demand = parse_gateway_demand(GATEWAY_METRICS)
    assert demand == {"smollm2": GatewayDemand(held=3.0), "other": GatewayDemand(held=0.0, in_flight=2.0, answered=7.0)}


@pytest.mark.parametrize("text", ["sluice_gateway_held_requests{backend=\"x\" 3", "garbage{{{ 1 2 3"])
def test_unparsable_gateway_metrics_are_an_error_not_zero_demand(text):
    with pytest.raises(MetricsError):
        parse_gateway_demand(text)


def test_nan_and_forged_series_count_for_nothing():
    text = ('sluice_gateway_held_requests{backend="m"} NaN\n'
            'sluice_gateway_held_requests{model="m"} 5\n'
            'sluice_gateway_held_requests_extra{backend="m"} 5\n')
    assert parse_gateway_demand(text) == {}


def test_the_clock_counts_from_the_last_demand_any_replica_saw():
    clock = DemandClock(last_demand=0.0)
    clock.observe(10.0, {"gw-a": GatewayDemand(answered=4), "gw-b": GatewayDemand()})
    assert clock.idle_seconds(10.0) == 0.0, "a replica's counter seen for the first time above 0 is demand"
    clock.observe(50.0, {"gw-a": GatewayDemand(answered=4), "gw-b": GatewayDemand()})
    assert clock.idle_seconds(50.0) == 40.0
    clock.observe(60.0, {"gw-a": GatewayDemand(answered=4), "gw-b": GatewayDemand(answered=1)})
    assert clock.idle_seconds(70.0) == 10.0, "a request answered on the other replica"
    clock.observe(80.0, {"gw-a": GatewayDemand(answered=4, in_flight=1), "gw-b": GatewayDemand(answered=1)})
    clock.observe(200.0, {"gw-a": GatewayDemand(answered=4, in_flight=1), "gw-b": GatewayDemand(answered=1)})
    assert clock.idle_seconds(200.0) == 0.0, "a long stream in flight is demand however long it lasts"


def test_held_requests_are_summed_over_replicas_and_a_gone_replica_counts_no_more():
    clock = DemandClock(last_demand=0.0)
    clock.observe(1.0, {"gw-a": GatewayDemand(held=2), "gw-b": GatewayDemand(held=3)})
    assert clock.held == 5 and clock.idle_seconds(1.0) == 0.0
    clock.observe(2.0, {"gw-a": GatewayDemand(held=2)})
    assert clock.held == 2
    clock.observe(3.0, {})
    assert clock.held == 0 and clock.idle_seconds(30.0) == 28.0


def test_a_restarted_gateway_replica_is_not_idle_time_lost_nor_demand_invented():
    clock = DemandClock(last_demand=0.0)
    clock.observe(1.0, {"gw-a": GatewayDemand(answered=100)})
    clock.observe(100.0, {"gw-a2": GatewayDemand(answered=0)})  # gw-a was replaced: its counter starts again
    assert clock.idle_seconds(100.0) == 99.0
