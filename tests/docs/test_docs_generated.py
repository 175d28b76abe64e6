"""The reference tables in the READMEs are what the code says, and the gateway's example file loads."""
import re
from pathlib import Path

import yaml

from docs import generate
from sluice_gateway.config import GatewayConfig

ROOT = Path(__file__).resolve().parents[2]


def test_generated_tables_are_current():
    assert generate.stale() == [], "run `make docs` and commit the documents it rewrote"


def test_gateway_readme_example_is_a_valid_config():
    text = (ROOT / "gateway/README.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    config = GatewayConfig.model_validate(yaml.safe_load(example))
    assert config.tenants[0].limits.requests_per_minute == 600


def test_no_document_cites_a_file_outside_the_repository():
    documents = [ROOT / "README.md", *ROOT.glob("*/README.md"), *ROOT.glob("docs/*.md")]
    assert [str(d.relative_to(ROOT)) for d in documents if "DESIGN.md" in d.read_text()] == []
