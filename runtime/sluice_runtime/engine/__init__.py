"""Scheduling, KV block accounting and request lifecycle; never imports torch."""
