"""What Sluice's components agree on. Imported by the runtime, the gateway and the operator; imports none of them."""
