"""The audit trail (gateway.yaml `audit`): one JSON line per request the gateway answers, online or batch line,
and one per admin event (keys a reload added or removed, a rejected file, a routing-table change), on a sink of
its own. No record holds a prompt, a completion or a key: only what names and measures the request. The prompts
and answers of tenants that opt in go, redacted, to the prompt capture's sink instead (prompt_capture.py)."""
