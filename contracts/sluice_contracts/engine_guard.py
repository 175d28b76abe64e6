"""The engine guard: Sluice's credential check in front of every path of an engine we did not write.

vLLM's `--api-key` guards only paths under `/v1`, while its server also runs inference on `/invocations`,
`/pooling`, `/classify`, `/score`, `/rerank`, `/v2/rerank`, `/tokenize` and `/detokenize`. So a vLLM or
SGLang pod runs the engine on loopback only (`ENGINE_HOST`:`ENGINE_PORT`) and the guard, a container of ours
in the same pod, listens on the pod's serving port. It forwards a request only when it carries the runtime
credential (runtime_credential), except the probe and scrape paths of `runtime_credential.OPEN_PATHS`, and
answers everything else with 401 in OpenAI's error shape. It bounds request heads like every Sluice listener
(http_bounds).

Command: `sluice-engine-guard --port SERVING_PORT --upstream http://ENGINE_HOST:ENGINE_PORT
--credential-file runtime_credential.MOUNT_PATH`.
"""
from __future__ import annotations

COMMAND = "sluice-engine-guard"
CONTAINER_NAME = "engine-guard"
ENGINE_HOST = "127.0.0.1"
ENGINE_PORT = 8001
