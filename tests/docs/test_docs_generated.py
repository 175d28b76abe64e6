"""The reference tables in the READMEs are what the code and the benchmark results say, and the gateway's example
file loads."""
import json
import re
import subprocess
from pathlib import Path

import yaml

from docs import bench_tables, generate
from sluice_gateway.config import GatewayConfig

ROOT = Path(__file__).resolve().parents[2]


def test_generated_tables_are_current():
    assert generate.stale() == [], "run `make docs` and commit the documents it rewrote"


def test_gateway_readme_example_is_a_valid_config():
    text = (ROOT / "gateway/README.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    config = GatewayConfig.model_validate(yaml.safe_load(example))
    assert config.tenants[0].limits.requests_per_minute == 600


def test_no_file_cites_a_design_document_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outside = "DESIGN" + ".md"  # spelled apart, so this file does not cite it either
    citing = [name for name in tracked if (ROOT / name).is_file() and name.endswith((".py", ".md", ".yaml", "Makefile"))
              and outside in (ROOT / name).read_text(errors="replace")]
    assert citing == []


def test_a_rerun_benchmark_makes_its_table_stale_until_make_docs(tmp_path, monkeypatch):
    # A rerun writes its results file afresh, without the `host` fields added by hand; its table must follow it.
    for source in (ROOT / "bench/results").glob("*.json"):
        (tmp_path / source.name).write_text(source.read_text())
    rerun = json.loads((tmp_path / "engine_lora.json").read_text())
    del rerun["host"]
    rerun["rows"]["4 adapters"]["output_tok_s"] = 4.25
    rerun["adapters_over_base"] = 0.49
    (tmp_path / "engine_lora.json").write_text(json.dumps(rerun))
    monkeypatch.setattr(bench_tables, "RESULTS", tmp_path)

    assert "bench/README.md" in generate.stale()
    readme = next(new for path, (_, new) in generate.rendered().items() if path == ROOT / "bench/README.md")
    lora = readme.split("<!-- generated:bench-lora -->")[1].split("<!-- end generated:bench-lora -->")[0]
    assert "| 4 adapters | 4.2 |" in lora and "4 adapters / base: 0.49" in lora
    assert "Run of an unrecorded date, machine not recorded, load average 8.4-8.7" in lora
