"""The files the gateway runs from: `identity_poll` notices a change, `kept_in_force` re-reads one file and keeps
its last good version, and `gateway_files` follows gateway.yaml, the routing table and the upstream credential."""
